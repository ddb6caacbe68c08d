"""Resolve ``"package.module:attr"`` strings: the lazy registries' one way to import a plugin."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
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


def lazy_attributes(module: str, table: Mapping[str, str], namespace: dict[str, Any]
                    ) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """A package's ``__getattr__`` and ``__dir__`` (PEP 562) that import ``table``'s names
    (``name -> "pkg.mod:attr"``) when first used and keep them in ``namespace``, its globals."""

    def get(name: str) -> Any:
        target = table.get(name)
        if target is None:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        value = import_from_string(target)
        namespace[name] = value
        return value

    def names() -> list[str]:
        return sorted(set(namespace) | set(table))

    return get, names
