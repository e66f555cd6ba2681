"""Issue 22 item 4: any local user on the control node could make every `heartbeat: true` lock task fail.

The lease holder's id shows in world-readable /proc/net/unix as soon as it binds its socket, and the
heartbeat then bound `@hostlock-heartbeat/ID`: a loop binding each new id first gave "cannot start the
lease's heartbeat ... Address already in use; the lease was released". The heartbeat's name now carries
a proof only the token's owner can compute. Real ansible-playbook runs, a real attacker (uid 65534)
binding every name it can learn, as fast as it can see them.
"""

from __future__ import annotations

import os
import signal
import subprocess
import textwrap
from pathlib import Path

import pytest
from harness import wait_for as _wait_for
from test_lock_block import _events, _heartbeats, _live, _start

PYTHON = "/usr/bin/python3"
NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not os.path.exists(PYTHON),
                                reason="needs root (to run the attacker as uid 65534) and %s" % PYTHON)

# Every id any hostlock socket reveals (lease files, abstract lease names, heartbeats) is bound at once under
# each name a hostlock process could want: the heartbeat's old name and the lease's abstract fallback.
SQUAT = textwrap.dedent(r"""
    import re, socket, sys, time
    log = open(sys.argv[1], "a", buffering=1)
    seen, keep = set(), []
    pattern = re.compile(r"(?:hostlock-lease/|/\.lease-|hostlock-heartbeat/)([0-9a-f]{12})")
    print("READY", flush=True)
    while True:
        for tid in pattern.findall(open("/proc/net/unix").read()):
            if tid in seen:
                continue
            seen.add(tid)
            for name in ("hostlock-heartbeat/" + tid, "hostlock-lease/" + tid):
                s = socket.socket(socket.AF_UNIX)
                try:
                    s.bind("\0" + name)
                    s.listen(8)
                    keep.append(s)
                    log.write("BOUND %s\n" % name)
                except OSError as e:
                    log.write("TAKEN %s %s\n" % (name, e.strerror))
        time.sleep(0.001)
""")


@pytest.mark.parametrize("target", ["loc", "ssh1"])
def test_a_user_binding_every_learnable_name_cannot_fail_a_heartbeat_task(ansible, engine, tmp_path, target):
    lock, events, gate = f"squat-{target}", tmp_path / "events", tmp_path / "gate"
    log = Path("/tmp") / f"hostlock-squat-{os.getpid()}-{target}.log"
    log.touch()
    os.chown(log, 65534, 65534)
    attacker = subprocess.Popen(NOBODY + [PYTHON, "-I", "-c", SQUAT, str(log)], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
    proc = None
    try:
        assert attacker.stdout.readline().strip() == "READY", attacker.stderr.read()
        proc = _start(ansible, "lock_block.yml", target, lock, events, gate, lease=20)
        _wait_for(lambda: "in" in _events(events), "the included work to start", proc=proc)
        (holder,) = _live(engine, ansible, lock)
        tid, first_expiry = holder.token_id, holder.lease_expires
        # The attacker saw the lease's id and holds the heartbeat's old name: the real heartbeat runs anyway.
        _wait_for(lambda: f"BOUND hostlock-heartbeat/{tid}" in log.read_text(), "the attacker to bind the old name")
        assert tid in _heartbeats(), "no heartbeat on the control node"
        _wait_for(lambda: (_live(engine, ansible, lock) or [holder])[0].lease_expires > first_expiry,
                  "the heartbeat to renew the lease", proc=proc)
        gate.touch()
        out, _err = proc.communicate(timeout=180)
        assert proc.returncode == 0, out
        assert "cannot start the lease's heartbeat" not in out
        assert not _live(engine, ansible, lock), "the release left the lock held"
        assert list(_events(events)) == ["first", "in", "out"], events.read_text()
    finally:
        gate.touch()
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        attacker.kill()
        attacker.wait()
        log.unlink()
