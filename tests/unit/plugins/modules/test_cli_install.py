"""Unit tests for hostlock.core.cli_install (the cli role's install step), run in-process on a real package.

As root (the module makes every file root's): what differs is written, nothing else; check mode reports the same
and changes nothing; an older version's files go; a link at a file's path is replaced, never followed.
"""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

import pytest
from ansible.module_utils.testing import patch_module_args
from ansible_collections.hostlock.core.plugins.modules import cli_install

PACKAGE = Path(cli_install.__file__).resolve().parents[1] / "module_utils" / "hostlock"
SOURCES = {str(p.relative_to(PACKAGE)): p.read_text() for p in sorted(PACKAGE.rglob("*.py"))
           if "__pycache__" not in p.parts}

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the module makes its files root's")


def run(capsys, check: bool = False, **args) -> dict:
    if check:
        args["_ansible_check_mode"] = True
    with patch_module_args(args), pytest.raises(SystemExit) as exit_info:
        cli_install.main()
    out = json.loads(capsys.readouterr().out)
    out["_rc"] = exit_info.value.code
    return out


@pytest.fixture
def args(tmp_path):
    return dict(lib_dir=str(tmp_path / "lib"), python=sys.executable, package=dict(SOURCES),
                files=[dict(path=str(tmp_path / "bin" / "hostlock"), content="#!launcher\n", mode="0755")])


def tree(top: Path) -> dict[str, tuple]:
    out = {}
    for p in sorted(top.rglob("*")):
        st = p.lstat()
        out[str(p.relative_to(top))] = (stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid, st.st_mtime_ns,
                                        p.read_bytes() if p.is_file() else None)
    return out


def test_installs_then_changes_nothing(capsys, args, tmp_path):
    check = run(capsys, check=True, **args)
    assert check["changed"] and check["compiled"] and check["bundled"], check
    assert not (tmp_path / "lib").exists() and not (tmp_path / "bin").exists()  # check mode wrote nothing

    first = run(capsys, **args)
    assert first["_rc"] == 0 and first["changed"] and first["compiled"] and first["bundled"], first
    pkg = tmp_path / "lib" / "hostlock"
    for rel, text in SOURCES.items():
        st = (pkg / rel).lstat()
        assert (pkg / rel).read_text() == text and stat.S_IMODE(st.st_mode) == 0o644 and st.st_uid == st.st_gid == 0
    assert stat.S_IMODE((tmp_path / "bin" / "hostlock").stat().st_mode) == 0o755
    assert stat.S_IMODE((pkg / "cli").stat().st_mode) == 0o755
    assert (tmp_path / "lib" / "_hostlock_bundle.pyc").is_file() and list((pkg / "cli" / "__pycache__").glob("run.*"))
    assert SOURCES["api.py"] not in json.dumps(first)  # the sources are not echoed back

    before = tree(tmp_path)
    for mode in (True, False):
        again = run(capsys, check=mode, **args)
        assert not again["changed"], again
        assert (again["written"], again["fixed"], again["removed"]) == ([], [], [])
    assert tree(tmp_path) == before  # not a byte, a mode or an mtime


def test_writes_only_what_differs_and_removes_an_older_versions_files(capsys, args, tmp_path):
    run(capsys, **args)
    pkg = tmp_path / "lib" / "hostlock"
    (pkg / "core" / "gone.py").write_text("old = 1\n")
    (pkg / "api.py").write_text("edited = 1\n")
    os.chmod(pkg / "queries.py", 0o600)
    os.chmod(pkg / "fleet", 0o700)
    kept = (pkg / "lease.py").stat().st_mtime_ns

    check = run(capsys, check=True, **args)
    assert check["changed"] and check["compiled"] and check["bundled"]
    assert check["written"] == [str(pkg / "api.py")] and check["removed"] == [str(pkg / "core" / "gone.py")]
    assert sorted(check["fixed"]) == [str(pkg / "fleet"), str(pkg / "queries.py")]
    assert (pkg / "api.py").read_text() == "edited = 1\n" and (pkg / "core" / "gone.py").exists()  # untouched

    fixed = run(capsys, **args)
    assert (fixed["written"], fixed["removed"]) == (check["written"], check["removed"]) and fixed["compiled"]
    assert (pkg / "api.py").read_text() == SOURCES["api.py"] and not (pkg / "core" / "gone.py").exists()
    assert stat.S_IMODE((pkg / "queries.py").stat().st_mode) == 0o644
    assert stat.S_IMODE((pkg / "fleet").stat().st_mode) == 0o755
    assert (pkg / "lease.py").stat().st_mtime_ns == kept  # the bytecode of what did not change stays valid


