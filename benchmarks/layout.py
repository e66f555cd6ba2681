"""Before and after the one-source layout (issue 25), side by side in one run (make bench-layout).

`--before REF` (default: the last commit with the generated copy, lib/hostlock) is checked out in a temporary
git worktree; the working tree is "after". For each, in the same run and interleaved:

- what a host module carries: the AnsiballZ payloads of lock, lock_info and locked that a real
  ansible-playbook run leaves on the host (ANSIBLE_KEEP_REMOTE_FILES), their size and the engine's files in them;
- a locked task's cost: the marginal time of a `hostlock.core.locked`-wrapped ping (a play of N+1 tasks
  minus a play of 1, over N), local connection;
- the command line's start-up: `hostlock run NAME true` through a `python -I -S` launcher (median);
- the engine: uncontended `with hostlock.Lock(name)` cycles in one process (median per cycle).

Prints a Markdown table and, with --docs, writes it into the file's "## Layout" section.
"""

from __future__ import annotations

import argparse
import base64
import io
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

from docsection import write_section  # noqa: E402 - benchmarks/ is the script's directory

ROOT = Path(__file__).resolve().parents[1]
VENV_BIN = ROOT / ".venv" / "bin"
SECTION = "## Layout"
BEFORE = "20093ff"  # main before issue 25: lib/hostlock and its generated copy
NOISE = 1.05  # after/before within this is "no worse": run-to-run spread of these medians here
# Engine files that never run on a host, in either layout: before (flat _fleet, _etcd*, cli, _cli_*, _supervise,
# _jobkill) and after (fleet/, cli/).
ELSEWHERE = re.compile(r"/(_fleet|_etcd|_etcd_lock|_cli_\w+|cli|fleet/|cli/|_supervise|_jobkill)")
ENGINE_ZIP = "ansible_collections/hostlock/core/plugins/module_utils/hostlock/"


def real_python() -> str:
    venv = VENV_BIN / "python"
    return os.path.realpath(venv if venv.exists() else sys.executable)


def engine_dir(tree: Path) -> Path:
    """The directory that holds the hostlock package in a checkout (before: lib/, after: plugins/module_utils)."""
    return tree / "lib" if (tree / "lib" / "hostlock").is_dir() else tree / "plugins" / "module_utils"


def install_collection(tree: Path, work: Path) -> Path:
    galaxy = str(VENV_BIN / "ansible-galaxy")
    env = dict(os.environ, ANSIBLE_NOCOLOR="1")
    subprocess.run([galaxy, "collection", "build", str(tree), "--output-path", str(work), "--force"],
                   env=env, check=True, capture_output=True)
    (tarball,) = work.glob("hostlock-core-*.tar.gz")
    subprocess.run([galaxy, "collection", "install", "--offline", "--force", "-p", str(work / "collections"),
                    str(tarball)], env=env, check=True, capture_output=True)
    return work / "collections"


PLAY = """- hosts: loc
  gather_facts: false
  tasks:
    - hostlock.core.lock_info: {name: bench, directory: "%(lockdir)s"}
    - hostlock.core.lock: {name: bench, directory: "%(lockdir)s", lease: 60}
      register: taken
    - hostlock.core.lock: {name: bench, directory: "%(lockdir)s", state: released, token: "{{ taken.token }}"}
    - hostlock.core.locked: {name: bench, directory: "%(lockdir)s", task: {module: ansible.builtin.ping}}
"""

LOCKED = """- hosts: loc
  gather_facts: false
  tasks:
%s"""
LOCKED_TASK = '    - hostlock.core.locked: {name: bench, directory: "%s", task: {module: ansible.builtin.ping}}\n'


