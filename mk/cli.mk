# The `hostlock` command line (plugins/module_utils/hostlock/cli/; manual in docs/cli.md).
#
#   make test-cli    integration tests: real processes, real signals, a pty, every Python 3.8-3.13 found, a real
#                    etcd for --fleet (installed by etcd-deps, mk/fleet.mk, when missing), a real node_exporter and
#                    promtool for --metrics-dir and status --format openmetrics (metrics-deps), a private
#                    systemd-journald for --history (the machine's systemd package) (~30 s)
#   make bench-cli   `hostlock run NAME true` vs flock(1) vs the bare interpreter (benchmarks/cli.py)
#   make bench-cli-metrics  `hostlock cron ... true` with and without --metrics-dir, and main's (benchmarks/cli_metrics.py)
#
# The in-process unit tests (tests/unit/cli) are part of test-unit, which is in both TEST_TARGETS and
# QUICK_TARGETS already; test-cli-unit runs them alone.

.PHONY: test-cli test-cli-unit bench-cli bench-cli-metrics metrics-deps

# node_exporter reads the metrics directory in the tests, promtool lints what it serves (Debian's
# prometheus-node-exporter and prometheus: promtool comes with the server); neither service is left enabled.
metrics-deps:
	@if ! command -v prometheus-node-exporter >/dev/null || ! command -v promtool >/dev/null; then \
	  echo "make: installing prometheus-node-exporter and prometheus (for promtool) (apt-get)"; \
	  apt_get() { DEBIAN_FRONTEND=noninteractive apt-get -qq -o DPkg::Lock::Timeout=300 "$$@"; }; \
	  pkgs="prometheus-node-exporter prometheus"; \
	  apt_get install -y --no-install-recommends $$pkgs >/dev/null 2>&1 || { apt_get update && apt_get install -y --no-install-recommends $$pkgs >/dev/null; }; \
	  systemctl disable --now prometheus prometheus-node-exporter >/dev/null 2>&1 || systemctl disable prometheus prometheus-node-exporter >/dev/null 2>&1 || true; \
	fi

test-cli: venv etcd-deps metrics-deps
	$(PYTEST) -q $(XDIST_WAITING) tests/integration/cli $(PYTEST_ARGS)

test-cli-unit: venv
	$(PYTEST) -q tests/unit/cli $(PYTEST_ARGS)

BENCH_CLI_ARGS ?=
bench-cli: venv
	$(PY) benchmarks/cli.py --docs docs/benchmarks.md $(BENCH_CLI_ARGS)

BENCH_CLI_METRICS_ARGS ?=
bench-cli-metrics: venv
	$(PY) benchmarks/cli_metrics.py --docs docs/benchmarks.md $(BENCH_CLI_METRICS_ARGS)

TEST_DEPS += metrics-deps
TEST_TARGETS += test-cli
