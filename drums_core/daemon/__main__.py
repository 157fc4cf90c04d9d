"""``python -m drums_core.daemon``: run the daemon (see :func:`drums_core.daemon.server.main`)."""
import sys

from .server import main

sys.exit(main())
