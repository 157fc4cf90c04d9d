"""``python -m drums_osworld.bench <suite> ...`` (the same as ``drums bench``)."""
import sys

from . import main

sys.exit(main())
