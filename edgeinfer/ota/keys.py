"""Moved to ``edgeinfer.keys`` (signed commands use the keys too); this name stays for scripts."""

from __future__ import annotations

from ..keys import *  # noqa: F403
from ..keys import __all__ as __all__
