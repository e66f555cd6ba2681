"""What a lock costs an Ansible run, measured with real ansible-playbook runs (make bench-ansible).

Two questions, each answered by anchors measured in the same run:

1. hostlock.core.locked vs ansible.builtin.ping: plays of `locked`-wrapped ping tasks against plays of plain
   ping tasks, over the local connection and over real SSH (a throwaway sshd on 127.0.0.1). The cost of a
   task is its marginal cost: (time of a play of N+1 tasks - time of a play of 1 task) / N, so what a run
   pays once (starting the connection, building each module's AnsiballZ zip into the run's cache) is left
   out for both kinds alike; that one-time cost is reported on its own (1-task play - empty play). The lock
   is taken, the wrapped module run and the lock released inside one module run on the host, so the target
   is locked/bare <= 1.15 per task for ping and command, <= 1.25 for template and copy (met or missed).
2. hostlock.core.serialize: the same ping play with and without the callback, runs interleaved (local and
   SSH); overhead in percent of the run, the median of the pairs' ratios (target: <= 3%, issue 40), plus the
   callback's own in-process cost per play.

Prints a Markdown table and writes it into docs/benchmarks.md under "## Ansible" (only that section).
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "tests" / "integration" / "ansible"), str(REPO / "tests")]  # harness, and its ports

from docsection import write_section  # noqa: E402 - benchmarks/, the script's own directory
from harness import VENV_BIN, Sshd, bare_python, build_collection  # noqa: E402 - path set up just above

SECTION = "## Ansible"
# locked / bare per task: issue 40's targets, a command (ping, command) and a task with its own action plugin
TARGETS = {"ping": 1.15, "command": 1.15, "template": 1.25, "copy": 1.25}
CALLBACK_TARGET = 3.0  # serialize's overhead on a 10-task play, percent (issue 40 item 9)


# What each measured task does: a bare task, and the same task wrapped in hostlock.core.locked.
# ping has no action plugin of its own (one module run on the host, the lock inside it); template and copy do
# (their action plugin renders or transfers here and runs stat/copy/file modules there), so locked runs them
# under a heartbeat lease on the host.
PAIRS = (("ping", "locked"), ("command", "locked-command"), ("template", "locked-template"), ("copy", "locked-copy"))
KINDS = tuple(k for pair in PAIRS for k in pair)


def bare_task(kind: str, work: Path) -> str:
    """The bare task's module and args, one YAML flow mapping (dest per kind: each is unchanged after its first run)."""
    if kind == "ping":
        return "{ansible.builtin.ping: {}}"
    if kind == "command":  # an action plugin that only runs its module: locked runs it in one module run, as ping
        return "{ansible.builtin.command: {cmd: /bin/true}}"
    dest = f'dest: "{work}/out/{{{{ bench_kind }}}}.txt", mode: "0644"'
    if kind == "template":
        return f"{{ansible.builtin.template: {{src: {work}/bench.j2, {dest}}}}}"
    if kind == "copy":
        return f"{{ansible.builtin.copy: {{src: {work}/bench.src, {dest}}}}}"
    raise ValueError(kind)


def playbook(path: Path, tasks: int, kind: str, lockdir: str) -> Path:
    work = path.parent
    (work / "bench.j2").write_text("rendered for {{ inventory_hostname }} by {{ bench_kind }}\n")
    (work / "bench.src").write_text("copied as it is\n")
    (work / "out").mkdir(exist_ok=True)
    bare = kind.removeprefix("locked-") if kind != "locked" else "ping"
    if kind.startswith("locked"):
        task = (
            "    - hostlock.core.locked:\n"
            "        name: bench\n"
            f"        directory: {lockdir}\n"
            f"        task: {bare_task(bare, work)}\n"
        )
    else:
        task = f"    - {bare_task(kind, work)[1:-1]}\n"
    body = "".join(task for _round in range(tasks)) or "    - ansible.builtin.meta: noop\n"
    path.write_text(f"- hosts: target\n  gather_facts: false\n  vars: {{bench_kind: {kind}}}\n  tasks:\n{body}")
    return path


