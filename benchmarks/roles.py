"""The cli and cron roles on one fresh host, before and after the one-transfer install, in one run (make bench-roles).

`--before REF` (default: the last commit whose cli role copied the package one module run per file) is the anchor;
the working tree is "after". Each round gives each side a fresh host (tests/integration/roles/roletarget.py: a
target.sh mount namespace, ansible-playbook run inside it on the local connection, /usr/bin/python3 on the host)
and times, with `time.monotonic()` around the whole ansible-playbook process, the playbook applying both roles
(the cli role's defaults, one cron job) three ways: in check mode on the fresh host, converging it, and again on
the converged host (idempotent). Sides alternate which goes first from round to round; medians over the rounds.
Both sides install this checkout's package (the before side's hostlock_cli_source_dir), and the cli role's
installed trees are compared (paths, types, modes, owners, contents).

Prints a Markdown table and, with --docs, writes it into the file's "## Roles" section.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import sys
import tempfile
from datetime import date
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "integration" / "roles"))

from docsection import write_section  # noqa: E402 - benchmarks/ is the script's directory
from roletarget import CLI_PATHS, HOST_PYTHON, Target, collection_at, collection_here, differences  # noqa: E402

SECTION = "## Roles"
BEFORE = "14ae2f5"  # main before the cli role installed in one module run (issue 40 item 8)
PACKAGE = REPO / "plugins" / "module_utils" / "hostlock"
STEPS = ("check", "converge", "again")
TARGETS = {"converge": 15.0, "again": 10.0}  # seconds, one local host (issue 40)


def one_round(side: str, collections: Path, work: Path, extra: tuple[str, ...]) -> tuple[dict, dict, dict]:
    """Seconds and recap per step on one fresh host, and the cli role's tree after converging."""
    seconds, recaps = {}, {}
    with Target(work) as host:
        for step in STEPS:
            play = host.play(collections, *extra, *(("--check",) if step == "check" else ()))
            if play.rc != 0:
                raise SystemExit(f"{side} {step} failed:\n{play.out[-4000:]}")
            seconds[step], recaps[step] = play.seconds, play.recap()
        tree = host.snapshot(CLI_PATHS)
    return seconds, recaps, tree


def table(results: dict, recaps: dict, same: list[str], before: str, load: tuple[float, float]) -> str:
    med = {side: {s: statistics.median(r[s] for r in rounds) for s in STEPS} for side, rounds in results.items()}
    head = (f"```\nmake bench-roles  # = .venv/bin/python benchmarks/roles.py --docs docs/benchmarks.md\n```\n\n"
            f"{date.today().isoformat()}, ansible-core from .venv, host interpreter {HOST_PYTHON}, "
            f"{platform.machine()}, {os.cpu_count()} CPUs; load average (1 min) {load[0]:.2f} before, "
            f"{load[1]:.2f} after (the machine is shared: the ratio is the comparable figure). "
            f"One fresh host per side and round (a target.sh namespace, local connection), the cli role's defaults "
            f"and one cron job; median of {len(next(iter(results.values())))} rounds, sides interleaved. "
            f"Before: commit {before}, installing this checkout's package.\n")
    rows = ["| | check mode, fresh host | converge | idempotent re-run | tasks ok / changed / skipped (converge) |",
            "| --- | ---: | ---: | ---: | --- |"]
    for side, label in (("before", f"before ({before}: a copy per file)"), ("after", "after (one module run)")):
        r = recaps[side]["converge"]
        rows.append(f"| {label} | " + " | ".join(f"{med[side][s]:.1f} s" for s in STEPS)
                    + f" | {r['ok']} / {r['changed']} / {r['skipped']} |")
    rows.append("| after / before | " + " | ".join(f"{med['after'][s] / med['before'][s]:.2f}x" for s in STEPS)
                + " | |")
    verdicts = []
    for step, limit in TARGETS.items():
        got = med["after"][step]
        word = "met" if got <= limit else "**MISSED**"
        verdicts.append(f"- {word}: {'converge' if step == 'converge' else 'idempotent re-run'} <= {limit:.0f} s: "
                        f"{got:.1f} s ({med['after'][step] / med['before'][step]:.2f}x before)")
    again = recaps["after"]["again"]["changed"]
    verdicts.append(f"- {'met' if again == 0 else '**MISSED**'}: the re-run changes nothing (changed={again})")
    verdicts.append("- met: the cli role's installed tree is the same as before's (paths, types, modes, owners, "
                    "contents)" if not same else "- **MISSED**: installed trees differ:\n  " + "\n  ".join(same))
    return head + "\n" + "\n".join(rows) + "\n\n" + "\n".join(verdicts) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", default=BEFORE, help=f"git ref of the 'before' side (default {BEFORE})")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--docs", type=Path, help="write the table into this file's '## Roles' section")
    args = ap.parse_args()
    # Not under /tmp: target.sh hides it inside the target and refuses a WORKDIR there.
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    cache.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="hostlock-bench-roles.", dir=cache))
    try:
        sides = {"before": (collection_at(args.before, work / "before-collection"),
                            ("-e", f"hostlock_cli_source_dir={PACKAGE}")),
                 "after": (collection_here(work / "after-collection"), ())}
        results: dict[str, list[dict]] = {"before": [], "after": []}
        recaps: dict[str, dict] = {}
        trees: dict[str, dict] = {}
        load0 = os.getloadavg()[0]
        for n in range(args.rounds):
            for side in (("before", "after") if n % 2 == 0 else ("after", "before")):
                coll, extra = sides[side]
                seconds, recaps[side], trees[side] = one_round(side, coll, work / f"{side}-{n}", extra)
                results[side].append(seconds)
                print(f"round {n + 1} {side}: " + ", ".join(f"{s} {seconds[s]:.1f} s" for s in STEPS),
                      file=sys.stderr)
        text = table(results, recaps, differences(trees["before"], trees["after"]), args.before,
                     (load0, os.getloadavg()[0]))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(text)
    if args.docs:
        write_section(args.docs, f"{SECTION}\n\n{text}\n")
        print(f"wrote the table into {args.docs} under '{SECTION}'", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
