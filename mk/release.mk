# Release quality: the type checker, the tested ansible-core range (and, in tests/unit, the published tarball).
#
#   make typecheck            mypy (pinned in requirements/dev.txt, mypy.ini): the engine (plugins/module_utils/hostlock) as Python 3.8;
#                             the modules (they run on targets: 3.8 too) and the controller plugins (3.11)
#                             in the ansible_collections/hostlock/core layout they are imported from
#   make test-ansible-matrix  a real ansible-playbook smoke (lock, lock_info, locked, serialize; local connection)
#                             on each tested ansible-core: 2.19 (.venv, Python 3.11), 2.20 (3.12) and 2.21 (3.13),
#                             each in .venv-ansible-X.Y from requirements/ansible-X.Y.txt (tools/ansible_matrix.sh)
#   (tests/unit/test_galaxy_build.py builds the tarball and checks its file list: part of test-unit)

.PHONY: typecheck test-ansible-matrix

MYPY := $(abspath $(VENV_BIN))/mypy
COLLECTION_PKG := ansible_collections.hostlock.core.plugins

# The plugins import each other as ansible_collections.hostlock.core.*: a symlink in a temporary directory
# gives mypy that layout over this checkout (nothing copied, errors name the real files through the link).
typecheck: venv
	$(MYPY)
	@tmp=$$(mktemp -d "$${TMPDIR:-/tmp}/hostlock-mypy.XXXXXX"); trap 'rm -rf "$$tmp"' EXIT; \
	mkdir -p "$$tmp/ansible_collections/hostlock"; ln -s "$(CURDIR)" "$$tmp/ansible_collections/hostlock/core"; \
	echo "make typecheck: plugins in the collection layout (modules as 3.8, controller plugins as 3.11)"; \
	MYPYPATH="$$tmp" $(MYPY) --python-version 3.8 --namespace-packages --explicit-package-bases \
	  -p $(COLLECTION_PKG).modules -m $(COLLECTION_PKG).module_utils._common; \
	MYPYPATH="$$tmp" $(MYPY) --python-version 3.11 --namespace-packages --explicit-package-bases \
	  -p $(COLLECTION_PKG).action -p $(COLLECTION_PKG).callback -p $(COLLECTION_PKG).plugin_utils

TEST_TARGETS += typecheck
QUICK_TARGETS += typecheck

MATRIX_VERSIONS ?= 2.19 2.20 2.21
test-ansible-matrix: venv
	@tools/ansible_matrix.sh $(MATRIX_VERSIONS)

TEST_TARGETS += test-ansible-matrix
