# Two commands, each complete on a fresh Debian 12/13 machine (run as root):
#   make demo   provision, then run the demo
#   make test   provision, then run the whole test suite
ROOT := $(patsubst %/,%,$(dir $(abspath $(lastword $(MAKEFILE_LIST)))))
PYTHON := /opt/drums/venv/bin/python

.PHONY: demo test

demo:
	cd $(ROOT) && scripts/provision && $(PYTHON) -m drums_osworld.apps.demo

test:
	cd $(ROOT) && scripts/provision && $(PYTHON) -m pytest -p no:cacheprovider -v -rfE --durations=60 tests