class Side:
    def __init__(self, label: str, tree: Path, work: Path) -> None:
        self.label, self.tree, self.work = label, tree, work
        work.mkdir(parents=True, exist_ok=True)
        self.collections = install_collection(tree, work)
        self.lockdir = work / "locks"
        self.lockdir.mkdir(mode=0o700, exist_ok=True)
        (work / "inventory").write_text(f"loc ansible_connection=local ansible_python_interpreter={real_python()}\n")
        (work / "ansible.cfg").write_text("[defaults]\n")
        self.launcher = work / "hostlock"
        self.launcher.write_text(f"#!{real_python()} -IS\nimport sys\n\nsys.path.append({str(engine_dir(tree))!r})\n"
                                 "from hostlock.cli import main  # noqa: E402\n\nsys.exit(main())\n")
        self.launcher.chmod(0o755)

    def env(self, **extra: str) -> dict:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("ANSIBLE_", "HOSTLOCK_"))}
        env.update(ANSIBLE_CONFIG=str(self.work / "ansible.cfg"), ANSIBLE_COLLECTIONS_PATH=str(self.collections),
                   ANSIBLE_INVENTORY=str(self.work / "inventory"), ANSIBLE_NOCOLOR="1",
                   ANSIBLE_LOCAL_TEMP=str(self.work / "local-tmp"), **extra)
        return env

    def play(self, text: str, **extra: str) -> float:
        path = self.work / "play.yml"
        path.write_text(text)
        start = time.perf_counter()
        subprocess.run([str(VENV_BIN / "ansible-playbook"), str(path)], env=self.env(**extra), check=True,
                       capture_output=True)
        return time.perf_counter() - start

    def payloads(self) -> dict:
        remote = Path(tempfile.mkdtemp(dir=self.work, prefix="remote-"))
        self.play(PLAY % {"lockdir": self.lockdir}, ANSIBLE_KEEP_REMOTE_FILES="1", ANSIBLE_REMOTE_TMP=str(remote))
        out = {}
        for wrapper in sorted(remote.rglob("AnsiballZ_*.py")):
            m = re.search(r"(?:ZIPDATA|zip_data)\s*=\s*r?('''|\"\"\"|'|\")(.*?)\1", wrapper.read_text(), re.S)
            data = base64.b64decode(m.group(2))
            z = zipfile.ZipFile(io.BytesIO(data))
            engine = [i for i in z.infolist() if i.filename.startswith(ENGINE_ZIP)]
            out.setdefault(wrapper.stem[len("AnsiballZ_"):], {
                "zip": len(data), "engine_files": len(engine), "engine_bytes": sum(i.file_size for i in engine),
                "fleet_or_cli": sum(1 for i in engine if ELSEWHERE.search(i.filename))})
        return out

    def locked_task(self, tasks: int) -> float:
        one = self.play(LOCKED % (LOCKED_TASK % self.lockdir))
        many = self.play(LOCKED % ((LOCKED_TASK % self.lockdir) * (tasks + 1)))
        return (many - one) / tasks

    def startup(self) -> float:
        start = time.perf_counter()
        subprocess.run([str(self.launcher), "run", "-d", str(self.lockdir), "bench", "true"], check=True)
        return time.perf_counter() - start

    def engine_cycle(self, cycles: int) -> float:
        code = ("import sys, time\nsys.path.insert(0, %r)\nimport hostlock\nd = %r\n"
                "with hostlock.Lock('warm', directory=d):\n    pass\nt = time.perf_counter()\n"
                "for _ in range(%d):\n    with hostlock.Lock('bench', directory=d):\n        pass\n"
                "print(time.perf_counter() - t)\n") % (str(engine_dir(self.tree)), str(self.lockdir), cycles)
        out = subprocess.run([real_python(), "-I", "-S", "-c", code], check=True, capture_output=True, text=True)
        return float(out.stdout) / cycles


