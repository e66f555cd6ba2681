"""Fixtures for the Ansible integration tests: the collection as users get it, a real sshd, playbook runs.

Every test runs the real `ansible-playbook` from .venv against the collection built with
`ansible-galaxy collection build` and installed into a temporary collections path (never the source
tree), over two connections: `local`, and real SSH to an sshd started here on 127.0.0.1. The managed
side runs a bare interpreter (pyenv 3.8 if present, else /usr/bin/python3) without psutil or hostlock.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from engine_helpers import default_signals
from harness import HERE, PLAYBOOKS, VENV_BIN, HarnessError, Sshd, bare_python, build_collection, hostlock_cli


@pytest.fixture(scope="session")
def collections_path(tmp_path_factory) -> Path:
    """hostlock.core as users get it: `ansible-galaxy collection build`, then install from the tarball."""
    try:
        return build_collection(tmp_path_factory.mktemp("galaxy"))
    except HarnessError as e:
        pytest.fail(str(e))


@pytest.fixture(scope="session")
def sshd(tmp_path_factory):
    try:
        server = Sshd(tmp_path_factory.mktemp("sshd")).start()
    except HarnessError as e:
        pytest.fail(str(e))
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
        return {k: v for k, v in env.items() if v is not None}  # None: leave that variable out

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
            check=False,
            preexec_fn=default_signals,  # noqa: PLW1509 - restores what the tests signal (nohup, background jobs)
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
            preexec_fn=default_signals,  # noqa: PLW1509 - SIGINT/SIGTERM must reach ansible-playbook as at a prompt
        )


@pytest.fixture
def ansible(tmp_path, collections_path, sshd) -> Ansible:
    return Ansible(tmp_path, collections_path, sshd)


@pytest.fixture
def engine():
    """The engine from lib/ (installed in .venv): the test's independent view of the host's locks."""
    import hostlock

    return hostlock


@pytest.fixture
def etcd(tmp_path):
    """A real etcd member on 127.0.0.1 (tests/fleet_etcd.py) for the fleet tests; skips without the binaries."""
    import fleet_etcd

    if not fleet_etcd.have_etcd():
        pytest.skip("etcd/etcdctl not installed (make test-ansible installs etcd-server and etcd-client)")
    member = fleet_etcd.start_etcd(str(tmp_path))
    try:
        yield member
    finally:
        member.stop()