class Runner:
    def __init__(self, work: Path, collections: Path, inventory_line: str) -> None:
        self.cpu = 0.0  # CPU seconds of the last run (time())
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

    def time(self, book: Path, callback: bool = False, collections: Path | None = None) -> float:
        env = dict(self.env)
        if callback:
            env["ANSIBLE_CALLBACKS_ENABLED"] = "hostlock.core.serialize"
        if collections is not None:
            env["ANSIBLE_COLLECTIONS_PATH"] = str(collections)
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
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
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        # CPU time of ansible-playbook and what it waited for (workers, local modules; not sshd's side): a
        # figure a busy neighbour shifts much less than the wall clock
        self.cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
        if proc.returncode:
            raise SystemExit(f"benchmark play {book.name} failed:\n{proc.stdout}{proc.stderr}")
        return took


def runner_for(work: Path, collections: Path, inventory_line: str, pipelining: bool) -> Runner:
    runner = Runner(work, collections, inventory_line)
    if pipelining:
        runner.env["ANSIBLE_PIPELINING"] = "True"
    return runner


def measure_connection(runner: Runner, work: Path, tasks: int, repeats: int, pairs: tuple = PAIRS) -> dict:
    lockdir = str(work / "locks")
    Path(lockdir).mkdir(mode=0o700, exist_ok=True)
    kinds = [k for pair in pairs for k in pair]
    books = {kind: playbook(work / f"{kind}.yml", tasks + 1, kind, lockdir) for kind in kinds}
    books.update({f"{kind}1": playbook(work / f"{kind}1.yml", 1, kind, lockdir) for kind in kinds})
    books["empty"] = playbook(work / "empty.yml", 0, "ping", lockdir)
    runner.time(books[kinds[0]])  # warm caches (ssh master, pyc) before measuring
    for kind in kinds:  # and give each kind's destination its content: every measured run finds it unchanged
        runner.time(books[f"{kind}1"])
    times: dict[str, list[float]] = {k: [] for k in books}
    for _round in range(repeats):  # interleaved, so drift on a shared machine hits every kind alike
        for kind, book in books.items():
            times[kind].append(runner.time(book))
    med = {k: statistics.median(v) for k, v in times.items()}
    per = {k: (med[k] - med[f"{k}1"]) / tasks for k in kinds}
    once = {k: med[f"{k}1"] - med["empty"] for k in kinds}
    ratio = {}
    for bare, locked in pairs:
        # the ratio of each interleaved round, then the median: robust to a busy neighbour during one round
        ratios = [
            (lk - lk1) / (p - p1)
            for p, p1, lk, lk1 in zip(times[bare], times[f"{bare}1"], times[locked], times[f"{locked}1"], strict=True)
        ]
        ratio[locked] = (statistics.median(ratios), min(ratios), max(ratios))
    return dict(med=med, per=per, once=once, ratio=ratio)


def measure_callback(runner: Runner, work: Path, tasks: int, repeats: int, baseline: Path | None = None) -> dict:
    """The play without and with the callback, interleaved; with `baseline` (another build's collections
    path), the callback of that build too, in the same rounds: before and after under the same load."""
    book = playbook(work / "cb-ping.yml", tasks, "ping", str(work / "locks"))
    runner.time(book)
    runner.time(book, callback=True)  # the first run on a host waits there (nothing is known of it yet)
    if baseline is not None:
        runner.time(book, callback=True, collections=baseline)
    plain, with_cb, with_base = [], [], []
    cpu: dict[str, list[float]] = dict(plain=[], with_cb=[], with_base=[])
    for _round in range(repeats):
        plain.append(runner.time(book))
        cpu["plain"].append(runner.cpu)
        with_cb.append(runner.time(book, callback=True))
        cpu["with_cb"].append(runner.cpu)
        if baseline is not None:
            with_base.append(runner.time(book, callback=True, collections=baseline))
            cpu["with_base"].append(runner.cpu)

    def overhead(times: list[float], key: str = "with_cb") -> dict:
        ratios = [(w - p) / p * 100 for p, w in zip(plain, times, strict=True)]
        cpu_ratios = [(w - p) / p * 100 for p, w in zip(cpu["plain"], cpu[key], strict=True)]
        return dict(with_cb=statistics.median(times), overhead=statistics.median(ratios), low=min(ratios),
                    high=max(ratios), pairs=len(ratios), cpu=statistics.median(cpu_ratios))

    a = statistics.median(plain)
    out = dict(plain=a, spread=(max(plain) - min(plain)) / a * 100, **overhead(with_cb))
    if baseline is not None:
        out["baseline"] = overhead(with_base, "with_base")
    return out


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


