"""`pip install .` installs scripts/hostlock: the venv's own python3 started with -I -S (no `site`, no
PYTHON* variables), the package found in the venv's site-packages; any other layout falls back to `site`."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
PIP = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--quiet"]


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """A fresh venv of this Python with the hostlock wheel built from lib/ (offline, no build isolation)."""
    work = tmp_path_factory.mktemp("pip")
    venv = work / "venv"
    subprocess.run([os.path.realpath(sys.executable), "-m", "venv", "--without-pip", str(venv)], check=True)
    wheels = work / "wheels"
    subprocess.run([*PIP, "wheel", "--no-deps", "--no-build-isolation", "-w", str(wheels), str(ROOT)],
                   check=True)
    subprocess.run([*PIP, "--python", str(venv / "bin" / "python"), "install", "--no-deps", "--no-index",
                    *map(str, wheels.glob("hostlock-*.whl"))], check=True)
    return venv


def site_packages(venv: Path) -> Path:
    (sp,) = (venv / "lib").glob("python*/site-packages")
    return sp


def test_pip_installed_command_runs_a_job_under_a_lock(installed, tmp_path):
    script = installed / "bin" / "hostlock"
    assert script.read_text().startswith("#!/bin/sh\n")  # not pip's console_scripts wrapper
    lockdir = tmp_path / "locks"
    proc = subprocess.run([str(script), "run", "-d", str(lockdir), "job", "sh", "-c", "echo ran"],
                          capture_output=True, text=True, check=False, env={"PATH": "/usr/bin:/bin"})
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "ran\n", "")
    assert (lockdir / "job.lock").exists()


def test_pip_installed_command_skips_site_and_python_variables(installed, tmp_path):
    """A .pth file in site-packages (run by `site`) and a shadowing package on PYTHONPATH are both ignored."""
    marker = tmp_path / "site-ran"
    pth = site_packages(installed) / "zz_probe.pth"
    pth.write_text(f"import pathlib; pathlib.Path({str(marker)!r}).touch()\n")
    shadow = tmp_path / "shadow" / "hostlock"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise SystemExit('the PYTHONPATH copy was imported')\n")
    (shadow / "cli.py").write_text("raise SystemExit('the PYTHONPATH copy was imported')\n")
    try:
        proc = subprocess.run([str(installed / "bin" / "hostlock"), "--version"], capture_output=True, text=True,
                              check=False, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(shadow.parent)})
    finally:
        pth.unlink()
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("hostlock ")
    assert not marker.exists(), "site ran: the command did not start with -S"
    # The control: the same .pth does run under a normal start, so the check above can fail.
    pth.write_text(f"import pathlib; pathlib.Path({str(marker)!r}).touch()\n")
    try:
        subprocess.run([str(installed / "bin" / "python"), "-c", "pass"], check=True)
    finally:
        pth.unlink()
    assert marker.exists()


def test_pip_installed_command_outside_its_layout_falls_back_to_site(installed, tmp_path):
    """A copy of the script elsewhere still works: python3 from PATH, the package found through `site`."""
    copy = tmp_path / "bin" / "hostlock"
    copy.parent.mkdir()
    copy.write_bytes((installed / "bin" / "hostlock").read_bytes())
    copy.chmod(0o755)
    proc = subprocess.run([str(copy), "--version"], capture_output=True, text=True, check=False,
                          env={"PATH": f"{installed / 'bin'}:/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("hostlock ")
