"""plugins/module_utils/hostlock must be exactly what tools/gen_module_utils.py makes from lib/hostlock."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TOOL = ROOT / "tools" / "gen_module_utils.py"


def run(*args, root=ROOT):
    return subprocess.run(
        [sys.executable, str(TOOL), "--root", str(root), *args], capture_output=True, text=True, check=False
    )


def test_module_utils_copy_matches_lib():
    result = run("--check")
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.fixture
def scratch(tmp_path):
    """A minimal repository: lib/hostlock with two modules, generated once."""
    lib = tmp_path / "lib" / "hostlock"
    lib.mkdir(parents=True)
    (lib / "__init__.py").write_text('"""pkg."""\nfrom ._api import Lock\n')
    (lib / "_api.py").write_text("#!/usr/bin/env python3\nclass Lock:\n    pass\n")
    assert run(root=tmp_path).returncode == 0
    return tmp_path


def test_generated_files_say_so_and_carry_license(scratch):
    text = (scratch / "plugins/module_utils/hostlock/_api.py").read_text()
    first, second, *rest = text.splitlines()
    assert first == (
        "# GENERATED from lib/hostlock/_api.py by `make module-utils`: do not edit; edit lib/hostlock instead."
    )
    assert second == "# SPDX-License-Identifier: GPL-3.0-or-later"
    assert rest == ["class Lock:", "    pass"]  # the shebang is dropped: module_utils are never executed
    assert run("--check", root=scratch).returncode == 0


@pytest.mark.parametrize("change", ["edit_lib", "edit_copy", "add_lib", "remove_lib", "hand_written"])
def test_check_reports_drift_and_regeneration_fixes_it(scratch, change):
    lib = scratch / "lib/hostlock"
    dest = scratch / "plugins/module_utils/hostlock"
    culprit = {
        "edit_lib": "_api.py",
        "edit_copy": "_api.py",
        "add_lib": "_new.py",
        "remove_lib": "_api.py",
        "hand_written": "_mine.py",
    }[change]
    if change == "edit_lib":
        (lib / "_api.py").write_text("class Lock:\n    locked = False\n")
    elif change == "edit_copy":
        with (dest / "_api.py").open("a") as f:
            f.write("# local hack\n")
    elif change == "add_lib":
        (lib / "_new.py").write_text("X = 1\n")
    elif change == "remove_lib":
        (lib / "_api.py").unlink()
    else:
        (dest / "_mine.py").write_text("X = 1\n")

    result = run("--check", root=scratch)
    assert result.returncode == 1
    assert f"plugins/module_utils/hostlock/{culprit}" in result.stdout

    if change == "hand_written":
        assert run(root=scratch).returncode == 1  # never deletes a file it did not generate
        assert (dest / "_mine.py").exists()
        return
    assert run(root=scratch).returncode == 0
    assert run("--check", root=scratch).returncode == 0
    assert sorted(p.name for p in dest.glob("*.py")) == sorted(p.name for p in lib.glob("*.py"))


def test_missing_lib_is_a_clear_error(tmp_path):
    result = run("--check", root=tmp_path)
    assert result.returncode != 0
    assert "lib/hostlock does not exist" in result.stderr


def test_subpackages_are_copied(scratch):
    sub = scratch / "lib/hostlock/_mech"
    sub.mkdir()
    (sub / "__init__.py").write_text("")
    assert run(root=scratch).returncode == 0
    assert (scratch / "plugins/module_utils/hostlock/_mech/__init__.py").read_text().startswith("# GENERATED")
    shutil.rmtree(sub)
    assert run(root=scratch).returncode == 0
    assert not (scratch / "plugins/module_utils/hostlock/_mech").exists()
