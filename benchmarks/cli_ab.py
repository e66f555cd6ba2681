"""A/B of the commands users run in loops, for several engines side by side, in one run.

Each engine is a directory holding a `hostlock` package (a checkout's `plugins/module_utils`, or `REV` for a
commit of this repository, extracted with tests/cli_install.package_at); each is installed the cli role's way
(tests/cli_install.py: the role's launcher on the real interpreter, never a pyenv shim, the package bundled) and
run with the same commands: `hostlock run NAME true`, `hostlock flock LOCKFILE true`, `hostlock cron --name
NAME -- true` and, with etcd installed, `hostlock run --fleet URL NAME true` against one member started here,
beside `etcdctl lock NAME true` and the bare interpreter. Every round runs each command of each engine once, in
turn, so that load that comes and goes weighs on all alike; the table gives medians and each engine's ratio to
the first one's.

What it is for: deciding whether a piece of code bent for start-up time (docs/benchmarks.md, "Start-up
substitutes") buys what it costs, by measuring the engine with it against the same engine without it.

    .venv/bin/python benchmarks/cli_ab.py [--rounds N] BASE=14ae2f5 NOW=plugins/module_utils ...
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
import cli_install  # noqa: E402 - the role's launcher and bundle; path set up just above
import fleet_etcd  # noqa: E402 - starts and stops the etcd member; path set up just above


def once(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """Wall time and CPU time (user + system, of the command and the children it waited for) of one
    fork+exec+wait, in seconds; fails loudly if the command fails. CPU time is what load changes least: on a
    busy machine it tells what a piece of code costs when wall times drown it."""
    t0 = time.perf_counter()
    pid = os.fork()
    if pid == 0:
        try:
            os.execve(argv[0], argv, env)
        finally:
            os._exit(127)
    _pid, status, usage = os.wait4(pid, 0)
    took = time.perf_counter() - t0
    if status != 0:
        raise SystemExit(f"benchmark command failed ({status:#x}): {' '.join(argv)}")
    return took, usage.ru_utime + usage.ru_stime


def engine_dir(spec: str, work: Path) -> Path:
    """A directory holding the `hostlock` package: `spec` itself, or commit `spec` extracted under `work`."""
    path = Path(spec)
    if (path / "hostlock").is_dir():
        return path
    return cli_install.package_at(spec, work)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", maxsplit=1)[0])
    ap.add_argument("engines", nargs="+", metavar="LABEL=DIR_OR_REV")
    ap.add_argument("--rounds", type=int, default=200, help="rounds (default 200)")
    ap.add_argument("--python", default=cli_install.real_python(), help="interpreter the launchers use")
    ap.add_argument("--no-fleet", action="store_true", help="no etcd rows")
    args = ap.parse_args()
    load_before = os.getloadavg()[0]
    work = Path(tempfile.mkdtemp(prefix="hostlock-bench-ab."))
    etcd = fleet_etcd.start_etcd(str(work)) if fleet_etcd.have_etcd() and not args.no_fleet else None
    env = {"PATH": "/usr/bin:/bin"}
    rows: dict[str, dict[str, list[str]]] = {}  # command -> engine label -> argv
    labels = []
    try:
        for n, item in enumerate(args.engines):
            label, _eq, spec = item.partition("=")
            labels.append(label)
            place = work / ("e%d" % n)
            place.mkdir()
            launcher = str(cli_install.installed(place, args.python, engine_dir(spec, place)))
            (place / "locks").mkdir(mode=0o700)
            cmds = {
                "`hostlock run NAME true`": [launcher, "run", "ab-%d" % n, "true"],
                "`hostlock flock LOCKFILE true`": [launcher, "flock", str(place / "f.lock"), "true"],
                "`hostlock cron --name NAME -- true`": [launcher, "cron", "--name", "ab-cron-%d" % n, "--", "true"],
            }
            if etcd is not None:
                fleet_run = [launcher, "run", "--fleet", etcd.url, "ab-f%d" % n, "true"]
                cmds["`hostlock run --fleet URL NAME true`"] = fleet_run
            for k, argv in cmds.items():
                rows.setdefault(k, {})[label] = argv
        anchors = {"`python3 -I -S -c pass` (bare interpreter)": [args.python, "-I", "-S", "-c", "pass"]}
        if etcd is not None:
            anchors["`etcdctl lock NAME true`"] = [fleet_etcd.ETCDCTL, "--endpoints", etcd.endpoint, "lock",
                                                   "ab-etcdctl", "true"]
        for k, argv in anchors.items():
            rows[k] = {"": argv}
        envs = {label: dict(env, HOSTLOCK_DIR=str(work / ("e%d" % n) / "locks"), ETCDCTL_API="3")
                for n, label in enumerate(labels)}
        envs[""] = dict(env, ETCDCTL_API="3")
        runs = [(k, label, argv) for k, per in rows.items() for label, argv in per.items()]
        for _k, label, argv in runs:  # warm up: page cache, lock files created
            for _round in range(3):
                once(argv, envs[label])
        times: dict[tuple[str, str], list[tuple[float, float]]] = {(k, label): [] for k, label, _a in runs}
        for _round in range(args.rounds):
            for k, label, argv in runs:
                times[(k, label)].append(once(argv, envs[label]))
    finally:
        if etcd is not None:
            etcd.stop()
        shutil.rmtree(work, ignore_errors=True)
    print(f"Python {args.python}, {os.cpu_count()} CPUs; {args.rounds} rounds, interleaved; load average "
          f"{load_before:.2f} before, {os.getloadavg()[0]:.2f} after.")
    for what, index in (("wall time", 0), ("CPU time (user + system)", 1)):
        med = {key: statistics.median(x[index] for x in v) * 1000 for key, v in times.items()}
        print(f"\nMedian {what}:\n")
        print("| command | " + " | ".join(labels) + " | " + " | ".join(f"{x} / {labels[0]}" for x in labels[1:])
              + " |")
        print("| --- |" + " ---: |" * (2 * len(labels) - 1))
        for k, per in rows.items():
            if "" in per:
                print(f"| {k} | {med[(k, '')]:.2f} ms |" + " |" * (2 * len(labels) - 2))
                continue
            base = med[(k, labels[0])]
            cells = [f"{med[(k, x)]:.2f} ms" for x in labels] + [f"{med[(k, x)] / base:.3f}" for x in labels[1:]]
            print(f"| {k} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
