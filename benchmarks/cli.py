"""Start-to-exit time of `hostlock run NAME true`, installed as the cli role installs it, beside its anchors.

Measured in the same run, interleaved round by round so machine noise hits every row alike:
  - `hostlock run NAME true` through a launcher like roles/cli/templates (`#!PYTHON -IS`, the library
    appended to sys.path): what a cron job or a shell script pays per call;
  - `hostlock cron --name NAME -- true` (adds the output capture);
  - `flock LOCKFILE true` (util-linux flock(1), the ~2 ms floor of a C program);
  - `PYTHON -I -S -c pass` (the bare interpreter: what any Python command pays before doing anything).
Prints a markdown table (medians, p90, ratios to flock and to the bare interpreter); docs/benchmarks.md
keeps the latest one under "Command line". Usage: python benchmarks/cli.py [--rounds N] [--python PATH]
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LIB = ROOT / "lib"


def real_python() -> str:
    """The interpreter behind .venv/bin/python (never a pyenv shim, which adds ~100 ms a start)."""
    venv = ROOT / ".venv" / "bin" / "python"
    return os.path.realpath(venv if venv.exists() else sys.executable)


def make_launcher(directory: Path, python: str) -> Path:
    path = directory / "hostlock"
    path.write_text(
        f"#!{python} -IS\nimport sys\n\nsys.path.append({str(LIB)!r})\n"
        "from hostlock.cli import main  # noqa: E402\n\nsys.exit(main())\n"
    )
    path.chmod(0o755)
    return path


def once(argv: list[str], env: dict[str, str]) -> float:
    """Wall time of one fork+exec+wait, in seconds; fails loudly if the command fails."""
    t0 = time.perf_counter()
    pid = os.fork()
    if pid == 0:
        try:
            os.execve(argv[0], argv, env)
        finally:
            os._exit(127)
    _, status = os.waitpid(pid, 0)
    took = time.perf_counter() - t0
    if status != 0:
        raise SystemExit(f"benchmark command failed ({status:#x}): {' '.join(argv)}")
    return took


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=200, help="runs of each command (default 200)")
    ap.add_argument("--python", default=real_python(), help="interpreter the launcher uses")
    args = ap.parse_args()
    flock = shutil.which("flock")
    work = Path(tempfile.mkdtemp(prefix="hostlock-bench-cli."))
    try:
        lockdir = work / "locks"
        lockdir.mkdir(mode=0o700)
        launcher = str(make_launcher(work, args.python))
        env = {"PATH": "/usr/bin:/bin", "HOSTLOCK_DIR": str(lockdir)}
        cases = {
            "`hostlock run NAME true`": [launcher, "run", "bench", "true"],
            "`hostlock cron --name NAME -- true`": [launcher, "cron", "--name", "bench-cron", "--", "true"],
            "`flock LOCKFILE true` (util-linux)": [flock, str(work / "flock.lock"), "true"] if flock else None,
            "`python3 -I -S -c pass` (bare interpreter)": [args.python, "-I", "-S", "-c", "pass"],
        }
        cases = {k: v for k, v in cases.items() if v}
        for argv in cases.values():  # warm up: page cache, __pycache__, lock files created
            for _ in range(3):
                once(argv, env)
        times: dict[str, list[float]] = {k: [] for k in cases}
        for _ in range(args.rounds):
            for k, argv in cases.items():
                times[k].append(once(argv, env))
    finally:
        shutil.rmtree(work, ignore_errors=True)

    med = {k: statistics.median(v) * 1000 for k, v in times.items()}
    p90 = {k: sorted(v)[int(len(v) * 0.9)] * 1000 for k, v in times.items()}
    flock_ms = next((v for k, v in med.items() if k.startswith("`flock")), None)
    bare_ms = next(v for k, v in med.items() if k.startswith("`python3"))
    version = subprocess.run([args.python, "-c", "import platform; print(platform.python_version())"],
                             capture_output=True, text=True).stdout.strip()
    print(f"Python {version} ({args.python}), {os.cpu_count()} CPUs, Linux {platform.release()}, "
          f"{args.rounds} runs each, interleaved; load average before: {os.getloadavg()[0]:.2f}\n")
    print("| command | median | p90 | vs flock(1) | vs bare interpreter |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for k in cases:
        vs_flock = f"{med[k] / flock_ms:.1f}x" if flock_ms else "-"
        print(f"| {k} | {med[k]:.1f} ms | {p90[k]:.1f} ms | {vs_flock} | {med[k] / bare_ms:.2f}x |")
    run_ms = med["`hostlock run NAME true`"]
    print(f"\n`hostlock run NAME true` costs {run_ms - bare_ms:.1f} ms above the bare interpreter "
          f"(target: median <= 20 ms: {'met' if run_ms <= 20 else 'NOT met'}).")
    return 0


if __name__ == "__main__":
    sys.exit(main())
