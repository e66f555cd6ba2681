"""The hang guard for every pytest suite of this checkout: a test still running after --hang-guard seconds
(600 by default; 0: none) prints every thread's stack and ends its process with status 1, instead of eating
CI's 90 minutes. Under xdist the run goes on and names the test whose worker ended ("worker 'gw0' crashed
while running ..."); without it the stacks name the test's frame.

The standard library's faulthandler.dump_traceback_later(exit=True), not pytest-timeout: its watchdog is a C
thread that blocks every signal, so a test of code that blocks signals and collects them with sigtimedwait()
(the command's supervisor, in tests/unit/cli) never has a SIGCHLD or SIGTERM taken by the guard's thread, as a
Python timer thread (pytest-timeout's thread method) would; and SIGALRM (its signal method) is the engine's own.
The stacks go to the stderr pytest had before it captured anything (under xdist: the worker's, which is the
run's), so they are seen. Teardown does not run after a hang: servers a session fixture started (etcd, sshd)
are left to whoever cleans the machine.
"""

from __future__ import annotations

import faulthandler
import os

import pytest

DEFAULT = 600.0  # far above the slowest test on a loaded 2-core machine (a few minutes): only a hang meets it
_FD: list = []  # a copy of pytest's own stderr, taken before any test is captured


def pytest_addoption(parser):
    parser.addoption("--hang-guard", type=float, default=DEFAULT, metavar="SECONDS",
                     help="end a test's process with every thread's stack after SECONDS (default %(default)s; 0: off)")


def pytest_configure(config):
    if config.getoption("hang_guard") > 0 and not _FD:
        _FD.append(os.dup(2))  # global capture is suspended while plugins are configured: this is the real stderr


def pytest_unconfigure(config):
    while _FD:
        os.close(_FD.pop())


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    seconds = item.config.getoption("hang_guard")
    if item.config.pluginmanager.hasplugin("ansible_forked"):
        # ansible-test units runs each test in a fork of this process: a watchdog armed here does not exist in the
        # child, whose faulthandler would wait for it forever on the test's first failure (the child's report then
        # never comes). There the guard is off.
        seconds = 0
    if seconds > 0 and _FD:
        faulthandler.dump_traceback_later(seconds, exit=True, file=_FD[0])
    try:
        yield
    finally:
        if seconds > 0:
            faulthandler.cancel_dump_traceback_later()
