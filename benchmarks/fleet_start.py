"""`hostlock run --fleet URL NAME true` against `etcdctl lock NAME true`, many times, interleaved: the start-up
A/B behind docs/benchmarks.md's Fleet notes (make bench-fleet's 20 samples per row do not resolve 0.5 ms).

Each engine is installed the cli role's way (tests/cli_install.py: the role's launcher, the package copied,
byte-compiled and bundled when it has cli/bundle.py) from a git revision or this checkout; one round runs
`etcdctl lock` once, then every launcher once, on one etcd member started here (tests/fleet_etcd.py). Prints
each command's median, its ratio to etcdctl's, and its ratio to the first engine's.

    .venv/bin/python benchmarks/fleet_start.py --rev 34477e2 --rev HEAD --also-unbundled --rounds 200
    .venv/bin/python benchmarks/fleet_start.py --python /usr/bin/python3 --rev HEAD
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
import cli_install  # noqa: E402 - the role's launcher and bundle; path set up just above
import fleet_etcd  # noqa: E402 - starts and stops the etcd member


def engine(rev: str, work: Path) -> Path:
    """The directory holding the hostlock package of `rev` (WORKTREE: this checkout's files as they are)."""
    return HERE.parent / "plugins" / "module_utils" if rev == "WORKTREE" else cli_install.package_at(rev, work)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", maxsplit=1)[0])
    ap.add_argument("--rev", action="append", help="a git revision to install (repeatable; WORKTREE: the files "
                    "as they are; default WORKTREE)")
    ap.add_argument("--python", default=cli_install.real_python(), help="the launchers' interpreter")
    ap.add_argument("--also-unbundled", action="store_true", help="also the last engine without its bundle")
    ap.add_argument("--rounds", type=int, default=150)
    args = ap.parse_args()
    revs = args.rev or ["WORKTREE"]
    with tempfile.TemporaryDirectory(prefix="hostlock-fleet-start.") as tmp:
        work = Path(tmp)
        etcd = fleet_etcd.start_etcd(str(work))
        try:
            cmds = {"etcdctl lock NAME true": [fleet_etcd.ETCDCTL, "--endpoints", etcd.endpoint, "lock", "e", "true"]}
            for k, rev in enumerate(revs):
                hl = cli_install.installed(work, args.python, engine(rev, work), "hl%d" % k)
                cmds["%s (%s)" % (rev, "bundled" if (work / ("hl%d.lib" % k) / cli_install.BUNDLE).exists()
                                  else "files")] = [str(hl), "run", "--fleet", etcd.url, "n%d" % k, "true"]
            if args.also_unbundled:
                k = len(revs) - 1
                lib = work / ("hl%d.lib" % k)
                plain = work / "plain.lib"
                subprocess.run(["cp", "-a", str(lib), str(plain)], check=True)
                (plain / cli_install.BUNDLE).unlink(missing_ok=True)
                hl = cli_install.install(work / "plain", args.python, plain, bundled=False)
                cmds["%s (files)" % revs[-1]] = [str(hl), "run", "--fleet", etcd.url, "plain", "true"]
            env = {"PATH": "/usr/bin:/bin", "ETCDCTL_API": "3"}
            for argv in cmds.values():  # once first: page cache, etcd's connections
                subprocess.run(argv, env=env, check=True, stdout=subprocess.DEVNULL)
            got: dict = {k: [] for k in cmds}
            load = os.getloadavg()[0]
            for _r in range(args.rounds):
                for label, argv in cmds.items():
                    t0 = time.perf_counter_ns()
                    subprocess.run(argv, env=env, check=True, stdout=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
                    got[label].append((time.perf_counter_ns() - t0) / 1e6)
        finally:
            etcd.stop()
    base = statistics.median(got["etcdctl lock NAME true"])
    first = None
    print("%s, %d rounds, interpreter %s, load %.2f before, %.2f after"
          % (time.strftime("%Y-%m-%d"), args.rounds, args.python, load, os.getloadavg()[0]))
    for label, ms in got.items():
        m = statistics.median(ms)
        if first is None and label != "etcdctl lock NAME true":
            first = m
        than_first = "  %5.3fx the first" % (m / first) if first else ""
        print("%-36s %7.2f ms  %5.2fx etcdctl%s" % (label, m, m / base, than_first))
    return 0


if __name__ == "__main__":
    sys.exit(main())
