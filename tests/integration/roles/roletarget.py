"""One disposable host for the cli and cron roles, driven from Python (tests/integration/roles/test_cli_tree.py,
benchmarks/roles.py): target.sh's private mount namespace (its /etc, /usr/local, /run, /tmp are the target's
own; nothing of this machine changes), with ansible-playbook run *inside* it over the local connection, as on
one local host. Also: another commit's roles as a collection, and a snapshot of what the roles installed.

No pytest here (the benchmark imports it too).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
TARGET_SH = HERE / "target.sh"
VENV_BIN = REPO / ".venv" / "bin"
# The host's interpreter, as in the scenarios (molecule.yml's ansible_python_interpreter).
HOST_PYTHON = "/usr/bin/python3"

# The playbooks, by file name: the cli role with its defaults, and both roles with one job (a user's first playbook).
_CLI = """\
    - name: Install hostlock
      ansible.builtin.include_role:
        name: hostlock.core.cli
"""
_CRON = """\
    - name: Install the job
      ansible.builtin.include_role:
        name: hostlock.core.cron
      vars:
        hostlock_cron_jobs:
          - {name: nightly, schedule: "@daily", command: /bin/true}
"""
_PLAY = "- name: Install the hostlock command\n  hosts: all\n  gather_facts: false\n  tasks:\n"
PLAYBOOKS = {"cli.yml": _PLAY + _CLI, "both.yml": _PLAY + _CLI + _CRON}

# Everything the cli role writes with its defaults (the group is read from /etc/group); the cron role's directory.
CLI_PATHS = ("/usr/local/lib/hostlock", "/usr/local/bin/hostlock", "/usr/local/share/man/man1",
             "/usr/local/share/bash-completion", "/etc/tmpfiles.d/hostlock.conf", "/run/hostlock")
CRON_PATHS = ("/etc/cron.d",)

# Walks INSTALLED inside the target: one JSON object, path -> [type, mode, owner, group, digest]. Never follows a
# symlink. Bytecode embeds its source's mtime (the .pyc header, the bundle's table), which differs between any two
# installs: a .pyc is compared without its 16-byte header, the bundle's table by its size alone.
_WALK = r"""
import grp, hashlib, json, os, pwd, stat, sys
out = {}
def digest(path, name):
    with open(path, "rb") as f:
        data = f.read()
    if name == "_hostlock_bundle.pyc":
        return "size %d" % len(data)
    return hashlib.sha256(data[16:] if name.endswith(".pyc") else data).hexdigest()
def add(path):
    st = os.lstat(path)
    kind = {stat.S_IFDIR: "dir", stat.S_IFREG: "file", stat.S_IFLNK: "link"}.get(stat.S_IFMT(st.st_mode), "other")
    what = digest(path, os.path.basename(path)) if kind == "file" else os.readlink(path) if kind == "link" else ""
    owner, group = pwd.getpwuid(st.st_uid).pw_name, grp.getgrgid(st.st_gid).gr_name
    out[path] = [kind, "%04o" % stat.S_IMODE(st.st_mode), owner, group, what]
for top in sys.argv[1:]:
    if not os.path.lexists(top):
        continue
    add(top)
    for dirpath, dirnames, filenames in os.walk(top):
        for name in sorted(dirnames + filenames):
            add(os.path.join(dirpath, name))
for line in open("/etc/group"):
    if line.startswith("hostlock:"):
        out["/etc/group:hostlock"] = ["group", "", "", "", line.split(":")[3].strip()]
print(json.dumps(out, sort_keys=True))
"""


def collection_at(rev: str, directory: Path) -> Path:
    """A collections path holding commit `rev`'s hostlock.core (its roles, plugins and galaxy.yml)."""
    core = directory / "ansible_collections" / "hostlock" / "core"
    core.mkdir(parents=True)
    tar = subprocess.run(["git", "-C", str(REPO), "archive", rev, "galaxy.yml", "meta", "roles", "plugins"],
                         capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(core)], input=tar, check=True)
    return directory


