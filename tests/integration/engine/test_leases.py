"""Leases: a detached holder keeps the lock until release, expiry, or death; only its token controls it."""

from __future__ import annotations

import os
import shutil
import signal
import time

import pytest

import hostlock

NOBODY = 65534


def _wait_free(name, d, timeout=120.0):  # a hang guard only: returns as soon as it is free
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not hostlock.holders(name, d):
            return True
        time.sleep(0.02)
    return False


def test_hold_release(mechdir):
    before = time.time()
    token = hostlock.hold("l", lease=30, directory=mechdir, label="ansible: play web")
    try:
        h = hostlock.holders("l", mechdir)[0]
        assert h.pid != os.getpid() and h.alive and h.label == "ansible: play web"
        assert h.token_id == token.split(".")[0] and token.split(".")[1] not in repr(h.as_dict())
        assert h.lease_expires and before + 29.999 <= h.lease_expires <= time.time() + 30.001
        with pytest.raises(hostlock.LockTimeout):
            hostlock.Lock("l", directory=mechdir).acquire(timeout=0)
    finally:
        hostlock.release("l", token, mechdir)
    assert hostlock.holders("l", mechdir) == []  # release() returns once the lock is free
    with pytest.raises(hostlock.TokenError, match="expired, was released") as e:
        hostlock.release("l", token, mechdir)
    assert e.value.reason == "gone"


def test_holder_detaches_fully(lockdir):
    token = hostlock.hold("d", lease=30, directory=lockdir)
    try:
        pid = hostlock.holders("d", lockdir)[0].pid
        assert os.getsid(pid) != os.getsid(0)  # left our session: no SIGHUP from our terminal or SSH
        fds = os.listdir("/proc/%d/fd" % pid)
        targets = [os.readlink("/proc/%d/fd/%s" % (pid, fd)) for fd in fds]
        # The lock directory itself: the holder's control socket lives there and is removed through it.
        assert all(t in ("/dev/null", lockdir) or t.endswith("d.lock") or t.startswith("socket:")
                   for t in targets), targets
    finally:
        hostlock.release("d", token, lockdir)


def test_renew_and_expiry(lockdir):
    """A renewal sets the lease's end from now, later or earlier, and the holder ends itself there.

    Started with a long lease so that no step races the clock on a busy machine: the renewal to 1.5 s is
    what ends the holder, which proves its own timer follows a renewal (that is what makes a later end real).
    """
    token = hostlock.hold("e", lease=600, directory=lockdir)
    later = hostlock.renew("e", token, lease=1200, directory=lockdir)
    assert later - time.time() > 600 and hostlock.holders("e", lockdir)[0].lease_expires == pytest.approx(later,
                                                                                                          abs=0.01)
    expiry = hostlock.renew("e", token, lease=1.5, directory=lockdir)
    assert expiry - time.time() <= 1.501  # expiry is kept to the millisecond
    assert hostlock.holders("e", lockdir)[0].lease_expires == pytest.approx(expiry, abs=0.01)
    assert _wait_free("e", lockdir)  # at 1.5 s, not at 1200
    with pytest.raises(hostlock.TokenError):
        hostlock.renew("e", token, directory=lockdir)


def test_wrong_and_malformed_tokens_are_refused(lockdir):
    token = hostlock.hold("w", lease=30, directory=lockdir)
    try:
        tid = token.split(".")[0]
        with pytest.raises(hostlock.TokenError, match="refused"):
            hostlock.release("w", tid + "." + "0" * 32, lockdir)
        with pytest.raises(hostlock.TokenError, match="refused"):
            hostlock.release("other", token, lockdir)  # a token belongs to one lock name
        with pytest.raises(hostlock.TokenError, match="malformed") as e:
            hostlock.release("w", "guess", lockdir)
        assert e.value.reason == "malformed"
        with pytest.raises(hostlock.TokenError) as e:
            hostlock.release("w", tid + "." + "1" * 32, lockdir)
        assert e.value.reason == "refused"
        assert hostlock.token_id(token) == tid == hostlock.holders("w", lockdir)[0].token_id
        assert hostlock.holders("w", lockdir)
    finally:
        hostlock.release("w", token, lockdir)


