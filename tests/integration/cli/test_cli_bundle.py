"""The command's bundle (hostlock/cli/bundle.py): the whole engine compiled in one file beside the package, which
the role's launcher imports first. Used only when it is this interpreter's and every source is as it was built
from; serves only hostlock's modules; what it served stays in memory; the role's script fails in one line."""

import glob
import os
import subprocess
from pathlib import Path

import cli_install
import pytest
from cli_support import PYTHON
from engine_helpers import readable_copy

from hostlock.cli import bundle

PROBE = """
import sys
sys.path.append(%r)
try:
    import _hostlock_bundle
    installed = _hostlock_bundle.INSTALLED
except Exception as e:
    installed = type(e).__name__
import hostlock.cli.run
print(installed, type(hostlock.__spec__.loader).__name__, hostlock.__file__)
"""


def probe(lib: str, python: str = PYTHON) -> list:
    """[INSTALLED or the import's error, the loader of hostlock, hostlock.__file__] as the launcher would find them."""
    r = subprocess.run([python, "-I", "-S", "-c", PROBE % lib], capture_output=True, text=True, check=True)
    return r.stdout.split()


@pytest.fixture
def lib():
    """A library directory of its own (a readable copy of the package), bundled for this interpreter."""
    top = readable_copy()
    cli_install.bundle(PYTHON, top)
    return top


def test_the_bundle_serves_the_package_from_memory(lib):
    assert probe(lib) == ["True", "BundleFinder", os.path.join(lib, "hostlock", "__init__.py")]
    assert oct(os.stat(os.path.join(lib, cli_install.BUNDLE)).st_mode & 0o7777) == "0o644"


