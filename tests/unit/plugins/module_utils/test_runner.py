"""Unit tests for plugins/module_utils/_runner.py: the host-side runner of hostlock.core.locked.

Real processes and real locks in a temporary directory; the "payload" is a small Python script read on
stdin, as AnsiballZ is read under pipelining.
"""

from __future__ import annotations

import atexit
import os
import signal
import sys
import tempfile
import threading
import time

import pytest
from ansible_collections.hostlock.core.plugins.module_utils._runner import (
    SelfWait,
    acquire,
    detach,
    own_holders,
    parse_result,
    run_locked,
    run_payload,
)
from ansible_collections.hostlock.core.plugins.module_utils.hostlock import Lock, LockTimeout, holders


@pytest.fixture
def lockdir():
    with tempfile.TemporaryDirectory() as d:
        os.chmod(d, 0o700)
        yield d


def test_payload_result_is_the_modules_json():
    result, pid = run_payload(b"import json; print('noise'); print(json.dumps({'changed': True, 'x': 1}))")
    assert result == {"changed": True, "x": 1} and pid > 0


def test_payload_without_json_is_a_module_failure():
    result, _pid = run_payload(b"import sys; sys.stderr.write('boom'); sys.exit(3)")
    assert result["failed"] and result["rc"] == 3 and result["module_stderr"] == "boom", result
    assert parse_result(b"{not json}", b"", 0)["failed"]


def test_forked_payload_runs_its_exit_handlers_and_not_the_runners(tmp_path):
    """A forked payload exits as its interpreter would: what it registered with atexit runs (AnsibleModule
    removes its tmpdir that way); what the runner registered does not (it is the runner's, run at its exit)."""
    theirs, ours = tmp_path / "payload-handler", tmp_path / "runner-handler"

    def runner_handler() -> None:
        ours.write_text("ran")

    atexit.register(runner_handler)
    try:
        payload = (
            "# an AnsiballZ-shaped payload (_ansiballz_main), so the runner forks it\n"
            "import atexit, json, os, pathlib\n"
            f"atexit.register(pathlib.Path({str(theirs)!r}).write_text, 'ran')\n"
            "os.write(1, json.dumps({'ok': True}).encode())\n"  # fd 1: pytest replaces sys.stdout"
        ).encode()
        result, pid = run_payload(payload)
    finally:
        atexit.unregister(runner_handler)
    assert result == {"ok": True} and pid != os.getpid(), result
    assert theirs.read_text() == "ran", "the payload's exit handler did not run"
    assert not ours.exists(), "the runner's exit handler ran in the forked child"


def test_lock_is_held_while_the_payload_runs_and_released_after(lockdir):
    gate_r, gate_w = os.pipe()
    seen = {}
    lock = Lock("runner", directory=lockdir)

    def watch():
        os.read(gate_r, 1)  # the payload runs now
        seen["during"] = [h for h in holders("runner", directory=lockdir) if not h.stale]
        os.close(gate_w_child)

    ready_r, ready_w = os.pipe()
    gate_w_child = ready_w
    os.set_inheritable(gate_w, True)
    os.set_inheritable(ready_r, True)
    payload = (
        f"import os, json; os.write({gate_w}, b'x'); os.read({ready_r}, 1); print(json.dumps({{'ok': 1}}))"
    ).encode()
    t = threading.Thread(target=watch)
    t.start()
    # the child must see our pipe ends: run_payload closes other descriptors, so pass them explicitly
    import subprocess

    real_popen = subprocess.Popen

    def popen(*a, **kw):
        kw["pass_fds"] = (gate_w, ready_r)
        return real_popen(*a, **kw)

    subprocess.Popen = popen
    try:
        result = run_locked(lock, payload, timeout=5)
    finally:
        subprocess.Popen = real_popen
    t.join(10)
    assert result["ok"] == 1 and result["hostlock"]["released"] is True, result
    assert [h.pid for h in seen["during"]] == [os.getpid()], seen
    assert not [h for h in holders("runner", directory=lockdir) if not h.stale]


def test_own_run_holder_fails_at_once(lockdir):
    marker = "[run abc123]"
    assert own_holders([dict(label=f"x {marker}", stale=False)], marker)
    assert not own_holders([dict(label=f"x {marker}", stale=True)], marker), "a dead holder is nobody's"
    assert not own_holders([dict(label="x [run other]", stale=False)], marker)
    other = Lock("selfwait", directory=lockdir, label=f"lease {marker}").acquire()
    try:
        lock = Lock("selfwait", directory=lockdir)
        with pytest.raises(SelfWait):
            acquire(
                lock,
                None,
                lambda: [h.as_dict() for h in holders("selfwait", directory=lockdir)],
                marker,
                watch_controller=False,
            )
        with pytest.raises(LockTimeout):
            acquire(lock, 0.2, lambda: [], marker, watch_controller=False)
    finally:
        other.release()


# Every signal that would end the runner (hostlock.core.signals), a real-time one too.
@pytest.mark.parametrize("sig, name", [(signal.SIGTERM, "SIGTERM"), (signal.SIGUSR1, "SIGUSR1"),
                                       (signal.SIGRTMIN + 1, "SIGRTMIN+1")])
