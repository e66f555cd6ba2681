"""benchmarks/: every script starts (its imports resolve: the test helpers it borrows, their own imports) and
answers --help, so a benchmark broken by a move elsewhere is found by the suite, not by its next user."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
SCRIPTS = sorted(p for p in BENCHMARKS.glob("*.py") if 'if __name__ == "__main__":' in p.read_text())


def test_there_are_benchmark_scripts():
    assert len(SCRIPTS) >= 10, SCRIPTS


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_each_benchmark_answers_help(script):
    proc = subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True, timeout=120,
                          check=False, cwd="/")
    assert proc.returncode == 0, proc.stderr
    assert "usage:" in proc.stdout, proc.stdout