def test_the_bundle_holds_code_compiled_without_docstrings_and_the_command_runs_on_it(lib, tmp_path):
    """As with -OO: a fifth smaller, and nothing the command runs reads a docstring."""
    code = PROBE % lib + "import hostlock.api\nprint(hostlock.api.Lock.__doc__, hostlock.api.__doc__)\n"
    out = subprocess.run([PYTHON, "-I", "-S", "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.splitlines()[-1] == "None None"
    hl = cli_install.install(tmp_path / "hostlock", PYTHON, lib, bundled=False)
    r = subprocess.run([str(hl), "run", "-v", "-d", str(tmp_path / "locks"), "job", "echo", "ran"],
                       capture_output=True, text=True, check=False, env={"PATH": "/usr/bin:/bin"})
    assert (r.returncode, r.stdout) == (0, "ran\n"), r.stderr
    for command in (["--help"], ["run", "--help"], ["status", "--help"], ["flock", "--help"]):
        r = subprocess.run([str(hl), *command], capture_output=True, text=True, check=False)
        assert r.returncode == 0 and r.stdout.strip() and "None" not in r.stdout, (command, r.stdout, r.stderr)


def test_the_role_the_launcher_and_the_helpers_name_the_same_file():
    assert cli_install.BUNDLE == bundle.NAME + ".pyc"
    root = Path(__file__).resolve().parents[3]
    assert ", ".join(cli_install.BUILD) in (root / "roles/cli/tasks/install.yml").read_text()  # built the same way
    assert f"import {bundle.NAME}  #" in (root / "roles/cli/templates/hostlock.py.j2").read_text()
    assert f"/{bundle.NAME}.pyc" in (root / "roles/cli/vars/main.yml").read_text()


@pytest.mark.parametrize("change", ["edited", "touched", "removed"])
def test_a_source_changed_after_the_build_means_the_sources_are_imported(lib, change):
    """A module edited (size), touched (mtime) or gone after the bundle was built: the whole package comes from its
    files, never half from each."""
    path = Path(lib, "hostlock", "core", "clock.py")
    if change == "edited":
        with path.open("a") as f:
            f.write("# edited\n")
    elif change == "touched":
        st = path.stat()
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    else:
        path.unlink()
    assert probe(lib)[:2] == ["False", "SourceFileLoader"]


def test_another_interpreters_bundle_is_refused_and_the_files_are_used(lib):
    others = [p for v in ("3.8", "3.9", "3.10", "3.12", "3.13")
              for p in sorted(glob.glob(os.path.expanduser(f"~/.pyenv/versions/{v}.*/bin/python{v}")))[-1:]]
    if not others:
        pytest.skip("no second interpreter on this machine")
    for other in others:
        if os.path.realpath(other) == PYTHON:
            continue
        got = probe(lib, other)  # the bundle is PYTHON's: bad magic number, an ImportError
        assert got[:2] == ["ImportError", "SourceFileLoader"], (other, got)


@pytest.mark.parametrize("damage", ["truncated", "garbage", "empty"])
def test_a_damaged_bundle_leaves_the_command_working(lib, tmp_path, damage):
    path = Path(lib, cli_install.BUNDLE)
    data = path.read_bytes()
    path.write_bytes({"truncated": data[: len(data) // 2], "garbage": data[:16] + b"\x00garbage" * 64,
                      "empty": b""}[damage])
    hl = cli_install.install(tmp_path / "hostlock", PYTHON, lib, bundled=False)
    r = subprocess.run([str(hl), "run", "-d", str(tmp_path / "locks"), "job", "echo", "ran"], capture_output=True,
                       text=True, check=False, env={"PATH": "/usr/bin:/bin"})
    assert (r.returncode, r.stdout, r.stderr) == (0, "ran\n", "")


def test_the_bundle_serves_only_hostlock_modules_it_has(lib):
    """Other names, and a module added to the package after the build, go to the usual finders."""
    Path(lib, "hostlock", "added.py").write_text("WHERE = 'file'\n")
    code = PROBE % lib + (
        "import _hostlock_bundle as b, hostlock.added\n"
        "f = next(f for f in sys.meta_path if type(f).__name__ == 'BundleFinder')\n"
        "print(f.find_spec('json'), f.find_spec('hostlockx'), f.find_spec('hostlock.added'),"
        " type(hostlock.added.__spec__.loader).__name__)\n")
    out = subprocess.run([PYTHON, "-I", "-S", "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.splitlines()[-1] == "None None None SourceFileLoader"


def test_a_package_imported_before_the_bundle_is_never_mixed_with_it(lib):
    code = (f"import sys\nsys.path.append({lib!r})\nimport hostlock\nimport _hostlock_bundle\n"
            "import hostlock.cli.run\n"
            "print(_hostlock_bundle.INSTALLED, type(hostlock.cli.run.__spec__.loader).__name__)")
    out = subprocess.run([PYTHON, "-I", "-S", "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "SourceFileLoader"]


def test_code_served_later_comes_from_memory_not_from_files_replaced_since(lib):
    """A module first imported after the package was replaced on disk (an upgrade under a running command, a
    privilege change) is the bundle's code, as read at start: never the new file's."""
    code = (f"import sys\nsys.path.append({lib!r})\nimport _hostlock_bundle\nimport hostlock.cli\n"
            "assert 'hostlock.host.record' not in sys.modules\n"
            f"open({lib!r} + '/hostlock/host/record.py', 'w').write('raise SystemExit(\"the new file ran\")')\n"
            "import hostlock.host.record\nprint(hasattr(hostlock.host.record, 'RecordMechanism'))")
    r = subprocess.run([PYTHON, "-I", "-S", "-c", code], capture_output=True, text=True, check=False)
    assert (r.returncode, r.stdout.split()) == (0, ["True"]), r.stderr


def test_building_twice_writes_once_the_same_bytes(lib):
    """The role's task is changed only when the bundle is: same sources, same bytes."""
    before = Path(lib, cli_install.BUNDLE).read_bytes()
    script = os.path.join(lib, "hostlock", "cli", "bundle.py")
    r = subprocess.run([PYTHON, *cli_install.BUILD, script, lib], capture_output=True, text=True, check=True)
    assert (r.stdout, r.stderr) == ("", "")
    assert Path(lib, cli_install.BUNDLE).read_bytes() == before
    Path(lib, "hostlock", "core", "clock.py").write_text(Path(lib, "hostlock", "core", "clock.py").read_text() + "#\n")
    r = subprocess.run([PYTHON, *cli_install.BUILD, script, lib], capture_output=True, text=True, check=True)
    assert r.stdout == "wrote %s\n" % os.path.join(lib, cli_install.BUNDLE)


USAGE = "usage: python -I -S bundle.py LIB_DIR (the directory that holds the hostlock package)"
NO_PACKAGE = ("hostlock bundle: cannot write /nonexistent-dir/_hostlock_bundle.pyc: "
              "no hostlock package in /nonexistent-dir")


@pytest.mark.parametrize("args, code, says", [
    ([], 64, USAGE),
    (["a", "b"], 64, USAGE),
    (["--help"], 64, USAGE),
    (["/nonexistent-dir"], 1, NO_PACKAGE),
])
def test_the_script_fails_in_one_line(args, code, says):
    script = bundle.__file__
    r = subprocess.run([PYTHON, "-I", "-S", script, *args], capture_output=True, text=True, check=False)
    assert (r.returncode, r.stdout, r.stderr.splitlines()) == (code, "", [says])


def test_the_script_says_why_it_cannot_write(lib):
    if os.geteuid() == 0:
        cmd = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    else:
        cmd = []
    script = os.path.join(lib, "hostlock", "cli", "bundle.py")
    os.unlink(os.path.join(lib, cli_install.BUNDLE))  # else the same bytes are there already: nothing to write
    r = subprocess.run([*cmd, PYTHON, "-I", "-S", script, lib], capture_output=True, text=True, check=False)
    assert r.returncode == 1
    assert r.stderr.startswith("hostlock bundle: cannot write %s: " % os.path.join(lib, cli_install.BUNDLE))
    assert len(r.stderr.splitlines()) == 1
