"""The suite runs from a clone in a private directory (a 0700 home, `mktemp -d`), as a newcomer's often is.

The tests that act as another user (setpriv 65534) start interpreters that import hostlock; from a private
checkout they can only do so through engine_helpers.LIB, the copy every user can read. This runs every such
test file again from a copy of the checkout in a 0700 directory, so a test that reaches for the checkout's
own path as another user fails here, not on the first clone in a private home.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
THIS = Path(__file__).resolve()
# What marks a test file that runs code as another user.
OTHER_USER_MARKS = ("setpriv", "as_member(", "as_user(")

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv") or not shutil.which("git"),
                                reason="needs root, setpriv and git")


def _tracked_files() -> list:
    out = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z"], capture_output=True, check=False)
    if out.returncode != 0:
        pytest.skip("not a git checkout: %s" % out.stderr.decode(errors="replace").strip())
    return [f for f in out.stdout.decode().split("\0") if f and (ROOT / f).is_file()]


def _other_user_tests(files: list) -> list:
    found = []
    for f in files:
        path = ROOT / f
        if (f.startswith(("tests/integration/engine/", "tests/integration/cli/")) and path.name.startswith("test_")
                and f.endswith(".py") and path != THIS):
            if any(mark in path.read_text() for mark in OTHER_USER_MARKS):
                found.append(f)
    return found


# A path to the checkout's own lib/ built in a test file: what another user cannot import from a private clone.
CHECKOUT_LIB_PATH = re.compile(r"""parents\[\d\]\s*/\s*["']lib["']\s*$|["']\.\.["'],\s*["']lib["']\)""", re.M)


def test_no_test_that_acts_as_another_user_builds_its_own_path_to_the_checkouts_lib():
    """Static, for the suites the run below does not cover (fleet, ansible: they need servers)."""
    offenders = []
    for f in _tracked_files():
        path = ROOT / f
        if f.startswith("tests/") and f.endswith(".py") and path.name != "engine_helpers.py":
            text = path.read_text()
            if any(mark in text for mark in OTHER_USER_MARKS) and CHECKOUT_LIB_PATH.search(text):
                offenders.append(f)
    assert not offenders, "use engine_helpers.LIB (a copy every user can read) in: %s" % offenders


def test_the_tests_that_act_as_another_user_pass_from_a_private_checkout():
    files = _tracked_files()
    tests = _other_user_tests(files)
    assert len(tests) >= 5, tests  # the finder itself still finds them
    top = tempfile.mkdtemp(prefix="hostlock-private-")  # mkdtemp makes it 0700: nobody else may enter
    try:
        assert os.stat(top).st_mode & 0o777 == 0o700
        copy = Path(top) / "checkout"
        for f in files:
            (copy / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / f, copy / f, follow_symlinks=False)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "HOSTLOCK_"))}
        r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:xdist", *tests], cwd=copy,
                           env=env, capture_output=True, text=True, timeout=900, check=False)
        assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-2000:]
    finally:
        shutil.rmtree(top, ignore_errors=True)
