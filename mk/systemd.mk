# The systemd role against a real systemd.
#
#   make test-systemd   tests/integration/systemd: systemd 252 booted as PID 1 of its own namespaces on an overlay
#                       of / (tests/systemd_harness.py, ~1 s), the role run into it through a test-only nsenter
#                       connection, timers firing, jobs on one lock never overlapping, the journal, teardown
#                       (one boot and one role run per module; serial: the tests of a module share that boot)
#
# The role's Molecule scenario (roles/systemd/molecule) boots the same way and is part of test-roles (mk/roles.mk).

.PHONY: test-systemd

test-systemd: venv
	$(PYTEST) -q tests/integration/systemd $(PYTEST_ARGS)

TEST_TARGETS += test-systemd
