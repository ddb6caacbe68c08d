"""Moved to ``edgeinfer.model.catalog``; ``from edgeinfer import catalog`` (as the docs and
users' scripts write it) still gives that same module, not a copy."""

import sys

from .model import catalog

sys.modules[__name__] = catalog
