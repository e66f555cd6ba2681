"""Leases on a path (hostlock.lease.hold(path=...)): the detached holder keeps flock(1)'s own lock on the
file, so the real /usr/bin/flock waits for it and it waits for flock(1); renew and release reach it by path.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time

import pytest

import hostlock
from hostlock import lease as _lease

FLOCK = shutil.which("flock") or "/usr/bin/flock"
pytestmark = pytest.mark.skipif(not os.access(FLOCK, os.X_OK), reason="util-linux flock(1) not installed")


def _flock_n(path) -> int:
    return subprocess.run([FLOCK, "-n", str(path), "true"], check=False).returncode


def _wait(predicate, what: str, limit: float = 60.0) -> None:  # a hang guard only
    deadline = time.monotonic() + limit
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def test_path_lease_holds_flocks_lock_until_released(tmp_path):
    path = tmp_path / "with space.lock"  # the channel's name is derived from the path: spaces are fine
    token = _lease.hold("ignored", 30, path=str(path))
    try:
        assert path.exists() and path.read_bytes() == b""
        assert _flock_n(path) == 1, "flock -n got the file while the lease holds it"
        assert _lease.renew("ignored", token, 60, path=str(path)) > time.time() + 50
        with pytest.raises(hostlock.TokenError):  # another file's lease is not this one
            _lease.release("ignored", token, path=str(tmp_path / "other.lock"))
        assert _flock_n(path) == 1
    finally:
        _lease.release("ignored", token, path=str(path))
    assert _flock_n(path) == 0, "release() returned before the file was free"
    with pytest.raises(hostlock.TokenError, match="expired, was released") as e:
        _lease.release("ignored", token, path=str(path))
    assert e.value.reason == "gone" and str(path) in str(e.value)


def test_path_lease_waits_for_a_flock_job_and_times_out_naming_it(tmp_path):
    path, gate = tmp_path / "busy.lock", tmp_path / "gate"
    job = subprocess.Popen([FLOCK, str(path), "sh", "-c", f"while [ ! -e {gate} ]; do sleep 0.02; done"])
    try:
        _wait(lambda: _flock_n(path) == 1, "the flock(1) job to hold the file")
        with pytest.raises(hostlock.LockTimeout) as e:
            _lease.hold("ignored", 30, path=str(path), timeout=0.2)
        assert job.pid in [h.pid for h in e.value.holders], e.value.holders
        gate.touch()
        assert job.wait(timeout=60) == 0
        token = _lease.hold("ignored", 30, path=str(path), timeout=30)
        assert _flock_n(path) == 1
        _lease.release("ignored", token, path=str(path))
    finally:
        gate.touch()
        if job.poll() is None:
            job.kill()
            job.wait()


def test_path_lease_runs_out(tmp_path):
    path = tmp_path / "short.lock"
    _lease.hold("ignored", 0.5, path=str(path))
    _wait(lambda: _flock_n(path) == 0, "the lease to run out and free the file")


def test_path_lease_refuses_slots_and_a_fifo(tmp_path):
    with pytest.raises(ValueError, match="slots"):
        _lease.hold("ignored", 30, path=str(tmp_path / "x.lock"), slots=2)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(hostlock.HostlockError, match="FIFO"):
        _lease.hold("ignored", 30, path=str(fifo), timeout=1)
