"""``python -m edgeinfer.bench SPEC.json``: the child process that measures one configuration."""

from __future__ import annotations

import sys

from .harness import child_main

sys.exit(child_main(sys.argv[1:]))
