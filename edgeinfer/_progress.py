"""Word of long work (fetching an example model, measuring backends) for a person waiting on it.

``say(logger, "measuring %d candidates ...", n)`` always logs the line at INFO. It is also
written to stderr, once, when a person is likely watching and logging would not show it:

- logging shows INFO for that logger (a handler and the level let it through): logging only,
  never the same line twice;
- else stderr is a terminal: one line ``edgeinfer: ...`` on stderr;
- else nothing more: a library says nothing on a program's non-interactive output (a cron job,
  a service, a pipe), where the INFO record is there for whoever configures logging.

``EDGEINFER_PROGRESS=0`` keeps these lines off stderr, ``=1`` writes them there even when it is
not a terminal. Nothing here runs per frame: a line is worth writing only for work that takes
seconds.
"""

from __future__ import annotations

import logging
import os
import sys

__all__ = ["ENV", "say", "to_stderr"]

ENV = "EDGEINFER_PROGRESS"


def to_stderr(logger: logging.Logger) -> bool:
    """Whether ``say`` writes its line to stderr as well (see the module's docstring)."""
    setting = os.environ.get(ENV, "").strip().lower()
    if setting in ("0", "false", "no", "off"):
        return False
    if logger.isEnabledFor(logging.INFO) and logger.hasHandlers():
        return False  # logging shows it
    if setting in ("1", "true", "yes", "on"):
        return True
    stream = sys.stderr
    try:
        return stream is not None and stream.isatty()
    except (AttributeError, ValueError):  # replaced by an object without isatty, or closed
        return False


def say(logger: logging.Logger, msg: str, *args: object) -> None:
    """Log ``msg % args`` at INFO, and write it to stderr when a person would not see it
    otherwise (``to_stderr``)."""
    logger.info(msg, *args)
    if to_stderr(logger):
        try:
            print(f"edgeinfer: {msg % args if args else msg}", file=sys.stderr, flush=True)
        except (OSError, ValueError):  # a closed or broken stderr: the word is not worth an error
            pass
