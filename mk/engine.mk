# The lock engine (plugins/module_utils/hostlock: api, core/, host/; docs/layout.md).
#
#   make test-engine   real processes and signals: 8-process stress with an overlap detector, SIGKILL at
#                      random points, PID reuse in a pid namespace, hostile directories, leases (~1-2 min)
#   make test-pythons  what can differ between interpreters, on every other CPython 3.8-3.13 that pyenv has
#                      (skips missing ones), each in its own .venv-pyXY with requirements/pythons.txt, two xdist
#                      workers as test-engine (~1 min each)
#
# The engine's unit tests (tests/unit/engine) run in test-unit with everything else under tests/unit.

.PHONY: test-engine test-pythons

test-engine: venv
	$(PYTEST) -q $(XDIST) tests/integration/engine $(PYTEST_ARGS)

PYENV_ROOT ?= $(shell pyenv root 2>/dev/null || echo $$HOME/.pyenv)
# What test-pythons runs, and why. .venv's CPython 3.11 runs every engine test already (test-unit,
# test-engine), so 3.11 is not run again. On each other interpreter runs what can differ between interpreters:
# - every module's import (tests/unit/engine/test_imports.py: syntax, the standard library's names) and the unit
#   tests, whose examples drive each module's code on that interpreter;
# - the C APIs the engine reaches through the standard library and the behaviour of signals, fork and /proc:
#   fcntl's OFD constants (missing before 3.9), os.pidfd_open and signal.pidfd_send_signal (3.9+), prctl through
#   _ctypes, os.register_at_fork, SO_PEERCRED, errno on a full or read-only filesystem, EINTR and handlers in
#   timed waits, the daemonized lease holder: test_recovery (kills, PID reuse, threads), test_proofs (holdership
#   from /proc, pidfds, ending holders), test_timed_waits, test_leases, test_lease_*, test_hostile, and
#   test_stress's killed-holder tests.
# What runs once, on 3.11: the engine's own decisions over those same calls, which are the same bytecode on every
# interpreter: trust in shared and default directories (test_directories, test_shared_directory_*), gc
# (test_gc), the queue's order (test_fairness), the stress runs with their overlap detector (8 processes,
# SIGKILL at random points, the barging switch), the private-checkout rerun (test_private_checkout), and the
# property tests of the pure-Python parsers (PYTHONS_ONCE: hypothesis, hundreds of examples each, tens of
# seconds an interpreter).
ENGINE_PYTHONS ?= 3.8 3.9 3.10 3.12 3.13
PYTHONS_TESTS ?= tests/unit/engine $(addprefix tests/integration/engine/,test_recovery.py test_proofs.py \
  test_timed_waits.py test_leases.py test_lease_channel.py test_lease_netns.py test_lease_path.py \
  test_lease_polish.py test_hostile.py test_stress.py)
PYTHONS_ONCE := tests/unit/engine/test_wirejson.py::test_parses_what_json_writes \
  tests/unit/engine/test_wirejson.py::test_writes_what_json_writes \
  tests/unit/engine/test_owner_record.py::test_parse_record_never_raises_on_any_bytes \
  tests/unit/engine/test_owner_record.py::test_holder_from_any_well_formed_record_never_raises \
  tests/unit/engine/test_owner_record.py::test_a_record_claiming_another_uid_than_its_file_owner_is_always_forged \
  tests/unit/engine/test_lease_protocol.py::test_no_line_without_the_secret_makes_the_holder_raise_or_act
PYTHONS_PYTEST_ARGS ?= -k "not 8_processes and not sigkill_at_random and not barging_switch" \
  $(addprefix --deselect ,$(PYTHONS_ONCE))

test-pythons:
	@ran=""; \
	for v in $(ENGINE_PYTHONS); do \
	  py=$$(ls -d $(PYENV_ROOT)/versions/$$v.*/bin/python$$v 2>/dev/null | sort -V | tail -n 1); \
	  if [[ -z "$$py" || ! -x "$$py" ]]; then echo "make test-pythons: Python $$v not found under $(PYENV_ROOT): skipped"; continue; fi; \
	  venv=.venv-py$${v/./}; \
	  if [[ ! -x $$venv/bin/pytest || requirements/pythons.txt -nt $$venv/bin/pytest ]]; then \
	    "$$py" -m venv --clear $$venv && $$venv/bin/python -m pip install -q -r requirements/pythons.txt; fi; \
	  echo "make test-pythons: $$("$$py" -V) ($$py)"; \
	  PYTHONPATH=$(CURDIR)/plugins/module_utils $$venv/bin/python -m pytest -q -p no:cacheprovider $(XDIST) $(PYTHONS_TESTS) $(PYTHONS_PYTEST_ARGS) $(PYTEST_ARGS); \
	  ran="$$ran $$v"; \
	done; \
	echo "make test-pythons: engine tests passed on:$$ran"

TEST_TARGETS += test-engine test-pythons

.PHONY: demo-engine
demo-engine: venv
	@$(PY) demo/engine_demo.py

DEMO_TARGETS := demo-engine $(DEMO_TARGETS)
