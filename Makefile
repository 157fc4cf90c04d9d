# Two commands, each complete on a fresh Debian 12/13 machine (run as root):
#   make demo   provision, then run the demo
#   make test   provision, then run the whole test suite
ROOT := $(patsubst %/,%,$(dir $(abspath $(lastword $(MAKEFILE_LIST)))))
PYTHON := /opt/drums/venv/bin/python

.PHONY: demo test

# Python writes and reuses its bytecode here (a shell that sets PYTHONDONTWRITEBYTECODE would have
# every daemon, drums exec and pytest process compile the code again: 5.5 against 3.3 CPU-s for one
# worker's test collection, 0.5 against 0.4 for a daemon's start); the code layer sessions see
# leaves __pycache__ out, and .gitignore does too
unexport PYTHONDONTWRITEBYTECODE

demo:
	cd $(ROOT) && scripts/provision && $(PYTHON) -m drums_osworld.apps.demo

# make test, in three lanes (each checks at its end that it left nothing on the host):
# 1. the unit lane (no root, no sessions), first: it fails in a minute when it fails; lane 3 runs
#    beside it (below) and is stopped when it fails (SIGINT, which a shell's background job would
#    ignore without env --default-signal: its windows clean up on KeyboardInterrupt);
# 2. the tests on real desktops, in TEST_WORKERS pytest-xdist workers: each worker runs its own
#    daemon instance on a slot block of its own (tests/support/slots.py), and a file's tests stay
#    on one worker (module fixtures, one module's desktops) except in the two longest files, whose
#    tests go out one by one; the longest first (tests/support/schedule.py). At 5 workers the lane
#    is CPU-bound: this 2-core machine's CPUs were 93 to 99% busy through it (at 3, 45% idle).
#    The benchmark smoke runs (tests/bench) are among them: each runs on instances and slots of its
#    worker's own, and the KSM settings the memory suite changes for one arm are put back after it;
# 3. tests/faults (marker alone), with no other desktop test running: a fault window is valid only
#    on a host where nothing but its neighbour window's processes, mounts and CRIU runs (anything
#    else would look like the window's leftovers). The unit lane makes no session, mount or CRIU
#    run, so it runs beside it: the windows run three at a time (they wait between bursts; the
#    harness tells a neighbour's from leftovers), the unit lane takes what is left. Its output is
#    printed after the unit lane's.
TEST_WORKERS ?= 5
PYTEST := $(PYTHON) -m pytest -p no:cacheprovider -v -rfE --durations=60

test:
	cd $(ROOT) && scripts/provision
	cd $(ROOT) && $(PYTHON) -m compileall -q drums_core drums_osworld tests
	cd $(ROOT) && log=$$(mktemp /tmp/drums-alone-lane.XXXXXX) && \
	  { env --default-signal=INT $(PYTEST) -m alone tests > $$log 2>&1 & alone=$$!; } && \
	  if $(PYTEST) -m "not root" tests; then wait $$alone; rc=$$?; else kill -INT $$alone; wait $$alone; rc=1; fi; \
	  echo "======== the alone lane (-m alone), run beside the unit lane ========"; \
	  cat $$log; rm -f $$log; exit $$rc
	cd $(ROOT) && $(PYTEST) -m "root and not alone" -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder tests
