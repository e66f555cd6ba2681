# Infrastructure targets: lint, repository-level unit tests, ansible-test sanity/units in the
# ansible_collections/hostlock/core layout, ansible-lint, the engine benchmark.

LINT_PATHS := $(wildcard plugins tests benchmarks tools setup.py)
ANSIBLE_TEST := $(abspath $(VENV_BIN))/ansible-test
ANSIBLE_TEST_PYTHON ?= 3.11
SANITY_ARGS ?=
UNITS_ARGS ?=

.PHONY: lint test-unit sanity sanity-deps units lint-ansible bench-engine

lint: venv
	$(RUFF) check $(LINT_PATHS)
	$(VENV_BIN)/antsibull-changelog lint

# tests/unit/plugins holds ansible-test unit tests (they import ansible_collections.hostlock.core.*):
# `make units` runs those in the collection layout; everything else under tests/unit runs here.
test-unit: venv
	$(PYTEST) -q tests/unit --ignore=tests/unit/plugins $(PYTEST_ARGS)

# Copy the working tree's tracked and untracked-but-not-ignored files into
# $$tmp/ansible_collections/hostlock/core (the layout ansible-test requires) and cd there.
# On a fresh clone that is exactly the tracked files. Deleted-but-tracked files are skipped.
# COPY_UNTRACKED=0 copies only tracked files (check what is committed, ignoring work in progress).
COPY_UNTRACKED ?= 1
define collection_copy
tmp=$$(mktemp -d "$${TMPDIR:-/tmp}/hostlock-ansible-test.XXXXXX"); \
trap 'rm -rf "$$tmp"' EXIT; \
dest="$$tmp/ansible_collections/hostlock/core"; mkdir -p "$$dest"; \
git ls-files -z --cached $(if $(filter 1,$(COPY_UNTRACKED)),--others --exclude-standard) \
  | while IFS= read -r -d '' f; do if [[ -e "$$f" || -L "$$f" ]]; then printf '%s\0' "$$f"; fi; done \
  | tar --null --no-recursion -T - -cf - | tar -xf - -C "$$dest"; \
cd "$$dest"
endef

# ansible-test fetches a pip bootstrap script from a host we cannot reach unless
# ~/.ansible/test/cache/get_pip_<version>.py exists: tools/ansible_test_pip.py writes a stand-in.
sanity: venv sanity-deps
	@$(PY) tools/ansible_test_pip.py
	@$(collection_copy); \
	echo "make sanity: ansible-test sanity --venv --python $(ANSIBLE_TEST_PYTHON) in $$dest"; \
	$(ANSIBLE_TEST) sanity --venv --python $(ANSIBLE_TEST_PYTHON) --color no $(SANITY_ARGS)

# ansible-test's shellcheck sanity test is skipped (with only a warning) when shellcheck is missing.
sanity-deps:
	@if ! command -v shellcheck >/dev/null; then \
	  echo "make sanity: installing shellcheck (apt-get)"; \
	  apt_get() { DEBIAN_FRONTEND=noninteractive apt-get -qq -o DPkg::Lock::Timeout=300 "$$@"; }; \
	  apt_get install -y shellcheck >/dev/null 2>&1 || { apt_get update && apt_get install -y shellcheck >/dev/null; }; \
	fi

# In .venv itself (ansible-test's "origin" Python, the pinned pytest and pytest-xdist of requirements/dev.txt):
# with --venv ansible-test built a fresh venv inside each collection copy and pip-installed its requirements
# into it, 75 of the target's 87 s on every run.
units: venv
	@if [[ -z "$$(find tests/unit/plugins -name 'test_*.py' -print -quit 2>/dev/null)" ]]; then \
	  echo "make units: no tests under tests/unit/plugins yet: nothing to run"; exit 0; fi; \
	$(collection_copy); \
	$(ANSIBLE_TEST) units --python $(ANSIBLE_TEST_PYTHON) --color no $(UNITS_ARGS) tests/unit/plugins/

ANSIBLE_LINT_PATHS := $(wildcard roles playbooks)
# The with_lock role calls hostlock.core's own modules: ansible-lint resolves them from the checkout, linked
# as a collection (roles-collection, mk/roles.mk).
lint-ansible: venv roles-collection
	@if [[ -z "$(ANSIBLE_LINT_PATHS)" ]]; then echo "make lint-ansible: no roles/ or playbooks/ yet"; exit 0; fi; \
	ANSIBLE_COLLECTIONS_PATH=$(abspath $(ROLES_COLLECTIONS)) \
	  $(VENV_BIN)/ansible-lint --offline --profile production $(ANSIBLE_LINT_PATHS)

bench-engine: venv
	$(PY) -m pip install --quiet -r requirements/bench.txt
	$(PY) benchmarks/engine.py --docs docs/benchmarks.md $(BENCH_ARGS)

# Before and after the one-source layout (issue 25): payloads, a locked task, start-up, the engine.
.PHONY: bench-layout
bench-layout: venv
	$(PY) benchmarks/layout.py --docs docs/benchmarks.md $(BENCH_ARGS)
