"""A real systemd for tests: systemd 252 booted as PID 1 of fresh mount, PID, cgroup, UTS, IPC and network
namespaces, on an overlay of `/` whose writes land in a tmpfs (docs: /work/shared/SYSTEMD.md's recipe, which
this follows). Boot to `running` takes about half a second; the machine's /etc, /run and cgroups stay as they were.

    with Systemd(workdir) as sd:            # boots; halts and cleans up on exit
        sd.put("/etc/systemd/system/x.service", text)
        sd.run("systemctl", "daemon-reload")
        sd.wait_until(lambda: sd.show("x.service", "ActiveState") == "inactive", "x to finish")
        sd.journal("x.service")             # journalctl -u x.service -o json, parsed

`python tests/systemd_harness.py start|stop WORKDIR` does the same across processes (Molecule's create and
destroy): `start` leaves a keeper process holding the namespaces, prints the PID 1 to reach them with
`nsenter -t PID -a` (or the test-only `nsenter` connection plugin, tests/integration/systemd/connection_plugins).

Readiness and every wait are events (PID 1's exe, `systemctl is-system-running`, unit properties), polled under a
deadline that only bounds a hang. Halting waits on the unshare process it started (no zombie) and removes the
cgroups it made, deepest first.
"""

from __future__ import annotations

import json
import os
import pty
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

# The cgroup2 hierarchy: a hybrid host's (cgroup v1 with a cgroup2 beside it, as here) or a pure v2 host's.
CGROUP2 = "/sys/fs/cgroup/unified" if os.path.isdir("/sys/fs/cgroup/unified") else "/sys/fs/cgroup"
SYSTEMD = "/lib/systemd/systemd"
BOOT_TIMEOUT = 60.0  # a busy 2-core machine boots in seconds; this bounds a hang only
INNER_PATH = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# Capabilities systemd inside must not have (SYSTEMD.md): module loading, the clock, raw I/O, the kernel log, ...
DROP_CAPS = "-sys_module,-sys_time,-sys_rawio,-syslog,-wake_alarm,-block_suspend,-mac_admin,-mac_override"

# PID 1 of the new namespaces until it execs systemd: an overlay root with fresh /proc, /sys, cgroup2, /dev,
# /run and /tmp, then pivot_root. $1 is the work directory, $2 the pty to bind as /dev/console.
BOOT = r"""
set -eu
work=$1 console=$2
mount --make-rprivate /
mount -t tmpfs -o mode=0700 hostlock-systemd-layer "$work/layer"
mkdir "$work/layer/upper" "$work/layer/work"
r=$work/root
mount -t overlay hostlock-systemd-root -o "lowerdir=/,upperdir=$work/layer/upper,workdir=$work/layer/work" "$r"
mount -t proc proc "$r/proc"
mount --bind "$r/proc/sys" "$r/proc/sys"
mount -o remount,bind,ro "$r/proc/sys"
mount -t sysfs -o ro sysfs "$r/sys"
mount -t cgroup2 cgroup2 "$r/sys/fs/cgroup"
mount -t tmpfs -o mode=0755,nosuid hostlock-systemd-dev "$r/dev"
for n in null zero full random urandom tty; do
    touch "$r/dev/$n"
    mount --bind "/dev/$n" "$r/dev/$n"
done
mkdir "$r/dev/pts" "$r/dev/shm"
mount -t devpts -o newinstance,ptmxmode=0666,mode=0620 devpts "$r/dev/pts"
ln -s pts/ptmx "$r/dev/ptmx"
mount -t tmpfs -o mode=1777,nosuid,nodev hostlock-systemd-shm "$r/dev/shm"
ln -s /proc/self/fd "$r/dev/fd"
ln -s /proc/self/fd/0 "$r/dev/stdin"
ln -s /proc/self/fd/1 "$r/dev/stdout"
ln -s /proc/self/fd/2 "$r/dev/stderr"
touch "$r/dev/console"
mount --bind "$console" "$r/dev/console"
mount -t tmpfs -o mode=0755,nosuid,nodev hostlock-systemd-run "$r/run"
mount -t tmpfs -o mode=1777,nosuid,nodev hostlock-systemd-tmp "$r/tmp"
mkdir -p "$r/.hostlock-oldroot"
cd "$r"
pivot_root . .hostlock-oldroot
umount -l /.hostlock-oldroot
rmdir /.hostlock-oldroot
exec setpriv --bounding-set "$3" env -i container=other "$4" "$5" --system --unit=sysinit.target \
    </dev/console >/dev/console 2>&1
"""


