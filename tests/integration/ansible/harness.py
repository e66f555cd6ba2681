"""Pieces shared by the Ansible integration tests, benchmarks/ansible_plugins.py and the demo (no pytest here).

- the collection as users get it: `ansible-galaxy collection build`, installed from the tarball
  into a temporary collections path;
- a throwaway OpenSSH server on 127.0.0.1 (own config, host key, client key, port), run as root;
- the managed hosts' bare interpreter (pyenv 3.8 if present, else /usr/bin/python3).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from ports import free_port


class HarnessError(RuntimeError):
    """The test environment cannot be set up (missing sshd, no interpreter, build failed)."""


REPO = Path(__file__).resolve().parents[3]
HERE = Path(__file__).resolve().parent
PLAYBOOKS = HERE / "playbooks"
VENV_BIN = Path(sys.executable).parent
SSHD = Path("/usr/sbin/sshd")
# A host job of the same lock (`hostlock run NAME python -c NEXT EVENTS WORK_PID`), for the tests that kill a
# run while its work holds a lock: when it ran, and whether the work (WORK_PID) still existed then.
NEXT = (
    "import sys, time\n"
    "try:\n    state = open('/proc/%s/stat' % sys.argv[2]).read().rpartition(')')[2].split()[0]\n"
    "except OSError:\n    state = 'gone'\n"
    "word = 'next' if state in ('gone', 'Z', 'X') else 'next-overlap'\n"
    "open(sys.argv[1], 'a').write('%s 0 %.9f\\n' % (word, time.time()))\n"
)


def bare_python() -> str:
    """The managed hosts' interpreter: a Python 3.8 if there is one (the oldest we support)."""
    for candidate in ("/root/.pyenv/versions/3.8.18/bin/python3", "/usr/bin/python3"):
        if os.access(candidate, os.X_OK):
            return candidate
    raise HarnessError("no target interpreter: neither /root/.pyenv/versions/3.8.18/bin/python3 nor /usr/bin/python3")


def hostlock_cli() -> list[str]:
    """The hostlock command as the host's own jobs run it (lib/ is installed in .venv)."""
    script = VENV_BIN / "hostlock"
    return [str(script)] if script.exists() else [sys.executable, "-m", "hostlock"]


