"""``python -m edgeinfer`` is the ``edgeinfer`` command."""

from .cli import main

raise SystemExit(main())
