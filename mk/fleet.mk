# Fleet locks on etcd (plugins/module_utils/hostlock/fleet/; docs/fleet.md).
#
#   make test-fleet    real etcd: one member and a 3-member cluster on 127.0.0.1, partitions by proxy
#   make bench-fleet   benchmarks/fleet.py against etcdctl lock and a plain etcd txn loop (not in make test)
#   make demo-fleet    two "controllers" (own lock directories, one fleet URL) sharing a lock on a throwaway etcd
#
# The etcd binaries come from Debian (etcd-server, etcd-client); installed here when missing.

.PHONY: etcd-deps test-fleet bench-fleet

etcd-deps:
	@if ! command -v etcd >/dev/null || ! command -v etcdctl >/dev/null; then \
	  echo "make: installing etcd-server and etcd-client (apt-get)"; \
	  apt_get() { DEBIAN_FRONTEND=noninteractive apt-get -qq -o DPkg::Lock::Timeout=300 "$$@"; }; \
	  apt_get install -y etcd-server etcd-client >/dev/null 2>&1 || { apt_get update && apt_get install -y etcd-server etcd-client >/dev/null; }; \
	  systemctl disable --now etcd >/dev/null 2>&1 || true; \
	fi

test-fleet: venv etcd-deps
	$(PYTEST) -q $(XDIST_WAITING) tests/integration/fleet $(PYTEST_ARGS)

# Anchors and hostlock rows in one run, single member and 3-member cluster; BENCH_FLEET_ARGS=--quick for a smoke run.
# The command is timed on the venv's interpreter and on the distribution's python3 (what the cli role installs
# with on a Debian host), each judged against the 1.0x target.
BENCH_FLEET_ARGS ?= $(if $(wildcard /usr/bin/python3),--also-python /usr/bin/python3)
bench-fleet: venv etcd-deps
	$(PY) benchmarks/fleet.py --docs docs/benchmarks.md $(BENCH_FLEET_ARGS)

TEST_DEPS += etcd-deps
TEST_TARGETS += test-fleet

.PHONY: demo-fleet
demo-fleet: venv etcd-deps
	@bash demo/fleet-demo.sh

DEMO_TARGETS += demo-fleet