@dataclass
class Sshd:
    """A throwaway OpenSSH server on 127.0.0.1 with its own host key, client key and config."""

    root: Path
    port: int = 0
    proc: subprocess.Popen | None = None
    log: Path = field(init=False)

    def __post_init__(self) -> None:
        self.log = self.root / "sshd.log"

    @property
    def key(self) -> Path:
        return self.root / "client_key"

    def start(self) -> Sshd:
        if os.geteuid() != 0:
            raise HarnessError("the SSH tests run sshd as root (PermitRootLogin prohibit-password): run them as root")
        if not SSHD.exists():
            raise HarnessError(
                "no /usr/sbin/sshd: `make test-ansible` installs openssh-server (apt-get install openssh-server)"
            )
        self.root.mkdir(parents=True, exist_ok=True)
        for name in ("host_key", "client_key"):
            if not (self.root / name).exists():
                subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(self.root / name)], check=True)
        shutil.copy(self.root / "client_key.pub", self.root / "authorized_keys")
        os.chmod(self.root / "authorized_keys", 0o600)
        # sshd refuses to start without its privilege separation directory (Debian creates it in the unit).
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
        self.port = free_port()
        config = self.root / "sshd_config"
        (self.root / "home").mkdir(mode=0o700, exist_ok=True)
        config.write_text(
            "\n".join(
                [
                    f"Port {self.port}",
                    "ListenAddress 127.0.0.1",
                    f"HostKey {self.root / 'host_key'}",
                    f"PidFile {self.root / 'sshd.pid'}",
                    f"AuthorizedKeysFile {self.root / 'authorized_keys'}",
                    "PermitRootLogin prohibit-password",
                    "PasswordAuthentication no",
                    "KbdInteractiveAuthentication no",
                    "UsePAM no",
                    # the key files live under /tmp (world-writable): a throwaway test server only
                    "StrictModes no",
                    "Subsystem sftp internal-sftp",
                    # An empty home for sessions: root's ~/.bashrc here runs `pyenv init`, whose rehash waits
                    # up to a minute on a lock file that a session killed mid-login (the connection-break
                    # test kills sessions) leaves behind; every later login would then hang.
                    f"SetEnv HOME={self.root / 'home'}",
                    "MaxSessions 50",
                    "MaxStartups 50",
                    "LogLevel ERROR",
                    "",
                ]
            )
        )
        self.proc = subprocess.Popen(
            [str(SSHD), "-D", "-e", "-f", str(config)],
            stdout=subprocess.DEVNULL,
            stderr=self.log.open("ab"),
            start_new_session=True,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise HarnessError(f"sshd exited with {self.proc.returncode}: {self.log.read_text()}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.05)
        else:
            raise HarnessError(f"sshd did not listen on 127.0.0.1:{self.port}: {self.log.read_text()}")
        return self

    def stop(self, sessions: bool = True, keep: list = ()) -> None:
        """End the server and, with sessions, every process started through it (except pids in keep)."""
        if self.proc and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(timeout=10)
        if not sessions:
            return
        # sshd puts each session in a session of its own: find them by the server port in SSH_CONNECTION
        spare = {getattr(h, "pid", h) for h in keep}
        for pid in _pids_with_env("SSH_CONNECTION", f" {self.port}"):
            if pid not in spare:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass

    def drop_connections(self) -> None:
        """A network that drops: end the server and the sshd processes serving its sessions, while the
        commands of those sessions (the module, the work under it) run on. A session that ended on its own
        meanwhile is not an error."""
        self.stop(sessions=False)
        for pid in _session_daemons(self.port):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def inventory_line(self, name: str, python: str) -> str:
        return (
            f"{name} ansible_connection=ssh ansible_host=127.0.0.1 ansible_port={self.port} ansible_user=root "
            f"ansible_ssh_private_key_file={self.key} ansible_python_interpreter={python} "
            "ansible_ssh_common_args='-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR'"
        )


def _pids_with_env(var: str, suffix: str) -> list[int]:
    """Processes whose environment has var ending in suffix (SSH sessions of one test server)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            env = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        for item in env:
            if item.startswith(var.encode() + b"=") and item.endswith(suffix.encode()):
                found.append(int(entry.name))
                break
    return found


def build_collection(work: Path, source: Path = REPO) -> Path:
    """hostlock.core as users get it: build the tarball, install it under work; returns the collections path.
    `source`: another tree of the collection (benchmarks compare a commit's with this checkout's)."""
    galaxy = str(VENV_BIN / "ansible-galaxy")
    work.mkdir(parents=True, exist_ok=True)
    cfg = work / "ansible.cfg"
    cfg.write_text("[defaults]\n")
    env = dict(os.environ, ANSIBLE_CONFIG=str(cfg), ANSIBLE_NOCOLOR="1")
    for old in work.glob("hostlock-core-*.tar.gz"):
        old.unlink()
    build = subprocess.run(
        [galaxy, "collection", "build", str(source), "--output-path", str(work), "--force"],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if build.returncode:
        raise HarnessError(f"ansible-galaxy collection build failed: {build.stdout}{build.stderr}")
    (tarball,) = work.glob("hostlock-core-*.tar.gz")
    install = subprocess.run(
        [galaxy, "collection", "install", "--offline", "--force", "-p", str(work / "collections"), str(tarball)],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if install.returncode:
        raise HarnessError(f"ansible-galaxy collection install failed: {install.stdout}{install.stderr}")
    root = work / "collections" / "ansible_collections" / "hostlock" / "core"
    if not (root / "plugins" / "module_utils" / "hostlock" / "__init__.py").exists():
        raise HarnessError(f"the installed collection in {root} lacks the engine copy (run make module-utils)")
    return work / "collections"


def _session_daemons(port: int) -> list[int]:
    """The sshd processes serving sessions of the server on `port` (parents of the session commands)."""
    daemons = set()
    for pid in _pids_with_env("SSH_CONNECTION", f" {port}"):
        ppid = pid
        while ppid > 1:
            try:
                with open(f"/proc/{ppid}/stat") as f:
                    fields = f.read().rpartition(")")[2].split()
                with open(f"/proc/{ppid}/comm") as f:
                    comm = f.read().strip()
            except OSError:
                break
            if comm.startswith("sshd"):
                daemons.add(ppid)
            ppid = int(fields[1])
    return sorted(daemons)


def ended(pid: int) -> bool:
    """Whether process `pid` has ended: gone, or a zombie nobody reaps (init does not, in some containers)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] in ("Z", "X")
    except OSError:
        return True


def held_while_it_runs(directory: str, lock: str, pid: int, what: str, out: str) -> bool:
    """Whether `lock` is busy (`hostlock run -n`); where it is free, `pid`, the work it must cover, must have
    ended by then (it never ends by itself in these tests: only what ended the run may have ended it)."""
    held = subprocess.run([*hostlock_cli(), "run", "-n", "-d", directory, lock, "true"], check=False)
    if held.returncode == 75:
        return True
    assert ended(pid), f"{lock}: the lock was free while {what} ran:\n{out}"
    return False


def wait_for(predicate, what: str, limit: float = 180.0, proc: subprocess.Popen | None = None):
    """Poll until `predicate()` is truthy and return its value: waiting for an event, with a generous hang
    guard (not a timing assumption). With `proc`, an ansible-playbook that exits first fails at once."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            out = proc.stdout.read() if proc.stdout else ""
            raise AssertionError(f"ansible-playbook exited ({proc.returncode}) before {what}:\n{out}")
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")
