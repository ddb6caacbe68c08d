"""Keep msgspec Struct types alive through interpreter exit.

msgspec 0.21 and 0.22 can crash the interpreter (SIGSEGV in ``TypeNode_Free``, called from
``StructMeta_clear``) when the final garbage collection at exit frees Struct types whose
validation info refers to each other, as the config tree's do after one ``msgspec.convert``.
``edgeinfer validate-config`` then died with signal 11 instead of exiting 0 or 78, about one run
in five. msgspec 0.20 leaked a reference to each such type, which kept them alive; this does the
same on purpose, at exit only, when the process is about to release everything anyway.
"""

from __future__ import annotations

import atexit

__all__ = ["keep_struct_types_at_exit"]

_registered = False


def keep_struct_types_at_exit() -> None:
    """Register (once) the exit hook that keeps every Struct type alive to the end."""
    global _registered
    if not _registered:
        _registered = True
        atexit.register(_keep_struct_types)


def _keep_struct_types() -> None:
    import ctypes

    import msgspec

    incref = ctypes.PYFUNCTYPE(None, ctypes.py_object)(("Py_IncRef", ctypes.pythonapi))
    seen: set[type] = set()
    stack: list[type] = [msgspec.Struct]
    while stack:
        subs: list[type] = type.__subclasses__(stack.pop())
        for sub in subs:
            if sub not in seen:
                seen.add(sub)
                stack.append(sub)
                incref(sub)
