"""TFLite external delegates: finding them on a device, naming them, checking a library is one.

Edge TPU (``libedgetpu.so.1``), Mesa's Teflon for Rockchip and Amlogic NPUs (``libteflon.so``;
Debian trixie's arm64 ``mesa-teflon-delegate`` installs it as ``/usr/lib/teflon/libteflon.so``,
outside the linker's path) and ARM NN (``libarmnnDelegate.so``) are looked for in the usual
library folders and with ``ctypes.util.find_library``. Only ctypes is needed: LiteRT is not
imported here.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
from collections.abc import Callable, Iterable, Mapping

from ..base import DelegateSpec

# (file name, name for ctypes.util.find_library or "" for none, short name, default options),
# best first: NPUs before ARM NN's CPU/GPU kernels.
KNOWN_DELEGATES: tuple[tuple[str, str, str, Mapping[str, str]], ...] = (
    ("libedgetpu.so.1", "edgetpu", "edgetpu", {}),
    # not on the linker's path in Debian's package, so find_library would never see it
    ("libteflon.so", "", "teflon", {}),
    ("libarmnnDelegate.so", "armnnDelegate", "armnn", {"backends": "CpuAcc,CpuRef"}),
)
LIBRARY_DIRS: tuple[str, ...] = (
    "/usr/lib",
    "/usr/lib/aarch64-linux-gnu",
    "/usr/lib/arm-linux-gnueabihf",
    "/usr/lib/teflon",  # mesa-teflon-delegate (Debian trixie, arm64)
    "/usr/local/lib",
    "/usr/local/lib/aarch64-linux-gnu",  # Mesa built from source with meson's default libdir
)

def discover_delegates(
    dirs: Iterable[str] = LIBRARY_DIRS,
    find_library: Callable[[str], str | None] = ctypes.util.find_library,
    root: str = "/",
) -> tuple[DelegateSpec, ...]:
    """The well-known delegate libraries (``KNOWN_DELEGATES``) on this device, best first.

    Args:
        dirs: folders to look in, in order, before asking ``find_library``.
        find_library: ``ctypes.util.find_library`` or a stand-in for tests.
        root: the filesystem root ``dirs`` are under (a device's root mounted elsewhere, a test's
            temporary folder).
    """
    dirs = tuple(os.path.join(root, d.lstrip("/")) for d in dirs)
    found: list[DelegateSpec] = []
    for filename, libname, _, options in KNOWN_DELEGATES:
        path = next((p for d in dirs if os.path.isfile(p := os.path.join(d, filename))), None)
        path = path or (find_library(libname) if libname else None)
        if path:
            found.append(DelegateSpec(path, dict(options)))
    return tuple(found)


@functools.cache
def find_delegates() -> tuple[DelegateSpec, ...]:
    """:func:`discover_delegates` with the defaults, looked up once per process."""
    # find_library runs ldconfig; the libraries do not come and go while we run.
    return discover_delegates()


def delegate_name(library: str) -> str:
    """Short provider name of a delegate library: ``/usr/lib/libedgetpu.so.1`` -> ``edgetpu``."""
    base = os.path.basename(library)
    for filename, _, short, _ in KNOWN_DELEGATES:
        if base == filename or base.startswith(filename.split(".so")[0] + ".so"):
            return short
    base = base.split(".so")[0].removeprefix("lib")
    for suffix in ("_delegate", "Delegate", "delegate"):
        base = base.removesuffix(suffix)
    return base.lower() or library


def check_plugin(library: str) -> None:
    # LiteRT's Delegate.__del__ raises (printed as "Exception ignored") when the library does not
    # load or lacks the plugin entry points, so those cases are caught here first.
    lib = ctypes.CDLL(library)
    for symbol in ("tflite_plugin_create_delegate", "tflite_plugin_destroy_delegate"):
        if not hasattr(lib, symbol):
            raise OSError(f"{library} is not a TFLite external delegate (no {symbol})")