def test_killed_holder_frees_the_lock(mechdir):
    token = hostlock.hold("k", lease=60, directory=mechdir)
    pid = hostlock.holders("k", mechdir)[0].pid
    os.kill(pid, signal.SIGKILL)
    hostlock.Lock("k", directory=mechdir).acquire(timeout=3).release()
    with pytest.raises(hostlock.TokenError):
        hostlock.release("k", token, mechdir)


def test_hold_times_out_naming_the_holder(lockdir):
    held = hostlock.Lock("busy", directory=lockdir, label="the blocker").acquire()
    with pytest.raises(hostlock.LockTimeout, match="the blocker"):
        hostlock.hold("busy", lease=10, directory=lockdir, timeout=0.2)
    held.release()


def test_break_ends_an_expired_or_forced_lease(lockdir):
    token = hostlock.hold("b", lease=30, directory=lockdir)
    assert hostlock.break_lock("b", lockdir) == []  # live and within its lease: nothing stale
    acted = hostlock.break_lock("b", lockdir, force=True)
    assert len(acted) == 1
    assert _wait_free("b", lockdir)
    with pytest.raises(hostlock.TokenError):
        hostlock.release("b", token, lockdir)


def test_bad_lease(lockdir):
    for bad in (0, -1, float("inf"), float("nan"), 1e10, hostlock.MAX_DURATION * 2, "60"):
        with pytest.raises(hostlock.InvalidDuration):
            hostlock.hold("x", lease=bad, directory=lockdir)
    with pytest.raises(hostlock.InvalidDuration):
        hostlock.hold("x", lease=10, timeout=1e300, directory=lockdir)
    assert hostlock.holders("x", lockdir) == []  # refused before any holder started


def test_the_longest_lease_is_honoured_and_renew_past_it_is_refused(lockdir):
    token = hostlock.hold("long", lease=hostlock.MAX_DURATION, directory=lockdir)
    try:
        (h,) = hostlock.holders("long", lockdir)
        assert h.lease_expires > time.time() + hostlock.MAX_DURATION - 60
        for bad in (1e10, float("inf"), float("nan"), 0):
            with pytest.raises(hostlock.InvalidDuration):
                hostlock.renew("long", token, lease=bad, directory=lockdir)
        assert hostlock.renew("long", token, lease=hostlock.MAX_DURATION, directory=lockdir) > time.time()
        with pytest.raises(hostlock.LockTimeout):
            hostlock.Lock("long", directory=lockdir).acquire(timeout=0)
    finally:
        hostlock.release("long", token, lockdir)


