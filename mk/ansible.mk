# Ansible side: the lock/lock_info modules, the locked action, the serialize callback.
#
#   make test-ansible        real ansible-playbook runs (local + a real sshd on 127.0.0.1, and a real etcd for
#                            the fleet tests) against the collection built and installed from a tarball, then
#                            the ansible-test targets
#   make integration-ansible ansible-test integration for tests/integration/targets/* (part of test-ansible)
#   make demo-ansible        the showcase: a playbook holding a lock, a concurrent run waiting, hostlock status
#   make bench-ansible       locked-vs-ping and callback-overhead table (benchmarks/ansible_plugins.py, docs/benchmarks.md)

ANSIBLE_TESTS   := tests/integration/ansible
ANSIBLE_TARGETS := lock lock_info locked
INTEGRATION_ARGS ?=
# Three workers: most of an ansible-playbook test is waiting on its processes (294 tests, quiet: 9:33 with -n 3,
# 10:50 with -n 2). XDIST_ANSIBLE=$(XDIST) for two.
XDIST_ANSIBLE ?= $(if $(strip $(XDIST)),-n 3 --dist worksteal)

.PHONY: test-ansible integration-ansible demo-ansible bench-ansible openssh-server

# The SSH tests start their own sshd (own config, key and port on 127.0.0.1); they need the binary.
openssh-server:
	@if [[ ! -x /usr/sbin/sshd ]]; then \
	  echo "openssh-server: installing it (the SSH tests run their own sshd on 127.0.0.1)"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends openssh-server >/dev/null; \
	fi

# etcd-deps (mk/fleet.mk): the fleet tests (test_fleet_*.py) run a real etcd; without it they would skip.
test-ansible: venv openssh-server etcd-deps
	$(PYTEST) -q $(XDIST_ANSIBLE) $(ANSIBLE_TESTS) $(PYTEST_ARGS)
	@$(MAKE) --no-print-directory integration-ansible

# In .venv itself, as `make units` (mk/infra.mk): no venv built and pip-installed in each collection copy (14 s).
integration-ansible: venv
	@$(collection_copy); \
	echo "make integration-ansible: ansible-test integration $(ANSIBLE_TARGETS) in $$dest"; \
	$(ANSIBLE_TEST) integration --python $(ANSIBLE_TEST_PYTHON) --color no $(INTEGRATION_ARGS) $(ANSIBLE_TARGETS)

demo-ansible: venv
	@bash demo/ansible-demo.sh

bench-ansible: venv openssh-server
	$(PY) benchmarks/ansible_plugins.py $(BENCH_ARGS)

TEST_DEPS += openssh-server
TEST_TARGETS += test-ansible
DEMO_TARGETS += demo-ansible
