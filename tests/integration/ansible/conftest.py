"""Fixtures for the Ansible integration tests: the collection as users get it, a real sshd, playbook runs.

Every test runs the real `ansible-playbook` from .venv against the collection built with
`ansible-galaxy collection build` and installed into a temporary collections path (never the source
tree), over two connections: `local`, and real SSH to an sshd started here on 127.0.0.1. The managed
side runs a bare interpreter (pyenv 3.8 if present, else /usr/bin/python3) without psutil or hostlock.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
HERE = Path(__file__).resolve().parent
PLAYBOOKS = HERE / "playbooks"
VENV_BIN = Path(sys.executable).parent
SSHD = Path("/usr/sbin/sshd")


def bare_python() -> str:
    """The managed hosts' interpreter: a Python 3.8 if there is one (the oldest we support)."""
    for candidate in ("/root/.pyenv/versions/3.8.18/bin/python3", "/usr/bin/python3"):
        if os.access(candidate, os.X_OK):
            return candidate
    pytest.fail("no target interpreter: neither /root/.pyenv/versions/3.8.18/bin/python3 nor /usr/bin/python3")


def hostlock_cli() -> list[str]:
    """The hostlock command as the host's own jobs run it (lib/ is installed in .venv)."""
    script = VENV_BIN / "hostlock"
    return [str(script)] if script.exists() else [sys.executable, "-m", "hostlock"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
            pytest.skip("the SSH tests run sshd as root (PermitRootLogin prohibit-password)")
        if not SSHD.exists():
            pytest.fail(
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
                pytest.fail(f"sshd exited with {self.proc.returncode}: {self.log.read_text()}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.05)
        else:
            pytest.fail(f"sshd did not listen on 127.0.0.1:{self.port}: {self.log.read_text()}")
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


@pytest.fixture(scope="session")
def collections_path(tmp_path_factory) -> Path:
    """hostlock.core as users get it: `ansible-galaxy collection build`, then install from the tarball."""
    work = tmp_path_factory.mktemp("galaxy")
    galaxy = str(VENV_BIN / "ansible-galaxy")
    cfg = work / "ansible.cfg"
    cfg.write_text("[defaults]\n")
    env = dict(os.environ, ANSIBLE_CONFIG=str(cfg), ANSIBLE_NOCOLOR="1")
    subprocess.run(
        [galaxy, "collection", "build", str(REPO), "--output-path", str(work), "--force"],
        check=True,
        env=env,
        capture_output=True,
        text=True,
    )
    (tarball,) = work.glob("hostlock-core-*.tar.gz")
    installed = work / "collections"
    subprocess.run(
        [galaxy, "collection", "install", "--offline", "--force", "-p", str(installed), str(tarball)],
        check=True,
        env=env,
        capture_output=True,
        text=True,
    )
    root = installed / "ansible_collections" / "hostlock" / "core"
    assert (root / "plugins" / "module_utils" / "hostlock" / "__init__.py").exists(), "engine copy not shipped"
    return installed


@pytest.fixture(scope="session")
def sshd(tmp_path_factory):
    server = Sshd(tmp_path_factory.mktemp("sshd")).start()
    yield server
    server.stop()


@dataclass
class Run:
    proc: subprocess.CompletedProcess

    @property
    def rc(self) -> int:
        return self.proc.returncode

    @property
    def out(self) -> str:
        return self.proc.stdout + self.proc.stderr

    record: Path

    def results(self) -> dict[str, dict[str, dict]]:
        """{task name: {host: result}} as written by the test-only `record` callback."""
        if not self.record.exists():
            raise AssertionError(f"no task results recorded (rc {self.rc}):\n{self.out}")
        return json.loads(self.record.read_text())


@dataclass
class Ansible:
    """Runs ansible-playbook from .venv against the installed collection, in a private work dir."""

    work: Path
    collections: Path
    sshd: Sshd | None
    python: str = field(default_factory=bare_python)

    def __post_init__(self) -> None:
        self.lockdir = self.work / "locks"
        self.lockdir.mkdir(mode=0o700, exist_ok=True)
        self.ctl_lockdir = self.work / "controller-locks"
        self.ctl_lockdir.mkdir(mode=0o700, exist_ok=True)
        lines = ["[local]"]
        lines += [f"{h} ansible_connection=local ansible_python_interpreter={self.python}" for h in ("loc", "loc2")]
        if self.sshd:
            lines += ["[ssh]", self.sshd.inventory_line("ssh1", self.python)]
        self.inventory = self.work / "inventory.ini"
        self.inventory.write_text("\n".join(lines) + "\n")
        (self.work / "ansible.cfg").write_text("[defaults]\n")

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("ANSIBLE_", "HOSTLOCK_"))}
        env.update(
            ANSIBLE_CONFIG=str(self.work / "ansible.cfg"),
            ANSIBLE_COLLECTIONS_PATH=str(self.collections),
            ANSIBLE_INVENTORY=str(self.inventory),
            ANSIBLE_HOST_KEY_CHECKING="False",
            ANSIBLE_RETRY_FILES_ENABLED="False",
            ANSIBLE_NOCOLOR="1",
            ANSIBLE_FORCE_COLOR="0",
            ANSIBLE_LOCAL_TEMP=str(self.work / "ansible-local"),
            ANSIBLE_SSH_CONTROL_PATH_DIR=str(self.work / "cp"),
            ANSIBLE_DEPRECATION_WARNINGS="False",
            ANSIBLE_CALLBACK_PLUGINS=str(HERE / "callback_plugins"),
            ANSIBLE_CALLBACKS_ENABLED="record",
            # the local connection passes the controller's environment to modules: the default lock dir
            HOSTLOCK_DIR=str(self.lockdir),
            PATH=f"{VENV_BIN}:{os.environ.get('PATH', '/usr/bin:/bin')}",
        )
        env.update(extra)
        return env

    def command(self, playbook: str, *args: str, extra_vars: dict | None = None) -> list[str]:
        cmd = [str(VENV_BIN / "ansible-playbook"), str(PLAYBOOKS / playbook)]
        evars = dict(lockdir=str(self.lockdir), hostlock_cli=hostlock_cli(), workdir=str(self.work))
        evars.update(extra_vars or {})
        cmd += ["-e", json.dumps(evars), *args]
        return cmd

    def play(
        self,
        playbook: str,
        *args: str,
        extra_vars: dict | None = None,
        timeout: float = 300,
        **env: str,
    ) -> Run:
        record = Path(tempfile.mkstemp(dir=self.work, prefix="record-", suffix=".json")[1])
        record.unlink()
        env.setdefault("HOSTLOCK_TEST_RECORD", str(record))
        proc = subprocess.run(
            self.command(playbook, *args, extra_vars=extra_vars),
            cwd=self.work,
            env=self.env(**env),
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        return Run(proc, record)

    def popen(self, playbook: str, *args: str, extra_vars: dict | None = None, **env: str) -> subprocess.Popen:
        return subprocess.Popen(
            self.command(playbook, *args, extra_vars=extra_vars),
            cwd=self.work,
            env=self.env(**env),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )


@pytest.fixture
def ansible(tmp_path, collections_path, sshd) -> Ansible:
    return Ansible(tmp_path, collections_path, sshd)


@pytest.fixture
def engine():
    """The engine from lib/ (installed in .venv): the test's independent view of the host's locks."""
    import hostlock

    return hostlock
