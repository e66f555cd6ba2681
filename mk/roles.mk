# Roles: hostlock.core.cli (installs the command), hostlock.core.cron (single-instance cron jobs) and
# hostlock.core.systemd (timers and services under named locks; its scenario boots a real systemd instead of sshd).
#
#   make test-roles      molecule test for each role: check mode on a fresh host, converge, idempotence, verify,
#                        against a disposable SSH target (tests/integration/roles/target.sh: sshd on 127.0.0.1 in a
#                        private mount namespace, so the roles write their real paths and this machine stays as it was);
#                        and for tests/integration/roles/lock_forms, a role that locks its work with locked, with_lock
#                        and lock take-and-release, as an infra role would (its second converge changes nothing);
#                        and, beside them, tests/integration/roles/test_*.py (the cli role's installed tree against the
#                        role that copied it file by file)
#   make bench-roles     both roles on one fresh host, before/after the one-transfer install (benchmarks/roles.py)
#   make lint-roles      ansible-lint, production profile, over both roles and their molecule scenarios
#   make molecule ROLE=cron CMD=converge   one molecule command for one role (login, verify, destroy, ...)

ROLES              := cli cron systemd
# Each scenario's directory: the collection's roles, then the test roles that use them.
ROLE_DIRS          := $(addprefix roles/,$(ROLES)) tests/integration/roles/lock_forms
# ansible-lint finds hostlock.core through this symlink instead of an installed copy. Molecule needs no make step:
# each scenario's create links the checkout into its own ephemeral directory (tests/integration/roles/create.yml),
# so `cd roles/cron && molecule test` works on a fresh clone with .venv active, exactly as here.
ROLES_COLLECTIONS  := $(VENV)/roles-collections
MOLECULE           := $(abspath $(VENV_BIN))/molecule
MOLECULE_ARGS      ?=
# Each scenario's working directory (its target's files): Molecule's default is named after the role's directory
# alone (~/.ansible/tmp/molecule.HASH(cli).default), shared by every checkout on the machine; this one is this
# checkout's. Not under /tmp: the target hides /tmp (tests/integration/roles/target.sh).
MOLECULE_HOME      ?= $(HOME)/.cache/hostlock-molecule/$(shell printf '%s' '$(CURDIR)' | sha256sum | cut -c1-12)
ROLE               ?= cli
CMD                ?= test
ROLE_TESTS         := $(wildcard tests/integration/roles/test_*.py)

.PHONY: test-roles lint-roles molecule roles-deps roles-collection bench-roles

# sshd for the target; cron for crontab(1) and /etc/cron.d, which ansible.builtin.cron requires on the host;
# man-db, with which the cli scenario renders the man page the role installs.
roles-deps:
	@missing=""; \
	[[ -x /usr/sbin/sshd ]] || missing="$$missing openssh-server"; \
	command -v crontab >/dev/null || missing="$$missing cron"; \
	command -v man >/dev/null || missing="$$missing man-db"; \
	if [[ -n "$$missing" ]]; then \
	  echo "roles-deps: apt-get install$$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
	fi

roles-collection: venv
	@mkdir -p $(ROLES_COLLECTIONS)/ansible_collections/hostlock
	@ln -sfn ../../../.. $(ROLES_COLLECTIONS)/ansible_collections/hostlock/core

# The scenarios run side by side (each has its own target; their time is mostly waiting on SSH round trips),
# each into its own log, printed when it ends. (Under make's `set -e` a failing molecule must not end its
# subshell before its exit status is written: `&& ... ||` keeps it, so a failure prints its log.)
test-roles: venv roles-deps
	@logs=$$(mktemp -d "$${TMPDIR:-/tmp}/hostlock-roles.XXXXXX"); trap 'rm -rf "$$logs"' EXIT; \
	for dir in $(ROLE_DIRS); do role=$${dir##*/}; \
	  echo "make test-roles: molecule test for $$dir (log: $$logs/$$role.log)"; \
	  (cd $$dir && ANSIBLE_FORCE_COLOR=0 PY_COLORS=0 MOLECULE_EPHEMERAL_DIRECTORY=$(MOLECULE_HOME)/$$role \
	   $(MOLECULE) test $(MOLECULE_ARGS) >"$$logs/$$role.log" 2>&1 \
	   && echo 0 >"$$logs/$$role.rc" || echo $$? >"$$logs/$$role.rc") & \
	done; \
	echo "make test-roles: pytest $(ROLE_TESTS) (log: $$logs/pytest.log)"; \
	($(PYTEST) -q $(ROLE_TESTS) $(PYTEST_ARGS) >"$$logs/pytest.log" 2>&1 \
	 && echo 0 >"$$logs/pytest.rc" || echo $$? >"$$logs/pytest.rc") & \
	wait; failed=""; \
	for dir in $(ROLE_DIRS) pytest; do role=$${dir##*/}; \
	  rc=$$(cat "$$logs/$$role.rc"); \
	  if [[ $$rc != 0 ]]; then failed="$$failed $$role"; cat "$$logs/$$role.log"; fi; \
	  echo "make test-roles: $$([[ $$role == pytest ]] && echo "$(ROLE_TESTS)" || echo "$$dir"):" \
	    "$$(if [[ $$rc == 0 ]]; then echo passed; else echo FAILED rc=$$rc; fi)"; \
	  grep -E '^default (>|➜) [a-z_]+: Executed' "$$logs/$$role.log" | sed 's/^/  /' || true; \
	done; \
	[[ -z "$$failed" ]] || { echo "make test-roles: failed:$$failed"; exit 1; }

bench-roles: venv roles-deps
	$(PY) benchmarks/roles.py --docs docs/benchmarks.md $(BENCH_ARGS)

molecule: venv roles-deps
	cd $(or $(filter %/$(ROLE),$(ROLE_DIRS)),roles/$(ROLE)) && MOLECULE_EPHEMERAL_DIRECTORY=$(MOLECULE_HOME)/$(ROLE) \
	  $(MOLECULE) $(CMD) $(MOLECULE_ARGS)

lint-roles: venv roles-collection
	ANSIBLE_COLLECTIONS_PATH=$(abspath $(ROLES_COLLECTIONS)) \
	  $(VENV_BIN)/ansible-lint --offline --profile production roles/cli roles/cron roles/systemd roles/with_lock tests/integration/roles tests/integration/systemd

TEST_DEPS += roles-deps roles-collection
TEST_TARGETS += test-roles
