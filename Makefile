# hostlock: one entry point for setting up, testing and demonstrating the collection.
#
#   make demo    run the showcase end to end ($(DEMO_TARGETS))
#   make test    every test ($(TEST_TARGETS)); .ci/run calls exactly this
#   make quick   inner loop: ruff + unit tests ($(QUICK_TARGETS))
#   make help    list the targets
#
# Each area adds its own targets in mk/<area>.mk: define test-<area> (depending on venv) and add it with
# TEST_TARGETS += test-<area>; QUICK_TARGETS += ..., DEMO_TARGETS += ... likewise.

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help
MAKEFLAGS += --no-builtin-rules

VENV     := .venv
VENV_BIN := $(VENV)/bin
PY       := $(VENV_BIN)/python
PYTEST   := $(VENV_BIN)/pytest
RUFF     := $(VENV_BIN)/ruff
# Tools the recipes run (ansible-playbook, ansible-config for molecule, ...) come from .venv first.
export PATH := $(abspath $(VENV_BIN)):$(PATH)
export PIP_DISABLE_PIP_VERSION_CHECK := 1

# The stamp is keyed on what the venv is built from: editing a pin or pyproject.toml reinstalls.
VENV_HASH  := $(shell cat requirements/dev.txt pyproject.toml setup.py tools/make_venv.sh 2>/dev/null | sha256sum | cut -c1-16)
VENV_STAMP := $(VENV)/.stamp-$(VENV_HASH)

PYTEST_ARGS ?=
# pytest-xdist workers for the integration suites whose tests are independent (own tmp dirs, free ports).
# XDIST= runs them serially.
# worksteal: a worker that runs out takes tests queued on another. With the default (load), the last tests queued
# on one worker ran one after another while the others were idle: test-cli 141 s -> 71 s on four workers.
XDIST ?= -n 2 --dist worksteal
# The suites that mostly wait (test-cli at 0.6 of a core, test-fleet 0.55, with two workers) take six.
XDIST_WAITING ?= $(if $(strip $(XDIST)),-n 6 --dist worksteal)
TEST_TARGETS  := lint test-unit
QUICK_TARGETS := lint test-unit
DEMO_TARGETS  :=
# What the suites install (Debian packages) or lay out before they run: make test does these first.
TEST_DEPS     :=

include mk/infra.mk
-include $(filter-out mk/infra.mk,$(sort $(wildcard mk/*.mk)))

TEST_TARGETS += sanity units lint-ansible
TEST_DEPS    += sanity-deps

.PHONY: help venv test quick demo clean distclean
help:
	@echo "make demo         run the showcase end to end: $(or $(strip $(DEMO_TARGETS)),(nothing yet))"
	@echo "make test         every test: $(TEST_TARGETS)"
	@echo "make quick        inner loop: $(QUICK_TARGETS)"
	@echo "make venv         create/update .venv (Python 3.11, requirements/dev.txt, hostlock editable)"
	@echo "make lint         ruff over plugins tests benchmarks tools, changelog fragments"
	@echo "make typecheck    mypy over the engine (as Python 3.8) and the plugins (mypy.ini)"
	@echo "make test-ansible-matrix  a real ansible-playbook smoke on ansible-core 2.19, 2.20 and 2.21"
	@echo "make sanity       ansible-test sanity --venv --python 3.11 in a collection-layout copy"
	@echo "make units        ansible-test units for tests/unit/plugins in the same layout"
	@echo "make lint-ansible ansible-lint --offline, production profile"
	@echo "make bench-engine engine benchmark table (benchmarks/engine.py; not part of make test)"
	@echo "make clean        remove build and test output (keeps .venv); distclean also removes .venv"

venv: $(VENV_STAMP)
$(VENV_STAMP):
	@tools/make_venv.sh $(VENV) $(notdir $(VENV_STAMP))

# make test in two phases. First the suites that keep both cores busy, one after another. Then the suites that
# mostly wait (on leases running out, etcd, a booting systemd: 0.5-0.8 of a core each) side by side with the
# static checks, which start no server, bind no port and watch no machine-wide state (files in their own copy).
# Each side runs its targets one at a time; -Orecurse prints a side's output when it ends. The Debian packages both
# sides need are installed first, so no two apt-gets meet.
WAITING_TARGETS := test-cli test-fleet test-systemd
STATIC_TARGETS  := typecheck sanity units lint-ansible
FIRST_TARGETS    = $(filter-out $(WAITING_TARGETS) $(STATIC_TARGETS),$(TEST_TARGETS))
WAITING_SIDE     = $(filter $(WAITING_TARGETS),$(TEST_TARGETS))
STATIC_SIDE      = $(filter $(STATIC_TARGETS),$(TEST_TARGETS))
test:
	@$(MAKE) --no-print-directory $(TEST_DEPS) $(FIRST_TARGETS)
	@echo "make test: now side by side: $(WAITING_SIDE) | $(STATIC_SIDE)"
	@$(MAKE) --no-print-directory -j2 -Orecurse test-side-waiting test-side-static
	@echo "make test: all passed ($(TEST_TARGETS))"

.PHONY: test-side-waiting test-side-static
test-side-waiting:
	@$(MAKE) --no-print-directory -j1 $(WAITING_SIDE)
test-side-static:
	@$(MAKE) --no-print-directory -j1 $(STATIC_SIDE)

quick: $(QUICK_TARGETS)

demo: $(DEMO_TARGETS)
	@$(if $(strip $(DEMO_TARGETS)),true,echo "make demo: no demo registered yet (DEMO_TARGETS is empty)")

clean:
	rm -rf tests/output build dist *.egg-info .ruff_cache .pytest_cache benchmarks/output
	rm -f hostlock-core-*.tar.gz
	find . -path ./.venv -prune -o -path ./.git -prune -o -name __pycache__ -type d -print0 | xargs -0 rm -rf

distclean: clean
	rm -rf $(VENV) $(VENV).lock .venv-ansible-* .venv-py*
