"""Resolve ``"package.module:attr"`` strings: the lazy registries' one way to import a plugin."""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

from .errors import ConfigError


def import_from_string(target: str) -> Any:
    """Import ``"pkg.mod:attr"`` and return the attribute.

    An ``ImportError`` of a third-party package the plugin needs propagates unchanged so that the
    caller can say which package is missing.
    """
    module_name, _, attr = target.partition(":")
    if not module_name or not attr:
        raise ValueError(f"import string {target!r} must be 'module:attribute'")
    module = importlib.import_module(module_name)
    try:
        return getattr(module, attr)
    except AttributeError:
        raise ImportError(f"module {module_name!r} has no attribute {attr!r}") from None


def resolve(registry: Mapping[str, Any], name: str, what: str) -> Any:
    """Look ``name`` up in a lazy registry; an unknown name is a ``ConfigError`` listing the valid ones.

    An entry is an import string, or the object itself (registered from outside the package,
    already imported)."""
    try:
        target = registry[name]
    except KeyError:
        valid = ", ".join(sorted(registry))
        raise ConfigError(f"unknown {what} {name!r}; valid: {valid}") from None
    return import_from_string(target) if isinstance(target, str) else target