class SystemdError(RuntimeError):
    """The systemd could not be started, reached or stopped; the message says what and what it printed."""


def usable() -> str:
    """Why a namespaced systemd cannot run here, or '' if it can (the tests skip with the reason)."""
    if os.geteuid() != 0:
        return "needs root (mounts, namespaces, cgroups)"
    for path, what in ((SYSTEMD, "systemd"), (os.path.join(CGROUP2, "cgroup.procs"), "a cgroup2 mount")):
        if not os.path.exists(path):
            return "needs %s at %s" % (what, path)
    for tool in ("unshare", "nsenter", "setpriv"):
        if shutil.which(tool) is None:
            return "needs %s (util-linux)" % tool
    return ""


class Systemd:
    """One systemd as PID 1 of its own namespaces. `pid` is that PID 1 as seen from here."""

    def __init__(self, workdir: str | os.PathLike, name: str = "") -> None:
        self.work = Path(workdir).resolve()
        self.name = name or "hostlock-systemd-" + uuid.uuid4().hex[:12]
        self.cgroup = Path(CGROUP2, self.name)
        self.pid = 0
        self.proc: subprocess.Popen | None = None
        self.console: list[bytes] = []
        self._master = -1
        self._reader: threading.Thread | None = None

    # --- Starting and stopping ------------------------------------------------------------------------
    def start(self, timeout: float = BOOT_TIMEOUT) -> Systemd:
        """Boot, and return once `systemctl is-system-running` says running or degraded."""
        why = usable()
        if why:
            raise SystemdError("cannot start systemd: " + why)
        (self.work / "root").mkdir(parents=True, exist_ok=True)
        (self.work / "layer").mkdir(exist_ok=True)
        self.cgroup.mkdir()
        master, slave = pty.openpty()
        self._master = master
        self._reader = threading.Thread(target=self._drain, daemon=True)
        self._reader.start()
        cgroup_procs = str(self.cgroup / "cgroup.procs")

        def into_cgroup() -> None:  # in the child, before exec: its cgroup becomes the namespace's root
            with open(cgroup_procs, "w") as f:
                f.write(str(os.getpid()))

        try:
            self.proc = subprocess.Popen(
                ["unshare", "--pid", "--fork", "--kill-child", "--mount", "--cgroup", "--uts", "--ipc", "--net",
                 "/bin/bash", "-c", BOOT, "boot", str(self.work), os.ttyname(slave), DROP_CAPS, INNER_PATH, SYSTEMD],
                stdin=subprocess.DEVNULL, stdout=slave, stderr=slave, preexec_fn=into_cgroup,
                start_new_session=True)
        finally:
            os.close(slave)
        try:
            self.pid = self._wait_for_init(timeout)
            self._wait_running(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _drain(self) -> None:
        """Read the console pty (systemd's early messages go there; a reader keeps them flowing)."""
        while True:
            try:
                data = os.read(self._master, 65536)
            except OSError:
                return
            if not data:
                return
            self.console.append(data)

    def console_text(self) -> str:
        return b"".join(self.console).decode("utf-8", "replace")

    def _wait_for_init(self, timeout: float) -> int:
        """The child of unshare in another PID namespace, once it has exec'd systemd."""
        assert self.proc is not None
        own_ns = os.readlink("/proc/self/ns/pid")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemdError("the namespace ended before systemd started (exit %s):\n%s"
                                   % (self.proc.returncode, self.console_text()))
            for child in _children(self.proc.pid):
                try:
                    if (os.readlink("/proc/%d/ns/pid" % child) != own_ns
                            and os.path.realpath("/proc/%d/exe" % child).endswith("/systemd")):
                        return child
                except OSError:
                    continue
            time.sleep(0.01)
        raise SystemdError("systemd did not start within %ss:\n%s" % (timeout, self.console_text()))

    def _wait_running(self, timeout: float) -> None:
        state = ""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            # --wait blocks until boot is over; bounded here so that a stuck boot is a failure, not a hang.
            r = self.run("systemctl", "is-system-running", "--wait", check=False,
                         timeout=max(1.0, deadline - time.monotonic()))
            state = r.stdout.strip()
            if state in ("running", "degraded"):
                return
            # offline: systemctl found no manager to talk to yet (its private socket comes a moment after exec).
            if state not in ("offline", "initializing", "starting", ""):
                break
            time.sleep(0.05)
        failed = self.run("systemctl", "--failed", "--no-legend", check=False).stdout
        raise SystemdError("systemd is %r, not running (failed units: %s):\n%s" % (state, failed, self.console_text()))

    def stop(self, timeout: float = 30.0) -> None:
        """Halt (SIGRTMIN+3, SIGKILL after `timeout`), reap unshare, remove the cgroups. Safe to call twice."""
        if self.proc is not None:
            if self.pid and self.proc.poll() is None:
                try:
                    os.kill(self.pid, signal.SIGRTMIN + 3)
                except ProcessLookupError:
                    pass
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                if self.pid:  # PID 1's death takes the whole PID namespace down
                    try:
                        os.kill(self.pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                self.proc.kill()
                self.proc.wait(timeout)
            self.proc = None
        if self._master >= 0:
            os.close(self._master)
            self._master = -1
        if self._reader is not None:
            self._reader.join(5)
            self._reader = None
        self._remove_cgroups(timeout)
        self.pid = 0

    def _remove_cgroups(self, timeout: float) -> None:
        if not self.cgroup.exists():
            return
        deadline = time.monotonic() + timeout
        while True:
            dirs = sorted((Path(walked[0]) for walked in os.walk(self.cgroup)), key=lambda p: len(p.parts),
                          reverse=True)
            try:
                for d in dirs:
                    d.rmdir()
                return
            except OSError as e:  # EBUSY while the kernel still counts an exiting process
                if time.monotonic() > deadline:
                    raise SystemdError("could not remove cgroup %s: %s" % (self.cgroup, e)) from e
                time.sleep(0.05)

    def __enter__(self) -> Systemd:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- Inside ---------------------------------------------------------------------------------------
    def argv(self, *argv: str) -> list[str]:
        """An argument vector that runs `argv` inside, with a clean environment."""
        return ["nsenter", "-t", str(self.pid), "-a", "--", "env", "-i", INNER_PATH, "HOME=/root", "LANG=C.UTF-8",
                *argv]

    def run(self, *argv: str, check: bool = True, input: str | None = None,
            timeout: float = 60.0) -> subprocess.CompletedProcess:
        """Run a command inside; with `check`, a non-zero exit raises with its output."""
        r = subprocess.run(self.argv(*argv), input=input, capture_output=True, text=True, timeout=timeout, check=False)
        if check and r.returncode != 0:
            raise SystemdError("%s exited %d:\n%s%s" % (" ".join(argv), r.returncode, r.stdout, r.stderr))
        return r

    def put(self, path: str, text: str, mode: int = 0o644) -> None:
        """Write a file inside (through the namespace's own root, so its links resolve there)."""
        self.run("/bin/sh", "-c", 'umask 077 && mkdir -p "$(dirname "$1")" && cat > "$1" && chmod %o "$1"' % mode,
                 "put", path, input=text)

    def read(self, path: str) -> str:
        return self.run("cat", "--", path).stdout

    def exists(self, path: str) -> bool:
        return self.run("test", "-e", path, check=False).returncode == 0

    def show(self, unit: str, prop: str) -> str:
        return self.run("systemctl", "show", "--property", prop, "--value", unit).stdout.strip()

    def journal(self, *matches: str) -> list[dict]:
        """journalctl's entries for `matches` (e.g. `-u`, `x.service`, or FIELD=value), oldest first."""
        out = self.run("journalctl", "--no-pager", "-o", "json", *matches).stdout
        return [json.loads(line) for line in out.splitlines() if line.strip()]

    def wait_until(self, predicate: Callable[[], object], what: str, timeout: float = 60.0, every: float = 0.05):
        """Poll `predicate` until it returns something true, and return that; `timeout` only bounds a hang."""
        deadline = time.monotonic() + timeout
        while True:
            value = predicate()
            if value:
                return value
            if time.monotonic() > deadline:
                raise SystemdError("timed out after %ss waiting for %s" % (timeout, what))
            time.sleep(every)


def _children(pid: int) -> list[int]:
    try:
        with open("/proc/%d/task/%d/children" % (pid, pid)) as f:
            return [int(p) for p in f.read().split()]
    except OSError:
        return []


# --- Across processes (Molecule's create and destroy) --------------------------------------------------
def _keep(workdir: str) -> None:
    """Boot, say the PID 1 in WORKDIR/pid, and hold the namespaces until SIGTERM; then halt and clean up."""
    work = Path(workdir)
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    sd = Systemd(work / "systemd")
    try:
        sd.start()
    except SystemdError as e:
        (work / "error").write_text(str(e))
        return
    (work / "name").write_text(sd.name)
    tmp = work / "pid.tmp"
    tmp.write_text(str(sd.pid))
    tmp.rename(work / "pid")
    try:
        while not stopping.wait(1):
            if sd.proc is None or sd.proc.poll() is not None:
                break
    finally:
        sd.stop()
        (work / "console.log").write_text(sd.console_text())
        (work / "stopped").write_text("")


def _start(workdir: str) -> int:
    work = Path(workdir).resolve()
    _stop(str(work))
    work.mkdir(parents=True, mode=0o700)
    with open(work / "keeper.log", "w") as log:
        keeper = subprocess.Popen([sys.executable, "-I", os.path.abspath(__file__), "keep", str(work)],
                                  stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log,
                                  start_new_session=True, cwd="/")
    (work / "keeper").write_text(str(keeper.pid))
    deadline = time.monotonic() + BOOT_TIMEOUT + 10
    while time.monotonic() < deadline:
        if (work / "pid").exists():
            print((work / "pid").read_text())
            return 0
        if (work / "error").exists() or keeper.poll() is not None:
            break
        time.sleep(0.02)
    error = (work / "error").read_text() if (work / "error").exists() else "the keeper ended or hung"
    print("systemd_harness: " + error + "\n" + (work / "keeper.log").read_text(), file=sys.stderr)
    _stop(str(work))
    return 1


def _stop(workdir: str) -> int:
    work = Path(workdir).resolve()
    keeper_file = work / "keeper"
    if keeper_file.exists():
        pid = int(keeper_file.read_text())
        if _is_keeper(pid, work):
            os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + 60
            while _is_keeper(pid, work) and not (work / "stopped").exists() and time.monotonic() < deadline:
                time.sleep(0.02)
            while _is_keeper(pid, work) and time.monotonic() < deadline:
                time.sleep(0.02)
    if work.exists():
        shutil.rmtree(work)
    return 0


def _is_keeper(pid: int, work: Path) -> bool:
    """Whether `pid` is still our keeper for `work` (never signal a reused pid)."""
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            args = f.read().split(b"\0")
        with open("/proc/%d/stat" % pid) as f:
            zombie = f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return False
    return not zombie and b"keep" in args and str(work).encode() in args


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("start", "stop", "keep"):
        sys.exit("usage: systemd_harness.py start|stop WORKDIR")
    if sys.argv[1] == "keep":
        _keep(sys.argv[2])
        sys.exit(0)
    sys.exit(_start(sys.argv[2]) if sys.argv[1] == "start" else _stop(sys.argv[2]))
