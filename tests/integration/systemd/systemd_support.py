"""Helpers for tests against a real systemd (tests/systemd_harness.py): booting one, the hostlock command installed
inside as the cli role installs it, and real `ansible-playbook` runs reaching it through the test-only nsenter
connection (connection_plugins/nsenter.py). Fixtures are in conftest.py."""

from __future__ import annotations

import os
import subprocess
import textwrap
from pathlib import Path

import pytest
from systemd_harness import Systemd, SystemdError, usable

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
VENV_BIN = ROOT / ".venv" / "bin"
HOSTLOCK = "/usr/local/bin/hostlock"
INNER_PYTHON = "/usr/bin/python3"  # the managed side's interpreter, as on a Debian host

WHY_NOT = usable()
# Each test module's pytestmark: skip, saying why, where a namespaced systemd cannot run.
needs_systemd = pytest.mark.skipif(bool(WHY_NOT), reason=WHY_NOT or "usable")


def boot(directory: Path) -> Systemd:
    try:
        return Systemd(directory).start()
    except SystemdError as e:
        pytest.fail(str(e))


def install_hostlock(sd: Systemd, members: tuple[str, ...] = ()) -> None:
    """What hostlock.core.cli does, inside: the command (tests/cli_install.py, bundled for the host's Python), the
    lock group with `members`, the shared lock directory (its own scenario tests the role itself)."""
    code = textwrap.dedent("""
        import sys
        sys.path.insert(0, sys.argv[1] + "/tests")
        import cli_install
        cli_install.installed("/usr/local/bin", sys.argv[2], sys.argv[1] + "/plugins/module_utils")
    """)
    sd.run(str(VENV_BIN / "python"), "-c", code, str(ROOT), INNER_PYTHON)  # the venv has jinja2
    sd.run("groupadd", "--system", "hostlock")
    for user in members:
        sd.run("useradd", "--no-create-home", "--home-dir", "/nonexistent", "--groups", "hostlock", user)
    sd.run("install", "-d", "-m", "3770", "-o", "root", "-g", "hostlock", "/run/hostlock")


def collections_dir(base: Path) -> Path:
    """A collections path under `base` whose hostlock.core is this checkout (a link, as the Molecule scenarios
    do); returns `base`, the directory play() takes."""
    link = base / "collections" / "ansible_collections" / "hostlock" / "core"
    link.parent.mkdir(parents=True)
    link.symlink_to(ROOT)
    return base


def play(sd: Systemd, base: Path, playbook: str, *args: str) -> subprocess.CompletedProcess:
    """Run `playbook` (YAML text) against `sd` with the real ansible-playbook (`base` from collections_dir)."""
    path = base / ("play-%d.yml" % len(list(base.glob("play-*.yml"))))
    path.write_text(playbook)
    inventory = base / "inventory"
    inventory.write_text("target ansible_host=%d ansible_connection=nsenter ansible_python_interpreter=%s\n"
                         % (sd.pid, INNER_PYTHON))
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(base / "collections"),
               ANSIBLE_CONNECTION_PLUGINS=str(HERE / "connection_plugins"), ANSIBLE_NOCOLOR="1",
               ANSIBLE_LOCAL_TEMP=str(base / "tmp"), ANSIBLE_HOME=str(base / "home"),
               ANSIBLE_FORCE_COLOR="0", PY_COLORS="0")
    return subprocess.run([str(VENV_BIN / "ansible-playbook"), "-i", str(inventory), str(path), *args],
                          capture_output=True, text=True, env=env, timeout=900, check=False)
