"""What a lock costs an Ansible run, measured with real ansible-playbook runs (make bench-ansible).

Two questions, each answered by anchors measured in the same run:

1. hostlock.core.locked vs ansible.builtin.ping: plays of `locked`-wrapped ping tasks against plays of plain
   ping tasks, over the local connection and over real SSH (a throwaway sshd on 127.0.0.1). The cost of a
   task is its marginal cost: (time of a play of N+1 tasks - time of a play of 1 task) / N, so what a run
   pays once (starting the connection, building each module's AnsiballZ zip into the run's cache) is left
   out for both kinds alike; that one-time cost is reported on its own (1-task play - empty play). The lock
   is taken, the wrapped module run and the lock released inside one module run on the host, so the target
   is locked/ping <= 1.3 per task (printed as met or missed).
2. hostlock.core.serialize: the same ping play with and without the callback, runs interleaved; overhead in
   percent of the run (target: under 1%), plus the callback's own in-process cost per play.

Prints a Markdown table and writes it into docs/benchmarks.md under "## Ansible" (only that section).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "integration" / "ansible"))

from harness import VENV_BIN, Sshd, bare_python, build_collection  # noqa: E402 - path set up just above

SECTION = "## Ansible"
TARGET = 1.3  # locked / ping per task (issue 9)


def playbook(path: Path, tasks: int, kind: str, lockdir: str) -> Path:
    if kind == "ping":
        task = "    - ansible.builtin.ping:\n"
    elif kind == "locked":
        task = (
            "    - hostlock.core.locked:\n"
            "        name: bench\n"
            f"        directory: {lockdir}\n"
            "        task: {module: ansible.builtin.ping}\n"
        )
    else:
        raise ValueError(kind)
    body = "".join(task for _round in range(tasks)) or "    - ansible.builtin.meta: noop\n"
    path.write_text(f"- hosts: target\n  gather_facts: false\n  tasks:\n{body}")
    return path


class Runner:
    def __init__(self, work: Path, collections: Path, inventory_line: str) -> None:
        self.work = work
        self.inventory = work / "inventory.ini"
        self.inventory.write_text(inventory_line + "\n")
        (work / "ansible.cfg").write_text("[defaults]\n")
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
        self.env.update(
            ANSIBLE_CONFIG=str(work / "ansible.cfg"),
            ANSIBLE_COLLECTIONS_PATH=str(collections),
            ANSIBLE_INVENTORY=str(self.inventory),
            ANSIBLE_HOST_KEY_CHECKING="False",
            ANSIBLE_RETRY_FILES_ENABLED="False",
            ANSIBLE_NOCOLOR="1",
            ANSIBLE_LOCAL_TEMP=str(work / "tmp"),
            ANSIBLE_SSH_CONTROL_PATH_DIR=str(work / "cp"),
            HOSTLOCK_SERIALIZE_DIRECTORY=str(work / "ctl"),
        )
        (work / "ctl").mkdir(mode=0o700, exist_ok=True)

    def time(self, book: Path, callback: bool = False) -> float:
        env = dict(self.env)
        if callback:
            env["ANSIBLE_CALLBACKS_ENABLED"] = "hostlock.core.serialize"
        started = time.perf_counter()
        proc = subprocess.run(
            [str(VENV_BIN / "ansible-playbook"), str(book)],
            env=env,
            cwd=self.work,
            capture_output=True,
            text=True,
            check=False,
        )
        took = time.perf_counter() - started
        if proc.returncode:
            raise SystemExit(f"benchmark play {book.name} failed:\n{proc.stdout}{proc.stderr}")
        return took


def measure_connection(runner: Runner, work: Path, tasks: int, repeats: int) -> dict:
    lockdir = str(work / "locks")
    Path(lockdir).mkdir(mode=0o700, exist_ok=True)
    books = {kind: playbook(work / f"{kind}.yml", tasks + 1, kind, lockdir) for kind in ("ping", "locked")}
    books.update({f"{kind}1": playbook(work / f"{kind}1.yml", 1, kind, lockdir) for kind in ("ping", "locked")})
    books["empty"] = playbook(work / "empty.yml", 0, "ping", lockdir)
    runner.time(books["ping"])  # warm caches (ssh master, pyc) before measuring
    times: dict[str, list[float]] = {k: [] for k in books}
    for _round in range(repeats):  # interleaved, so drift on a shared machine hits every kind alike
        for kind, book in books.items():
            times[kind].append(runner.time(book))
    med = {k: statistics.median(v) for k, v in times.items()}
    per = {k: (med[k] - med[f"{k}1"]) / tasks for k in ("ping", "locked")}
    once = {k: med[f"{k}1"] - med["empty"] for k in ("ping", "locked")}
    # the ratio of each interleaved round, then the median: robust to a busy neighbour during one round
    ratios = [(lk - lk1) / (p - p1) for p, p1, lk, lk1 in
              zip(times["ping"], times["ping1"], times["locked"], times["locked1"], strict=True)]
    return dict(med=med, per=per, once=once, ratio=statistics.median(ratios), lo=min(ratios), hi=max(ratios))


def measure_callback(runner: Runner, work: Path, tasks: int, repeats: int) -> dict:
    book = playbook(work / "cb-ping.yml", tasks, "ping", str(work / "locks"))
    runner.time(book)
    plain, with_cb = [], []
    for _round in range(repeats):
        plain.append(runner.time(book))
        with_cb.append(runner.time(book, callback=True))
    a, b = statistics.median(plain), statistics.median(with_cb)
    paired = statistics.median((w - p) / p * 100 for p, w in zip(plain, with_cb, strict=True))
    return dict(plain=a, with_cb=b, overhead=paired, spread=(max(plain) - min(plain)) / a * 100)


def callback_hook_cost(collections: Path, work: Path, rounds: int = 200) -> tuple[float, float]:
    """The callback's own cost: (loading it with the engine, once; locking one host per play and releasing)."""
    code = f"""
import sys, time
from ansible.utils.collection_loader._collection_finder import _AnsibleCollectionFinder
_AnsibleCollectionFinder(paths=[{str(collections)!r}])._install()
from ansible.plugins.loader import callback_loader
callback_loader.get("ansible.builtin.minimal")  # the loader's own start-up: ansible-playbook pays it anyway
t = time.perf_counter()
cb = callback_loader.get("hostlock.core.serialize")
cb.set_options(direct=dict(directory={str(work / "ctl")!r}))
load = time.perf_counter() - t
t = time.perf_counter()
for _round in range({rounds}):
    cb._lock_hosts(["target"], "bench")
    cb._release_all()
print(load, (time.perf_counter() - t) / {rounds})
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    load, per_play = out.split()[-2:]
    return float(load), float(per_play)


def write_section(table: str) -> None:
    doc = REPO / "docs" / "benchmarks.md"
    text = doc.read_text() if doc.exists() else "# Benchmarks\n"
    section = f"{SECTION}\n\n{table}\n"
    if SECTION in text:
        before, _heading, after = text.partition(SECTION)
        nxt = after.find("\n## ")
        text = before + section + (after[nxt + 1 :] if nxt >= 0 else "")
    else:
        text = text.rstrip("\n") + "\n\n" + section
    doc.write_text(text)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", type=int, default=10, help="tasks per play (default 10)")
    ap.add_argument("--repeats", type=int, default=5, help="runs of each play; medians are reported (default 5)")
    ap.add_argument("--no-write", action="store_true", help="print only; leave docs/benchmarks.md alone")
    args = ap.parse_args()

    python = bare_python()
    with tempfile.TemporaryDirectory(prefix="hostlock-bench-ansible-") as tmp:
        work = Path(tmp)
        print("building and installing the collection ...", file=sys.stderr)
        collections = build_collection(work / "galaxy")
        sshd = Sshd(work / "sshd").start()
        try:
            rows = []
            for conn, line in (
                ("local", f"target ansible_connection=local ansible_python_interpreter={python}"),
                ("ssh", sshd.inventory_line("target", python)),
            ):
                print(
                    f"measuring {conn}: {args.repeats} x (empty, 1 and {args.tasks + 1} ping, "
                    f"1 and {args.tasks + 1} locked) ...",
                    file=sys.stderr,
                )
                cwork = work / conn
                cwork.mkdir()
                rows.append(
                    (conn, measure_connection(Runner(cwork, collections, line), cwork, args.tasks, args.repeats))
                )
            print("measuring the serialize callback ...", file=sys.stderr)
            cwork = work / "callback"
            cwork.mkdir()
            runner = Runner(cwork, collections, f"target ansible_connection=local ansible_python_interpreter={python}")
            (cwork / "locks").mkdir(mode=0o700)
            cb = measure_callback(runner, cwork, args.tasks, args.repeats * 2)
            load, hook = callback_hook_cost(collections, cwork)
        finally:
            sshd.stop()

    lines = [
        f"`make bench-ansible` (benchmarks/ansible_plugins.py --tasks {args.tasks} --repeats {args.repeats}), "
        f"ansible-core from .venv, target interpreter {python}, {platform.machine()}, {os.cpu_count()} cores; "
        f"medians of interleaved runs; load average {os.getloadavg()[0]:.1f} at the end. Per task = (play of "
        f"{args.tasks + 1} tasks - play of 1 task) / {args.tasks}; once per run = play of 1 task - empty play (the "
        "connection, and building that module's AnsiballZ zip into the run's cache).",
        "",
        "| connection | empty play | 1 ping / 1 locked | ping play | locked play | once per run: ping / locked "
        "| ping per task | locked per task | locked / ping per task (min-max of rounds) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for conn, r in rows:
        m, p, o = r["med"], r["per"], r["once"]
        lines.append(
            f"| {conn} | {m['empty']:.2f} s | {m['ping1']:.2f} s / {m['locked1']:.2f} s | {m['ping']:.2f} s "
            f"| {m['locked']:.2f} s | {o['ping'] * 1000:.0f} ms / {o['locked'] * 1000:.0f} ms "
            f"| {p['ping'] * 1000:.0f} ms | {p['locked'] * 1000:.0f} ms | **{r['ratio']:.2f}x** "
            f"({r['lo']:.2f}-{r['hi']:.2f}; target <= {TARGET}: {'met' if r['ratio'] <= TARGET else 'MISSED'}) |"
        )
    lines += [
        "",
        "| serialize callback | without | with | overhead (median of pairs) | run-to-run spread "
        "| callback's own cost |",
        "| --- | --- | --- | --- | --- | --- |",
        f"| {args.tasks} ping tasks, local | {cb['plain']:.2f} s | {cb['with_cb']:.2f} s | **{cb['overhead']:+.2f}%** "
        f"(target < 1%) | {cb['spread']:.1f}% | load {load * 1000:.1f} ms once + {hook * 1e6:.0f} us per host "
        f"per play = {(load + hook) / cb['plain'] * 100:.2f}% of this run |",
        "",
        "`locked` is one module run per task, like ping: the host-side runner takes the lock, runs the wrapped "
        "module's payload (built on the controller) in a forked child that reuses the runner's imports, and "
        "releases. Where its extra time goes (profiled with `python3.8 -X importtime`, timers in the action, "
        "the module and the runner, and the CPU time of each module run): on the host, importing the engine "
        "(AnsiballZ ships sources, so it is compiled on every run; CPython's path finder even compiled each "
        "zipped source twice, once to name its file: module_utils/_zipimport.py makes that once, 280 -> 250 ms "
        "of CPU per locked module run against ping's 230 ms) and running the wrapped module in the forked child "
        "(13-19 ms quiet: the payload's own AnsiballZ wrapper unpacks its zip, imports the module and runs it); "
        "on the controller, building the wrapped module's payload (4.5 ms per task quiet, once the run's "
        "AnsiballZ cache is warm) and sending a module three times ping's size (527 kB against 177 kB: the "
        "payload travels base64-encoded in the arguments; compiling it costs about 4 ms more on the host). Once "
        "per run, the first locked task builds two AnsiballZ zips (the runner's, with the engine, and the wrapped "
        "module's): that is the 'once per run' column, left out of the per-task figure. The callback's "
        "end-to-end difference is measured, but on a shared machine it drowns in the run-to-run spread; its own "
        "cost, timed in-process, is what it adds: loading the plugin and compiling the engine copy once "
        "(the collection loader keeps no .pyc), then a kernel lock taken and released per host per play.",
    ]
    table = "\n".join(lines)
    print(table)
    for conn, r in rows:
        verdict = "met" if r["ratio"] <= TARGET else "missed"
        print(f"locked/ping {conn}: {r['ratio']:.2f}x, target <= {TARGET}: {verdict}", file=sys.stderr)
    if not args.no_write:
        write_section(table)
        print(f"\nwrote the table into {REPO / 'docs' / 'benchmarks.md'} under '{SECTION}'", file=sys.stderr)


if __name__ == "__main__":
    main()