def collection_here(directory: Path) -> Path:
    """A collections path whose hostlock.core is this checkout, live (a link, as the scenarios' create does)."""
    parent = directory / "ansible_collections" / "hostlock"
    parent.mkdir(parents=True)
    (parent / "core").symlink_to(REPO)
    return directory


@dataclass
class Play:
    rc: int
    seconds: float
    out: str

    def recap(self) -> dict[str, int]:
        """The host's PLAY RECAP counts (ok, changed, failed, skipped, ...)."""
        for line in self.out.splitlines():
            if line.startswith("localhost") and "ok=" in line:
                return {k: int(v) for k, v in (f.split("=") for f in line.split(":", 1)[1].split())}
        raise AssertionError("no PLAY RECAP in:\n" + self.out)


class Target:
    """A fresh host (target.sh start WORK) until stop(); plays run inside its namespace."""

    def __init__(self, work: Path):
        self.work = work
        work.mkdir(parents=True, exist_ok=True)
        self.box = work / "target"  # target.sh's WORKDIR (it refuses one under /tmp: hidden inside the target)
        subprocess.run([str(TARGET_SH), "start", str(self.box)], check=True, stdout=subprocess.DEVNULL)
        self.pid = int((self.box / "sshd.pid").read_text())
        for name, text in PLAYBOOKS.items():
            (work / name).write_text(text)
        (work / "ansible.cfg").write_text("")  # no ansible.cfg of the caller's directory or home

    def run(self, argv: list[str], check: bool, **kwargs) -> subprocess.CompletedProcess:
        """`argv` inside the target's mount namespace."""
        return subprocess.run(["nsenter", "--mount", "--target", str(self.pid), f"--wd={self.work}", "--", *argv],
                              check=check, **kwargs)

    def play(self, collections: Path, *args: str, playbook: str = "both.yml",
             env: dict[str, str] | None = None) -> Play:
        """ansible-playbook (this checkout's .venv) of one of PLAYBOOKS on the local connection, with `args`;
        `env` adds to its environment (which has none of the caller's ANSIBLE_* variables)."""
        env = {**{k: v for k, v in os.environ.items() if not k.startswith(("ANSIBLE_", "MOLECULE_"))}, **(env or {})}
        env.update(ANSIBLE_COLLECTIONS_PATH=str(collections), ANSIBLE_LOCAL_TEMP=str(self.work / "tmp"),
                   ANSIBLE_REMOTE_TEMP=str(self.work / "tmp"), ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0",
                   ANSIBLE_CONFIG=str(self.work / "ansible.cfg"), PATH=f"{VENV_BIN}:{os.environ['PATH']}")
        start = time.monotonic()
        done = self.run([str(VENV_BIN / "ansible-playbook"), "-i", "localhost,", "-c", "local",
                         "-e", f"ansible_python_interpreter={HOST_PYTHON}", *args, str(self.work / playbook)],
                        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=False)
        return Play(done.returncode, time.monotonic() - start, done.stdout)

    def snapshot(self, paths: tuple[str, ...] = CLI_PATHS + CRON_PATHS) -> dict[str, list[str]]:
        """What is installed at `paths` (see _WALK), read inside the target."""
        done = self.run([HOST_PYTHON, "-I", "-c", _WALK, *paths], capture_output=True, text=True, check=True)
        return json.loads(done.stdout)

    def stop(self) -> None:
        subprocess.run([str(TARGET_SH), "stop", str(self.box)], check=True)

    def __enter__(self) -> Target:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def differences(before: dict[str, list[str]], after: dict[str, list[str]]) -> list[str]:
    """One line per path whose type, mode, owner, group or content differs, or that only one side has."""
    out = []
    for path in sorted(set(before) | set(after)):
        a, b = before.get(path), after.get(path)
        if a != b:
            out.append(f"{path}: {a} -> {b}")
    return out


if __name__ == "__main__":  # a quick look: python roletarget.py WORKDIR [REV]
    work = Path(sys.argv[1])
    work.mkdir(parents=True)
    coll = collection_at(sys.argv[2], work / "coll") if len(sys.argv) > 2 else collection_here(work / "coll")
    with Target(work) as t:
        p = t.play(coll)
        print(p.out[-2000:], p.seconds)