def table(before: Side, after: Side, args: argparse.Namespace) -> str:
    pay = {s.label: s.payloads() for s in (before, after)}
    cost: dict = {before.label: [], after.label: []}
    start: dict = {before.label: [], after.label: []}
    cyc: dict = {before.label: [], after.label: []}
    for s in (before, after) * args.repeats:  # interleaved: before, after, before, ...
        cost[s.label].append(s.locked_task(args.tasks))
        cyc[s.label].append(s.engine_cycle(args.cycles))
    for s in (before, after) * args.rounds:
        start[s.label].append(s.startup())
    b, a = before.label, after.label
    rows = ["| | before | after | after/before |", "| --- | --- | --- | --- |"]
    for module in ("lock", "lock_info", "locked"):
        pb, pa = pay[b][module], pay[a][module]
        kb = {k: (p["zip"] / 1024, p["engine_bytes"] / 1024) for k, p in (("b", pb), ("a", pa))}
        rows.append(f"| `{module}` payload (zip, base64-decoded) | {kb['b'][0]:.1f} KB | {kb['a'][0]:.1f} KB "
                    f"| {pa['zip'] / pb['zip']:.2f}x |")
        rows.append(f"| `{module}`: engine files / bytes in it | {pb['engine_files']} / {kb['b'][1]:.0f} KB "
                    f"| {pa['engine_files']} / {kb['a'][1]:.0f} KB | {pa['engine_bytes'] / pb['engine_bytes']:.2f}x |")
        rows.append(f"| `{module}`: fleet or command-line files in it | {pb['fleet_or_cli']} | {pa['fleet_or_cli']} "
                    "| |")
    med = {k: {n: statistics.median(v[k]) for n, v in (("cost", cost), ("start", start), ("cyc", cyc))} for k in (b, a)}
    rows.append(f"| a `locked` ping task, marginal (local, median of {args.repeats}) | {med[b]['cost'] * 1000:.0f} ms "
                f"| {med[a]['cost'] * 1000:.0f} ms | {med[a]['cost'] / med[b]['cost']:.2f}x |")
    rows.append(f"| `hostlock run NAME true` (launcher, median of {args.rounds}) "
                f"| {med[b]['start'] * 1000:.1f} ms | {med[a]['start'] * 1000:.1f} ms "
                f"| {med[a]['start'] / med[b]['start']:.2f}x |")
    rows.append(f"| engine: uncontended `with Lock(name)` cycle (median of {args.repeats} x {args.cycles}) "
                f"| {med[b]['cyc'] * 1e6:.1f} us | {med[a]['cyc'] * 1e6:.1f} us "
                f"| {med[a]['cyc'] / med[b]['cyc']:.2f}x |")
    clean = all(pay[a][m]["fleet_or_cli"] == 0 for m in ("lock", "lock_info", "locked"))
    start_ratio, cycle_ratio = med[a]["start"] / med[b]["start"], med[a]["cyc"] / med[b]["cyc"]
    rows += ["", f"- No payload carries fleet or command-line code: **{'met' if clean else 'MISSED'}**.",
             f"- Start-up and the engine no worse than before (<= {NOISE}x): start-up {start_ratio:.2f}x, engine "
             f"{cycle_ratio:.2f}x: **{'met' if max(start_ratio, cycle_ratio) <= NOISE else 'MISSED'}**."]
    head = (f"`python benchmarks/layout.py --docs docs/benchmarks.md` (before: {args.before}, the generated copy; "
            f"after: this checkout), both sides interleaved in one run on {os.cpu_count()} cores, Python "
            f"{sys.version.split()[0]}. Target: no payload carries fleet or command-line code, and start-up and the "
            "engine no worse than before (after/before within noise, about 1.05x).")
    return head + "\n\n" + "\n".join(rows) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", default=BEFORE, help=f"git ref of the 'before' side (default {BEFORE})")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--tasks", type=int, default=8, help="locked tasks per play beyond the first")
    ap.add_argument("--rounds", type=int, default=100, help="runs of hostlock run NAME true per side")
    ap.add_argument("--cycles", type=int, default=2000, help="lock cycles per engine sample")
    ap.add_argument("--docs", type=Path, help='write the table into this file\'s "## Layout" section')
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="hostlock-bench-layout-") as tmp:
        old = Path(tmp) / "before"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-q", str(old), args.before], check=True)
        try:
            text = table(Side("before", old, Path(tmp) / "b"), Side("after", ROOT, Path(tmp) / "a"), args)
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(old)], check=False)
    print(text)
    if args.docs:
        write_section(args.docs, f"{SECTION}\n\n{text}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
