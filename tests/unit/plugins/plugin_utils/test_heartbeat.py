"""A heartbeat whose lease ended while its run lives stays to tell the release so (plugin_utils/_heartbeat.py).

Real processes: the heartbeat is started as the lock action starts it (detached, its own session), renewing
through a function that answers as the host would; the "run" is a child process of this test.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from ansible_collections.hostlock.core.plugins.plugin_utils import _heartbeat

TOKEN = "0123456789ab." + "5" * 32 + ".0"


def _gone_for(pid: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.01)
    raise AssertionError(f"process {pid} did not end")


@pytest.fixture
def run():
    """A stand-in for the ansible-playbook run: lives until the test ends it."""
    proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    yield proc
    proc.stdin.close()
    proc.wait()


def _start(renew, run, token: str = TOKEN) -> int:
    return _heartbeat.start(renew, token, 0.2, run.pid)


def test_a_lease_the_host_says_is_gone_makes_the_release_hear_lost(run, tmp_path):
    asked = tmp_path / "asked"

    def renew(_seconds: float) -> str:  # runs in the heartbeat: the host says the lease is gone
        asked.write_text("1")
        return _heartbeat.GONE

    pid = _start(renew, run)
    deadline = time.monotonic() + 30
    while not asked.exists():  # the heartbeat's first renewal has been answered (a quarter lease in)
        assert time.monotonic() < deadline, "the heartbeat never renewed"
        time.sleep(0.01)
    # it no longer renews, but stays until asked: the release learns the lease was lost
    assert _heartbeat.stop(TOKEN) == _heartbeat.LOST
    _gone_for(pid)
    assert _heartbeat.stop(TOKEN) == _heartbeat.NONE


def test_a_renewing_heartbeat_is_stopped(run):
    pid = _start(lambda _s: _heartbeat.OK, run)
    assert _heartbeat.stop(TOKEN) == _heartbeat.STOPPED
    _gone_for(pid)


def test_a_lost_heartbeat_ends_with_its_run(run, tmp_path):
    asked = tmp_path / "asked"

    def renew(seconds: float) -> str:
        asked.write_text(str(seconds))
        return _heartbeat.GONE

    pid = _start(renew, run)
    deadline = time.monotonic() + 30
    while not asked.exists():
        assert time.monotonic() < deadline, "the heartbeat never renewed"
        time.sleep(0.01)
    run.stdin.close()
    run.wait()
    _gone_for(pid)  # nobody will ask: it does not stay behind its run