def _until(predicate, what, limit=60.0):
    """Wait for an event (a safety net, not a timing assumption)."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.01)
    raise AssertionError("timed out waiting for %s" % what)


def _ended(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rpartition(")")[2].split()[0] in ("Z", "X")  # a zombie no init reaped yet
    except OSError:
        return True


def test_an_expired_in_flight_lease_waits_for_the_marked_work(lockdir, tmp_path):
    """A lease taken with in_flight that runs out keeps the lock while a process carrying its mark (and
    the children it starts) runs; a process with a forged mark (the public id, a wrong value) is ignored."""
    import subprocess
    import sys

    token = hostlock.hold("f", lease=30, directory=lockdir, in_flight=True)
    from hostlock.lease import in_flight_environment

    mark = in_flight_environment(token)
    ((key, value),) = mark.items()
    assert key.endswith(token.partition(".")[0]) and token.partition(".")[2] not in value
    gate = tmp_path / "gate"
    script = "import os,sys,time\nwhile not os.path.exists(sys.argv[1]): time.sleep(0.01)\n"
    # the marked work starts a child and exits at once: the child (which inherits the mark) is the work now
    work = subprocess.Popen(["sh", "-c", "%s -c \"$0\" \"$1\" & echo $!" % sys.executable, script, str(gate)],
                            env=dict(os.environ, **mark), stdout=subprocess.PIPE, text=True)
    child = int(work.stdout.readline())
    work.wait()
    forged = subprocess.Popen([sys.executable, "-c", script, str(gate)], env=dict(os.environ, **{key: "0" * 32}))
    try:
        hostlock.renew("f", token, lease=0.01, directory=lockdir)  # its owner stops renewing: it runs out
        holder = _until(lambda: [h for h in hostlock.holders("f", lockdir) if h.job_cmdline and "in-flight" in
                                 h.job_cmdline], "the holder to wait for the in-flight work")[0]
        assert holder.lease_expires is None and not holder.stale, holder.as_dict()  # not breakable as stale
        with pytest.raises(hostlock.LockTimeout):
            hostlock.Lock("f", directory=lockdir).acquire(timeout=0)
        assert os.path.exists("/proc/%d" % child)
        gate.touch()  # the marked child and the forged process end
        with hostlock.Lock("f", directory=lockdir):  # the next holder: only after the work ended
            assert _ended(child)
    finally:
        gate.touch()
        forged.wait()


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root and setpriv (another user)")
def test_another_users_copy_of_the_in_flight_mark_neither_keeps_the_lock_nor_counts(lockdir, tmp_path):
    """Only processes whose real and effective uid are the lease holder's are its in-flight work (issue 39 item 7):
    a user a block `become_user`s to can read the exact mark in its task's environment and start a process of
    their own with it; that process must not keep root's lock after the lease runs out, nor be counted as the
    lease's work. The holder's own uid's marked process still is both."""
    import subprocess

    from hostlock.lease import in_flight_environment, in_flight_pids

    token = hostlock.hold("u", lease=30, directory=lockdir, in_flight=True)
    env = dict(os.environ, **in_flight_environment(token))
    gate = tmp_path / "gate"
    # "ready" once the shell runs (as nobody, for the copy): both the shell and its exec'd sleep carry the mark.
    other = subprocess.Popen(["setpriv", "--reuid=%d" % NOBODY, "--regid=%d" % NOBODY, "--clear-groups",
                              "sh", "-c", "echo ready; exec sleep 300"], env=env, stdout=subprocess.PIPE, text=True)
    own = subprocess.Popen(["sh", "-c", "echo ready; while [ ! -e \"$0\" ]; do sleep 0.01; done", str(gate)],
                           env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert other.stdout.readline() == "ready\n" and own.stdout.readline() == "ready\n"
        with open("/proc/%d/status" % other.pid) as f:
            assert any(line.split()[1:3] == [str(NOBODY)] * 2 for line in f if line.startswith("Uid:"))
        found = in_flight_pids(token)
        assert own.pid in found and other.pid not in found, found
        hostlock.renew("u", token, lease=0.01, directory=lockdir)  # its owner stops renewing: it runs out
        _until(lambda: [h for h in hostlock.holders("u", lockdir) if h.job_cmdline and "in-flight" in h.job_cmdline],
               "the holder to wait for the in-flight work")
        with pytest.raises(hostlock.LockTimeout):
            hostlock.Lock("u", directory=lockdir).acquire(timeout=0)  # the holder's own uid's work keeps it
        gate.touch()
        own.wait()
        nxt = hostlock.Lock("u", directory=lockdir).acquire(timeout=60)  # free with nobody's copy still running
        try:
            assert other.poll() is None
        finally:
            nxt.release()
    finally:
        gate.touch()
        other.kill()
        other.wait()
        own.wait()


def test_a_released_in_flight_lease_frees_at_once(lockdir, tmp_path):
    """Released with its token (the run says its work is done), it does not wait for marked processes."""
    import subprocess
    import sys

    token = hostlock.hold("g", lease=30, directory=lockdir, in_flight=True)
    from hostlock.lease import in_flight_environment

    gate = tmp_path / "gate"
    marked = subprocess.Popen([sys.executable, "-c", "import os,sys,time\nwhile not os.path.exists(sys.argv[1]): "
                               "time.sleep(0.01)\n", str(gate)], env=dict(os.environ, **in_flight_environment(token)))
    try:
        hostlock.release("g", token, lockdir)
        assert hostlock.holders("g", lockdir) == []
        assert marked.poll() is None
    finally:
        gate.touch()
        marked.wait()