def test_check_mode_sees_a_missing_bundle_and_bytecode(capsys, args, tmp_path):
    run(capsys, **args)
    (tmp_path / "lib" / "_hostlock_bundle.code").unlink()
    check = run(capsys, check=True, **args)
    assert check["changed"] and check["bundled"] and not check["compiled"] and not check["written"]
    assert not (tmp_path / "lib" / "_hostlock_bundle.code").exists()
    for pyc in (tmp_path / "lib" / "hostlock" / "cli" / "__pycache__").glob("run.*"):
        pyc.unlink()
    check = run(capsys, check=True, **args)
    assert check["compiled"] and check["bundled"]
    assert run(capsys, **args)["changed"]
    assert not run(capsys, check=True, **args)["changed"]


def test_a_link_at_a_files_path_is_replaced_not_followed(capsys, args, tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("keep\n")
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "hostlock").symlink_to(victim)
    assert run(capsys, **args)["changed"]
    assert victim.read_text() == "keep\n"
    assert not (tmp_path / "bin" / "hostlock").is_symlink()
    assert (tmp_path / "bin" / "hostlock").read_text() == "#!launcher\n"


def test_an_existing_launcher_directory_keeps_its_mode(capsys, args, tmp_path):
    (tmp_path / "bin").mkdir(mode=0o775)
    os.chmod(tmp_path / "bin", 0o2775)
    run(capsys, **args)
    assert stat.S_IMODE((tmp_path / "bin").stat().st_mode) == 0o2775


@pytest.mark.parametrize("rel", ["../escape.py", "/abs.py", "data/hostlock.1"])
def test_refuses_a_path_outside_the_package_or_not_python(capsys, args, tmp_path, rel):
    args["package"][rel] = "x = 1\n"
    out = run(capsys, **args)
    assert out["_rc"] == 1 and out["failed"] and rel in out["msg"], out
    assert not (tmp_path / "lib").exists()


def test_an_interpreter_that_does_not_run_is_one_line(capsys, args, tmp_path):
    args["python"] = str(tmp_path / "nonexistent" / "python3")
    out = run(capsys, **args)
    assert out["_rc"] == 1 and out["msg"].startswith("cannot run " + args["python"]), out


def test_a_source_rewritten_to_text_of_the_same_length_is_compiled_again(capsys, args, tmp_path):
    """compileall trusts a cached .pyc whose source has the same mtime (whole seconds) and size: a rewrite within
    the second to text of the same length must not run the old code."""
    run(capsys, **args)
    pkg = tmp_path / "lib" / "hostlock"
    original = (pkg / "api.py").read_text()
    (pkg / "api.py").write_text("x" * len(original))  # same length
    st = (pkg / "api.py").stat()
    os.utime(pkg / "api.py", ns=(st.st_atime_ns, st.st_mtime_ns))
    fixed = run(capsys, **args)
    assert fixed["written"] == [str(pkg / "api.py")] and fixed["compiled"], fixed
    cached = next((pkg / "__pycache__").glob("api.*.pyc"))
    assert cached.stat().st_mtime_ns >= (pkg / "api.py").stat().st_mtime_ns
