"""tests/systemd_harness.py: a booted systemd is really PID 1 of its own namespaces, its units run and log to its
journal, and halting it leaves nothing behind (no process of its namespaces, no cgroup, no zombie), in-process and
across processes (Molecule's create and destroy)."""

from __future__ import annotations

import os
import subprocess
import sys

from systemd_harness import CGROUP2, SYSTEMD
from systemd_support import ROOT, boot, needs_systemd

pytestmark = needs_systemd


def _in_namespace(ns: str) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.readlink("/proc/%s/ns/pid" % entry) == ns:
                    pids.append(int(entry))
            except OSError:
                pass
    return pids


def test_boot_run_a_unit_read_its_journal_and_halt_cleanly(tmp_path):
    sd = boot(tmp_path / "sd")
    try:
        ns = os.readlink("/proc/%d/ns/pid" % sd.pid)
        assert ns != os.readlink("/proc/self/ns/pid")
        assert sd.run("cat", "/proc/1/comm").stdout == "systemd\n"
        assert sd.run("systemctl", "is-system-running").stdout.strip() in ("running", "degraded")
        # A unit that leaves a child behind: the halt must take it down too.
        sd.put("/etc/systemd/system/child.service",
               "[Service]\nType=forking\nExecStart=/bin/sh -c 'echo child-started; sleep 600 &'\n")
        sd.run("systemctl", "daemon-reload")
        sd.run("systemctl", "start", "child.service")
        assert "child-started" in [e["MESSAGE"] for e in sd.journal("-u", "child.service")]
        assert not sd.exists("/etc/systemd/system/child.service.d")  # (and nothing of it on this machine:)
        assert not os.path.exists("/etc/systemd/system/child.service")
        assert len(_in_namespace(ns)) >= 3
        unshare = sd.proc
    finally:
        sd.stop()
    assert unshare is not None and unshare.returncode is not None  # waited for: no zombie
    assert _in_namespace(ns) == []
    assert not os.path.exists(os.path.join(CGROUP2, sd.name))
    sd.stop()  # twice is harmless


def test_start_and_stop_across_processes(tmp_path):
    work = tmp_path / "target"
    harness = str(ROOT / "tests" / "systemd_harness.py")
    started = subprocess.run([sys.executable, "-I", harness, "start", str(work)], capture_output=True, text=True,
                             check=False, timeout=120)
    assert started.returncode == 0, started.stderr
    pid = int(started.stdout)
    keeper = int((work / "keeper").read_text())
    name = (work / "name").read_text()
    assert os.path.realpath("/proc/%d/exe" % pid) == os.path.realpath(SYSTEMD)
    stopped = subprocess.run([sys.executable, "-I", harness, "stop", str(work)], capture_output=True, text=True,
                             check=False, timeout=120)
    assert stopped.returncode == 0, stopped.stderr
    assert not os.path.exists("/proc/%d" % pid)
    assert not os.path.exists(os.path.join(CGROUP2, name))
    assert not work.exists()
    # The keeper has exited (a zombie until this machine's init reaps it, which is not ours to wait for).
    try:
        with open("/proc/%d/stat" % keeper) as f:
            assert f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        pass
