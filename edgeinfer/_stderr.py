"""Native libraries that log to file descriptor 2 on their own (LiteRT's C++ runtime prints
``INFO: [compiled_model.cc:829] ...`` for every model and every accelerator it registers, with no
switch to turn it off): ``native_logs_to_debug`` captures fd 2 around such a call, sends the
library's lines to this process's debug log and writes every other line (another thread's log
record, a real error) back to stderr unchanged.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
import tempfile
import threading
from collections.abc import Iterator

logger = logging.getLogger(__name__)

# "INFO: [file.cc:12] text", "WARNING: [...]", "ERROR: [...]", LiteRT's "└ Could not load ..."
# and TFLite's "INFO: Created TensorFlow Lite XNNPACK delegate for CPU."
NATIVE_LINE = re.compile(rb"^(?:(?:VERBOSE|DEBUG|INFO|WARNING|ERROR): \[[\w./-]+:\d+\]"
                         rb"|\xe2\x94\x94 |INFO: Created TensorFlow Lite )")

_lock = threading.Lock()


@contextlib.contextmanager
def native_logs_to_debug(pattern: re.Pattern[bytes] = NATIVE_LINE,
                         captured: list[str] | None = None) -> Iterator[None]:
    """Capture fd 2 for the duration; see the module. Nested or concurrent uses serialize.

    Args:
        pattern: Which lines are the library's (to the debug log); others go back to stderr.
        captured: Where the library's lines are also appended (decoded), for a caller that
            reads the reason for a failure out of them.
    """
    with _lock:
        try:
            sys.stderr.flush()
        except (AttributeError, ValueError):
            pass
        saved = os.dup(2)
        with tempfile.TemporaryFile() as tmp:
            os.dup2(tmp.fileno(), 2)
            try:
                yield
            finally:
                try:
                    sys.stderr.flush()
                except (AttributeError, ValueError):
                    pass
                os.dup2(saved, 2)
                os.close(saved)
                tmp.seek(0)
                for line in tmp:
                    if pattern.match(line):
                        text = line.rstrip().decode("utf-8", "replace")
                        logger.debug("%s", text)
                        if captured is not None:
                            captured.append(text)
                    else:
                        os.write(2, line)
