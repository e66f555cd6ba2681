# The `hostlock` command line (plugins/module_utils/hostlock/cli/; manual in docs/cli.md).
#
#   make test-cli    integration tests: real processes, real signals, a pty, every Python 3.8-3.13 found, a real
#                    etcd for --fleet (installed by etcd-deps, mk/fleet.mk, when missing) (~30 s)
#   make bench-cli   `hostlock run NAME true` vs flock(1) vs the bare interpreter (benchmarks/cli.py)
#
# The in-process unit tests (tests/unit/cli) are part of test-unit, which is in both TEST_TARGETS and
# QUICK_TARGETS already; test-cli-unit runs them alone.

.PHONY: test-cli test-cli-unit bench-cli

test-cli: venv etcd-deps
	$(PYTEST) -q $(XDIST) tests/integration/cli $(PYTEST_ARGS)

test-cli-unit: venv
	$(PYTEST) -q tests/unit/cli $(PYTEST_ARGS)

BENCH_CLI_ARGS ?=
bench-cli: venv
	$(PY) benchmarks/cli.py --docs docs/benchmarks.md $(BENCH_CLI_ARGS)

TEST_TARGETS += test-cli
