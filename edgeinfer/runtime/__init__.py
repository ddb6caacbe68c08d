"""Runtime backends behind one ``Session`` protocol.

A model opens on exactly the ``Choice`` its spec names, else on the winner of the measuring
selector (``select.py``: cached, or measured now; a cached one measured under load is measured
again when the box is quiet, ``provisional.py``), else (``probe`` off) on the format's own
backend (``backends.FORMATS``) with its ranking of providers. The backends are modules in
``backends/``, one table in ``backends/__init__.py``. Nothing here imports onnxruntime,
OpenVINO or LiteRT until a model needs it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import ConfigError
from .backends import FORMATS, check_options, module
from .base import Choice, LoadReport, Session, SessionSpec, TensorSpec

if TYPE_CHECKING:
    from .select import Gate

__all__ = ["Choice", "LoadReport", "Session", "SessionSpec", "TensorSpec", "measures",
           "open_session"]


def measures(spec: SessionSpec) -> bool:
    """Whether opening ``spec`` measures backends: ``probe`` on, no exact choice, and not
    ``strict_providers`` (which keeps the format's backend with its verified fallbacks)."""
    return spec.probe and spec.choice is None and not spec.strict_providers


def open_session(spec: SessionSpec, gate: Gate | None = None) -> Session:
    """Build, verify and warm a session in this process (see the module's docstring)."""
    check_options(spec)
    if spec.choice is not None:
        from .select import open_choice

        return open_choice(spec, spec.choice, warmup=spec.warmup)
    if measures(spec):
        from .provisional import open_decided

        return open_decided(spec, gate, spec.probe_budget_s)
    if spec.format not in FORMATS:
        raise ConfigError(f"unknown model format {spec.format!r}; valid: "
                          f"{', '.join(sorted(FORMATS))}")
    session: Session = module(FORMATS[spec.format]).open_session(spec)
    return session
