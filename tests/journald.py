"""A real systemd-journald of a test's own: started alone in new PID and mount namespaces (unshare), with a
private /run (its socket, /run/log/journal) and /var/log/journal, so nothing of the machine's is read or written
(../shared/SYSTEMD.md, "systemd-journald alone": never outside a PID namespace, where it would turn on kernel
auditing machine-wide). Commands run inside with nsenter: they see its socket at the usual path, their pids are
the namespace's (as journald's `_PID` says them), and `journalctl` reads its journal.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

JOURNALD = "/lib/systemd/systemd-journald"

_SCRIPT = r"""
set -e
mount --make-rprivate /
mount -t tmpfs -o mode=0755 tmpfs /run
mkdir -p /run/systemd/journal /run/log/journal
if [ -d /var/log/journal ]; then mount -t tmpfs -o mode=2755 tmpfs /var/log/journal; fi
%s &
wait
"""


def have_journald() -> bool:
    return os.geteuid() == 0 and os.access(JOURNALD, os.X_OK) and all(
        shutil.which(t) for t in ("unshare", "nsenter", "journalctl"))


class Journald:
    """The namespaces' journald; run() runs a command inside them."""

    def __init__(self, log: Path) -> None:
        self.proc = subprocess.Popen(["unshare", "--pid", "--fork", "--mount", "--mount-proc", "--kill-child",
                                      "sh", "-c", _SCRIPT % JOURNALD],
                                     stdin=subprocess.DEVNULL, stdout=open(log, "w"), stderr=subprocess.STDOUT)
        try:
            self.init = self._wait(self._child, "the namespaces' first process")
            socket = "/proc/%d/root/run/systemd/journal/socket" % self.init
            self._wait(lambda: os.path.exists(socket) or None, "journald's socket")
        except BaseException:
            self.stop()
            raise

    def _child(self) -> int | None:
        try:
            with open("/proc/%d/task/%d/children" % (self.proc.pid, self.proc.pid)) as f:
                kids = f.read().split()
        except OSError:
            return None
        return int(kids[0]) if kids else None

    def _wait(self, probe, what: str, timeout: float = 20.0):
        deadline = time.monotonic() + timeout
        while True:
            got = probe()
            if got:
                return got
            if self.proc.poll() is not None:
                raise AssertionError("journald's namespace ended (exit %s) before %s" % (self.proc.returncode, what))
            if time.monotonic() > deadline:
                raise AssertionError("timed out waiting for %s" % what)
            time.sleep(0.02)

    def argv(self, argv: list[str]) -> list[str]:
        """`argv` to run inside the namespaces (their mounts and pids), from the current directory."""
        return ["nsenter", "-t", str(self.init), "-m", "-p", "--wd=" + os.getcwd(), "--", *argv]

    def run(self, argv: list[str], **kw) -> subprocess.CompletedProcess:
        kw.setdefault("capture_output", True)
        kw.setdefault("text", True)
        kw.setdefault("timeout", 60)
        return subprocess.run(self.argv(argv), check=False, **kw)

    def stop(self) -> None:
        if self.proc.poll() is None:
            # unshare --fork waits out SIGTERM; SIGKILL it, and --kill-child (its child's parent-death signal,
            # SIGKILL) ends the namespaces' first process, with which the kernel ends every process in them.
            self.proc.kill()
        self.proc.wait()