def kept_callback_table(docs: Path) -> list[str]:
    """The serialize callback's table as docs/benchmarks.md has it (for a --no-callback run, which measured none),
    with a line saying it is from an earlier run; [] when there is none."""
    text = docs.read_text() if docs.exists() else ""
    start = text.find(f"{SECTION}\n")
    if start < 0:
        return []
    section = text[start:].split("\n## ", 1)[0].splitlines()
    rows = [i for i, line in enumerate(section) if line.startswith("| serialize callback |")]
    if not rows:
        return []
    end = rows[0]
    while end < len(section) and section[end].startswith("|"):
        end += 1
    return ["", "The serialize callback's table below is from the last full run (this one was --no-callback):", "",
            *section[rows[0]:end]]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", type=int, default=10, help="tasks per play (default 10)")
    ap.add_argument("--repeats", type=int, default=7, help="runs of each play; medians are reported (default 7)")
    ap.add_argument("--no-write", action="store_true", help="print only; leave docs/benchmarks.md alone")
    ap.add_argument(
        "--tasks-of",
        default=",".join(b for b, _l in PAIRS),
        help="bare tasks to measure against their locked form (default ping,command,template,copy)",
    )
    ap.add_argument("--connections", default="local,ssh", help="local, ssh or both (default local,ssh)")
    ap.add_argument("--no-callback", action="store_true", help="skip the serialize callback's rows")
    ap.add_argument("--callback-only", action="store_true", help="only the serialize callback's rows")
    ap.add_argument("--baseline", metavar="COMMIT", help="also the callback of this commit, in the same rounds")
    ap.add_argument("--pipelining", action="store_true", help="ANSIBLE_PIPELINING=True (default: Ansible's, off)")
    args = ap.parse_args()
    wanted = args.tasks_of.split(",")
    pairs = tuple(pair for pair in PAIRS if pair[0] in wanted)
    if len(pairs) != len(wanted):
        ap.error(f"--tasks-of takes {', '.join(b for b, _l in PAIRS)}")
    # --no-callback with everything else whole writes the locked table and keeps the callback table on record
    partial = (len(pairs) != len(PAIRS) or args.connections != "local,ssh" or args.pipelining
               or args.callback_only)
    if not args.no_write and partial:
        ap.error("a partial run prints only: add --no-write")

    python = bare_python()
    with tempfile.TemporaryDirectory(prefix="hostlock-bench-ansible-") as tmp:
        work = Path(tmp)
        print("building and installing the collection ...", file=sys.stderr)
        collections = build_collection(work / "galaxy")
        baseline = None
        if args.baseline:
            tree = work / "baseline-tree"
            tree.mkdir()
            archive = subprocess.run(["git", "-C", str(REPO), "archive", args.baseline], capture_output=True,
                                     check=True)
            subprocess.run(["tar", "-x", "-C", str(tree)], input=archive.stdout, check=True)
            baseline = build_collection(work / "baseline", source=tree)
        sshd = Sshd(work / "sshd").start()
        try:
            rows = []
            lines_of = {
                "local": f"target ansible_connection=local ansible_python_interpreter={python}",
                "ssh": sshd.inventory_line("target", python),
            }
            for conn, line in lines_of.items():
                if conn not in args.connections.split(",") or args.callback_only:
                    continue
                print(
                    f"measuring {conn}: {args.repeats} x (empty, 1 and {args.tasks + 1} tasks of "
                    f"{', '.join(k for pair in pairs for k in pair)}) ...",
                    file=sys.stderr,
                )
                cwork = work / conn
                cwork.mkdir()
                rows.append(
                    (
                        conn,
                        measure_connection(
                            runner_for(cwork, collections, line, args.pipelining),
                            cwork,
                            args.tasks,
                            args.repeats,
                            pairs,
                        ),
                    )
                )
            cbs = []
            if not args.no_callback:
                for conn, line in lines_of.items():
                    if conn not in args.connections.split(","):
                        continue
                    print(f"measuring the serialize callback, {conn} ...", file=sys.stderr)
                    cwork = work / f"callback-{conn}"
                    cwork.mkdir()
                    runner = runner_for(cwork, collections, line, args.pipelining)
                    (cwork / "locks").mkdir(mode=0o700)
                    cbs.append((conn, measure_callback(runner, cwork, args.tasks, max(7, args.repeats * 2), baseline)))
                load, hook = callback_hook_cost(collections, work / f"callback-{cbs[0][0]}")
        finally:
            sshd.stop()

    lines = [
        f"`make bench-ansible` (benchmarks/ansible_plugins.py --tasks {args.tasks} --repeats {args.repeats}"
        f"{' --pipelining' if args.pipelining else ''}), "
        f"ansible-core from .venv, target interpreter {python}, {platform.machine()}, {os.cpu_count()} cores; "
        f"medians of interleaved runs; load average {os.getloadavg()[0]:.1f} at the end. Per task = (play of "
        f"{args.tasks + 1} tasks - play of 1 task) / {args.tasks}; once per run = play of 1 task - empty play (the "
        "connection, and building that module's AnsiballZ zip into the run's cache).",
        "",
        "| connection | task | empty play | 1 bare / 1 locked | bare play | locked play "
        "| once per run: bare / locked | bare per task | locked per task "
        "| locked / bare per task (min-max of rounds) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for conn, r in rows:
        m, p, o = r["med"], r["per"], r["once"]
        for bare, locked in pairs:
            ratio, lo, hi = r["ratio"][locked]
            lines.append(
                f"| {conn} | {bare} | {m['empty']:.2f} s | {m[bare + '1']:.2f} s / {m[locked + '1']:.2f} s "
                f"| {m[bare]:.2f} s | {m[locked]:.2f} s | {o[bare] * 1000:.0f} ms / {o[locked] * 1000:.0f} ms "
                f"| {p[bare] * 1000:.0f} ms | {p[locked] * 1000:.0f} ms | **{ratio:.2f}x** "
                f"({lo:.2f}-{hi:.2f}; target <= {TARGETS[bare]}: {'met' if ratio <= TARGETS[bare] else 'MISSED'}) |"
            )
    if not cbs and not args.no_write:
        lines += kept_callback_table(REPO / "docs" / "benchmarks.md")
    if cbs:
        lines += [
            "",
            "| serialize callback | without | with | overhead (median of pairs, min-max) | CPU time overhead "
            "| run-to-run spread | callback's own cost |",
            "| --- | --- | --- | --- | --- | --- | --- |",
        ]
        for conn, cb in cbs:
            for which, row in (("", cb), (f" ({args.baseline})", cb.get("baseline"))):
                if row is None:
                    continue
                verdict = "met" if row["overhead"] <= CALLBACK_TARGET else "MISSED"
                lines.append(
                    f"| {args.tasks} ping tasks, {conn}{which} | {cb['plain']:.2f} s | {row['with_cb']:.2f} s "
                    f"| **{row['overhead']:+.2f}%** ({row['low']:+.1f} to {row['high']:+.1f}, {row['pairs']} pairs; "
                    f"target <= {CALLBACK_TARGET:.0f}%: {verdict}) | {row['cpu']:+.2f}% | {cb['spread']:.1f}% "
                    f"| load {load * 1000:.1f} ms once + {hook * 1e6:.0f} us per host per play "
                    f"= {(load + hook) / cb['plain'] * 100:.2f}% of this run |"
                )
    lines += [
        "",
        "`locked` is one module run per task, like ping: the host-side runner takes the lock, runs the wrapped "
        "module's payload (built on the controller) in a forked child that reuses the runner's imports, and "
        "releases. Where the time goes, profiled on the host with the AnsiballZ files kept "
        "(ANSIBLE_KEEP_REMOTE_FILES=1, python3.8, quiet, timers in the wrapper, the module and the runner, cProfile "
        "in the child): a plain command module run is about 210 ms (interpreter start and wrapper 30 ms, ansible's "
        "module_utils compiled from the zip's sources and the module's work 163 ms, the interpreter's teardown "
        "15 ms). The runner adds a bigger wrapper to compile (the wrapped payload and the compiled engine in its "
        "arguments, ~750 kB of script: +5 ms), the engine's import from the code the controller kept "
        "(module_utils/_zipimport.py, plugin_utils/_hostcode.py: ~8 ms), AnsibleModule and the lock (~6 ms), the "
        "fork (~5 ms); the wrapped module runs in the child in 16-21 ms (its wrapper, its own module file, its "
        "work). Two things were cut in issue 40's last step: the runner skips the interpreter's teardown "
        "(module_utils/_runner.end_now: the exit handlers and the wrapper's clean-up, then os._exit; 263 to "
        "233 ms on the host), and a host's later locked tasks no longer send the whole compiled engine back "
        "(~155 kB, re-exported and stored again on every task: two modules imported before the code arrives "
        "were counted as compiled). On the controller the action adds about 13 ms a task (its checks 1.4 ms, "
        "resolving the module 1.8 ms, building the wrapped module's payload 5 ms, the bigger runner payload "
        "2 ms). Once per run, the first locked task builds two AnsiballZ zips (the runner's, with the engine, "
        "and the wrapped module's) and compiles the engine: that is the 'once per run' column, left out of the "
        "per-task figure. The callback's end-to-end difference is measured, but on a shared machine it drowns "
        "in the run-to-run spread; its own cost, timed in-process, is what it adds: loading the plugin and "
        "compiling the engine copy once (the collection loader keeps no .pyc), then a kernel lock taken and "
        "released per host per play.",
        "",
        "A locked `template` or `copy` (a module with its own action plugin) cannot be one module run: its action "
        "renders and transfers on the controller and runs its own modules on the host (stat, then copy or file), "
        "so it runs under a heartbeat lease on the host, taken in the task's first module run: that run (the "
        "stat) goes through the `locked` runner, which takes the lease, runs the stat under it and answers with "
        "both; the controller forks the lease's heartbeat, the task's next steps run as they would alone (with "
        "the lease's in-flight mark), and the lease is released by one short `python -I -S` run on the host that "
        "imports only the engine's own lease client (plugin_utils/_engine_call.py). Before issue 23's last step "
        "these rows paid two extra lock module runs (take and release, each about a bare task's module run: "
        "2.09-2.20x locally, 1.93-2.15x over SSH); now they pay the runner in the first step (the lease's holder, "
        "a payload twice the stat's, the engine's import: compiled only on a host's first locked task) and the "
        "short release run (which runs the kept code too, and whose lease client imports neither socket nor "
        "hashlib). Timed in the action (local, python3.8 on the host, quiet): the first step 234-238 ms against "
        "a plain module run's ~180 ms (250-300 ms while it compiled the engine), the heartbeat's start 7-8 ms, "
        "the release run about 30 ms (was 30-45 ms); over SSH: the first step 265 ms, the release run 32-35 ms.",
    ]
    table = "\n".join(lines)
    print(table)
    for conn, r in rows:
        for bare, locked in pairs:
            ratio = r["ratio"][locked][0]
            verdict = "met" if ratio <= TARGETS[bare] else "missed"
            print(f"{locked}/{bare} {conn}: {ratio:.2f}x, target <= {TARGETS[bare]}: {verdict}", file=sys.stderr)
    for conn, cb in cbs:
        verdict = "met" if cb["overhead"] <= CALLBACK_TARGET else "missed"
        before = f" ({args.baseline}: {cb['baseline']['overhead']:+.2f}%)" if "baseline" in cb else ""
        print(f"serialize {conn}: {cb['overhead']:+.2f}% (CPU {cb['cpu']:+.2f}%){before}, target <= "
              f"{CALLBACK_TARGET:.0f}%: {verdict}",
              file=sys.stderr)
    if not args.no_write:
        write_section(REPO / "docs" / "benchmarks.md", f"{SECTION}\n\n{table}\n")
        print(f"\nwrote the table into {REPO / 'docs' / 'benchmarks.md'} under '{SECTION}'", file=sys.stderr)


if __name__ == "__main__":
    main()
