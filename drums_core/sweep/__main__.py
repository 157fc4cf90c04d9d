"""``python -m drums_core.sweep --ledger DIR``: the sweep (see :func:`drums_core.sweep.cli.main`)."""
import sys

from .cli import main

sys.exit(main())
