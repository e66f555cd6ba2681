# The lock engine (plugins/module_utils/hostlock: api, core/, host/; docs/layout.md).
#
#   make test-engine   real processes and signals: 8-process stress with an overlap detector, SIGKILL at
#                      random points, PID reuse in a pid namespace, hostile directories, leases (~1-2 min)
#   make test-pythons  the engine tests on every CPython 3.8-3.13 that pyenv has (skips missing ones),
#                      each in its own .venv-pyXY with requirements/pythons.txt, two xdist workers as test-engine (~3 min)
#
# The engine's unit tests (tests/unit/engine) run in test-unit with everything else under tests/unit.

.PHONY: test-engine test-pythons

test-engine: venv
	$(PYTEST) -q $(XDIST) tests/integration/engine $(PYTEST_ARGS)

PYENV_ROOT ?= $(shell pyenv root 2>/dev/null || echo $$HOME/.pyenv)
ENGINE_PYTHONS ?= 3.8 3.9 3.10 3.11 3.12 3.13
# The 8-process stress runs once, under .venv (test-engine); every other engine test runs on each Python.
PYTHONS_PYTEST_ARGS ?= -k "not 8_processes and not sigkill_at_random and not private_checkout"

test-pythons:
	@ran=""; \
	for v in $(ENGINE_PYTHONS); do \
	  py=$$(ls -d $(PYENV_ROOT)/versions/$$v.*/bin/python$$v 2>/dev/null | sort -V | tail -n 1); \
	  if [[ -z "$$py" || ! -x "$$py" ]]; then echo "make test-pythons: Python $$v not found under $(PYENV_ROOT): skipped"; continue; fi; \
	  venv=.venv-py$${v/./}; \
	  if [[ ! -x $$venv/bin/pytest || requirements/pythons.txt -nt $$venv/bin/pytest ]]; then \
	    "$$py" -m venv --clear $$venv && $$venv/bin/python -m pip install -q -r requirements/pythons.txt; fi; \
	  echo "make test-pythons: $$("$$py" -V) ($$py)"; \
	  PYTHONPATH=$(CURDIR)/plugins/module_utils $$venv/bin/python -m pytest -q -p no:cacheprovider $(XDIST) tests/unit/engine tests/integration/engine $(PYTHONS_PYTEST_ARGS); \
	  ran="$$ran $$v"; \
	done; \
	echo "make test-pythons: engine tests passed on:$$ran"

TEST_TARGETS += test-engine test-pythons

.PHONY: demo-engine
demo-engine: venv
	@$(PY) demo/engine_demo.py

DEMO_TARGETS := demo-engine $(DEMO_TARGETS)
