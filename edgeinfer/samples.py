"""Moved to ``edgeinfer.model.samples``; ``from edgeinfer import samples`` (as the docs and users'
scripts write it) still gives that same module, not a copy."""

import sys

from .model import samples

sys.modules[__name__] = samples