def test_signals_are_forwarded_and_the_work_is_waited_for(sig, name):
    """A signal to the runner reaches the payload, which ends; the result says the task was interrupted. Sent
    by another process (`kill`, which the payload starts once its handler is set): one the payload sent the
    runner itself is not sent back (hostlock.proc.forward, as `hostlock run` does)."""
    payload = (
        b"import json, os, signal, subprocess, time, sys\n"
        b"def done(*a):\n    print(json.dumps({'got': a[0]})); sys.exit(0)\n"
        b"signal.signal(%d, done)\n"
        b"subprocess.run(['kill', '-%d', str(os.getppid())])\n"
        b"time.sleep(60)\n" % (sig, sig)
    )
    result, _pid = run_payload(payload)
    assert result["got"] == sig and result["failed"] and name in result["msg"], result
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL or signal.getsignal(signal.SIGTERM) is not None


@pytest.mark.parametrize("forked", [True, False], ids=["forked", "fresh-interpreter"])
def test_the_work_runs_in_a_session_of_its_own(forked):
    """The wrapped module leads a new session: a hangup of the runner's terminal (ssh -tt) or a signal to
    the runner's process group (ansible-core's workers, Ctrl-C) cannot reach it; only the runner forwards."""
    payload = (
        b"import json, os\n"
        b"os.write(1, json.dumps({'sid': os.getsid(0), 'pid': os.getpid(), 'pgid': os.getpgid(0)}).encode())\n"
    )
    if forked:
        payload += b"# _ansiballz_main\n"  # the runner forks payloads of AnsiballZ's shape
    result, pid = run_payload(payload)
    assert result["sid"] == result["pid"] == result["pgid"] == pid, result
    assert os.getsid(0) != pid


def test_detach_leaves_the_session_of_its_caller():
    """The runner itself leaves the session and process group it was started in (once; idempotent)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # a module process: in its parent's session and group, not leading either
        code = 1
        try:
            os.close(r)
            before = (os.getsid(0), os.getpgid(0))
            ok = detach() and detach()
            os.write(w, f"{ok} {before[0]} {before[1]} {os.getsid(0)} {os.getpgid(0)} {os.getpid()}".encode())
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    words = os.read(r, 200).decode().split()
    os.close(r)
    os.waitpid(pid, 0)
    ok, sid_before, pgid_before, sid, pgid, child = words[0], *map(int, words[1:])
    assert ok == "True" and sid_before == os.getsid(0) and pgid_before == os.getpgid(0), words
    assert sid == pgid == child, words


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux only")
def test_payload_dies_with_a_killed_runner():
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the runner
        os.close(r)
        payload = f"import os, time; os.write({w}, str(os.getpid()).encode()); time.sleep(60)".encode()
        import subprocess

        real_popen = subprocess.Popen
        subprocess.Popen = lambda *a, **kw: real_popen(*a, **dict(kw, pass_fds=(w,)))
        run_payload(payload)
        os._exit(0)
    os.close(w)
    child = int(os.read(r, 32))
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    # the payload's write end closes only when it is dying (it sleeps otherwise): read() returns EOF then
    assert os.read(r, 1) == b""
    # The kernel closes a dying process's descriptors before it turns into a zombie, so the state may
    # still read R for a moment after EOF: wait for the exit to complete (a safety net, not a timing).
    deadline = time.monotonic() + 60
    while True:
        try:
            with open(f"/proc/{child}/stat") as f:
                state = f.read().rpartition(")")[2].split()[0]
        except OSError:
            state = "gone"
        if state in ("gone", "Z", "X") or time.monotonic() > deadline:
            break
        time.sleep(0.01)
    assert state in ("gone", "Z", "X"), f"the payload outlived its runner (state {state})"


END_NOW = r"""
import atexit, os, sys
sys.path.insert(0, sys.argv[1])
from ansible_collections.hostlock.core.plugins.module_utils._runner import emit_result
atexit.register(lambda: open(sys.argv[3], "w").write("ran"))  # AnsibleModule's tmpdir clean-up, a coverage saver
sys.stdout.write("module noise\n")
emit_result({"changed": False, "x": 1}, sys.argv[2] or None)
"""


def _emit(tmp_path, modlib: str) -> tuple[str, str]:
    import subprocess

    from ansible_collections.hostlock.core.plugins.module_utils import _runner

    collections = os.path.abspath(_runner.__file__).rsplit(os.sep + "ansible_collections" + os.sep, 1)[0]
    done = subprocess.run([sys.executable, "-c", END_NOW, collections, modlib, str(tmp_path / "handler")],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done
    return done.stdout, (tmp_path / "handler").read_text()


@pytest.mark.parametrize("layout", ["ansiballz", "other", "none"])
def test_the_result_ends_the_runner_with_its_exit_handlers_run_and_the_payload_directory_gone(tmp_path, layout):
    """emit_result skips the interpreter's teardown only where it can do the AnsiballZ wrapper's clean-up itself
    (its payload directory, as ansible-core 2.19+ lays it out); elsewhere the usual exit. Either way the result
    is on stdout whole and every exit handler ran."""
    where = tmp_path / ("ansible_ns.coll.mod_payload_x1y2" if layout == "ansiballz" else "elsewhere")
    where.mkdir()
    modlib = where / "ansible_ns.coll.mod_payload.zip"
    modlib.write_bytes(b"PK")
    out, handler = _emit(tmp_path, "" if layout == "none" else str(modlib))
    assert out.splitlines()[-1] == '{"changed": false, "x": 1}' and handler == "ran", out
    # removed only when it is the wrapper's own directory, left alone otherwise (the wrapper removes it then)
    assert where.exists() is (layout != "ansiballz")
