"""``python -m drums_core.sweep --ledger DIR``: the sweep (see :func:`drums_core.sweep.sweep.main`)."""
import sys

from .sweep import main

sys.exit(main())
