"""Fixtures for the command-line tests: the `hostlock` command installed the way the cli role installs it
(a launcher run by the real interpreter with -I -S, the library on sys.path), one lock directory per test."""

import json
import os
import subprocess
import time
from pathlib import Path

import pytest
from cli_support import make_launcher
from engine_helpers import default_signals


@pytest.fixture(scope="session")
def launcher(tmp_path_factory):
    return make_launcher(tmp_path_factory.mktemp("bin"))


class CLI:
    """Runs the installed command with HOSTLOCK_DIR pointing at this test's own lock directory."""

    def __init__(self, launcher: Path, lockdir: Path, tmp: Path):
        self.launcher = str(launcher)
        self.lockdir = str(lockdir)
        self.tmp = tmp
        self.env = dict(os.environ, HOSTLOCK_DIR=self.lockdir)
        self.env.pop("PYTHONPATH", None)
        self.procs = []

    def argv(self, *args):
        return [self.launcher, *map(str, args)]

    def run(self, *args, timeout=30, env=None, **kw):
        """Run to completion; returns CompletedProcess with text stdout/stderr."""
        return subprocess.run(self.argv(*args), check=False, capture_output=True, text=True, timeout=timeout,
                              env=env or self.env, **kw)

    def start(self, *args, env=None, **kw):
        """Start in the background (its own session, like a daemon or a cron job: no terminal)."""
        kw.setdefault("stdout", subprocess.PIPE)
        kw.setdefault("stderr", subprocess.PIPE)
        kw.setdefault("preexec_fn", default_signals)
        p = subprocess.Popen(self.argv(*args), text=True, env=env or self.env, start_new_session=True, **kw)
        self.procs.append(p)
        return p

    def status(self, name=None):
        args = ["status", "--json"] + ([name] if name else [])
        r = self.run(*args)
        assert r.returncode == 0, r.stderr
        doc = json.loads(r.stdout)
        return doc["locks"][0] if name else doc

    def holders(self, name):
        return self.status(name)["holders"]

    def wait_held(self, name, count=1, timeout=10.0):
        """Wait until `name` has `count` live holders whose job pid is recorded; return the holders."""
        deadline = time.monotonic() + timeout
        while True:
            hs = [h for h in self.holders(name) if not h["stale"]]
            if len(hs) >= count and all(h["job_pid"] or h["lease_expires"] for h in hs):
                return hs
            if time.monotonic() > deadline:
                raise AssertionError(f"{name}: expected {count} holders, have {hs}")
            time.sleep(0.02)

    def is_free(self, name):
        return not [h for h in self.holders(name) if not h["stale"]]

    def cleanup(self):
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, 9)
                except OSError:
                    pass
                p.wait()


@pytest.fixture
def cli(launcher, tmp_path):
    lockdir = tmp_path / "locks"
    lockdir.mkdir(mode=0o700)
    c = CLI(launcher, lockdir, tmp_path)
    yield c
    c.cleanup()


@pytest.fixture
def etcd(tmp_path):
    """One real etcd member on free ports (tests/fleet_etcd.py, as in tests/integration/fleet), stopped after.

    Skips when the binaries are missing; `make test-cli` installs them first (its etcd-deps prerequisite).
    """
    import fleet_etcd  # tests/ is on the import path (pytest.ini)

    if not fleet_etcd.have_etcd():
        pytest.skip("etcd/etcdctl not installed (make test-cli and make test-fleet install etcd-server, etcd-client)")
    member = fleet_etcd.start_etcd(str(tmp_path))
    try:
        yield member
    finally:
        member.stop()
