"""The sha256 of a model file, computed once per file version in this process.

Every load keys its caches by the model's sha256; hashing a 64 MiB model costs tens of
milliseconds, on every load. The digest is kept by (path, device, inode, size, mtime_ns,
ctime_ns): replacing the file (a new inode) or writing into it (a new mtime and ctime, and ctime
cannot be set back by ``touch``) gives a new key, so a stale digest is never returned. File
timestamps are coarse (a kernel tick on many systems), so a file changed in the last
``RACY_NS`` is hashed every time, as git does with racily clean index entries: a rewrite within
one tick of the last hash cannot hide behind an equal key.
"""

from __future__ import annotations

import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable

_MAX = 64  # file versions remembered; a device loads a handful of models
RACY_NS = 2_000_000_000
_lock = threading.Lock()
_digests: OrderedDict[tuple[object, ...], str] = OrderedDict()


def _key(path: str | os.PathLike[str], st: os.stat_result) -> tuple[object, ...]:
    return (os.path.abspath(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns,
            st.st_ctime_ns)


def cached_digest(path: str | os.PathLike[str], st: os.stat_result,
                  compute: Callable[[], str]) -> str:
    """The digest remembered for this version of ``path`` (``st`` its stat), else ``compute()``."""
    key = _key(path, st)
    with _lock:
        found = _digests.get(key)
        if found is not None:
            _digests.move_to_end(key)
            return found
    digest = compute()
    if time.time_ns() - max(st.st_mtime_ns, st.st_ctime_ns) < RACY_NS:
        return digest  # changed a moment ago: another change could keep the same timestamps
    with _lock:
        _digests[key] = digest
        while len(_digests) > _MAX:
            _digests.popitem(last=False)
    return digest


def forget() -> None:
    """Drop every remembered digest (tests)."""
    with _lock:
        _digests.clear()
