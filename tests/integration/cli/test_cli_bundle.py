"""The command's bundle (hostlock/cli/bundle.py): the whole engine compiled ahead beside the package (a table module
and a code file held open, each module read from it as imported), which the role's launcher imports first. Used
only when it is this interpreter's, its code file is the one built with its table and every source is as it was
built from; serves only hostlock's modules, always of the build it started with; the role's script fails in one
line."""

import glob
import os
import shutil
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
    for name in (cli_install.BUNDLE, cli_install.BUNDLE_CODE):
        assert oct(os.stat(os.path.join(lib, name)).st_mode & 0o7777) == "0o644"


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
    assert (cli_install.BUNDLE, cli_install.BUNDLE_CODE) == (bundle.NAME + ".pyc", bundle.CODE)
    root = Path(__file__).resolve().parents[3]
    # built the same way: the cli role's install module runs the interpreter with these options
    built = "[python, " + ", ".join('"%s"' % a for a in cli_install.BUILD) + "]"
    assert built in (root / "plugins/modules/cli_install.py").read_text()
    assert f"import {bundle.NAME}  #" in (root / "roles/cli/templates/hostlock.py.j2").read_text()
    role_vars = (root / "roles/cli/vars/main.yml").read_text()
    assert f"/{bundle.NAME}.pyc" in role_vars and f"/{bundle.CODE}" in role_vars  # removed by `state: absent`


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


@pytest.mark.parametrize("name", [cli_install.BUNDLE, cli_install.BUNDLE_CODE])
@pytest.mark.parametrize("damage", ["truncated", "garbage", "empty", "one byte changed at the end", "longer",
                                    "missing"])
def test_a_damaged_bundle_leaves_the_command_working(lib, tmp_path, name, damage):
    """Either file of the bundle damaged: the command runs, from the package's files."""
    path = Path(lib, name)
    data = path.read_bytes()
    path.unlink()
    if damage != "missing":
        path.write_bytes({"truncated": data[: len(data) // 2], "garbage": data[:16] + b"\x00garbage" * 64,
                          "empty": b"", "one byte changed at the end": data[:-1] + bytes([data[-1] ^ 1]),
                          "longer": data + b"\0"}[damage])
    if name == cli_install.BUNDLE_CODE or damage == "missing":
        assert probe(lib)[:2] in (["False", "SourceFileLoader"], ["ModuleNotFoundError", "SourceFileLoader"])
    hl = cli_install.install(tmp_path / "hostlock", PYTHON, lib, bundled=False)
    r = subprocess.run([str(hl), "run", "-d", str(tmp_path / "locks"), "job", "echo", "ran"], capture_output=True,
                       text=True, check=False, env={"PATH": "/usr/bin:/bin"})
    assert (r.returncode, r.stdout, r.stderr) == (0, "ran\n", "")


def test_another_builds_code_file_is_refused(lib, tmp_path):
    """A code file and a table of two builds (a role run that wrote one of them when the other failed, a copy
    from elsewhere): the stamps differ, the sources are imported."""
    other = Path(readable_copy())
    clock = other / "hostlock" / "core" / "clock.py"
    clock.write_text(clock.read_text() + "# another build\n")
    cli_install.bundle(PYTHON, other)
    Path(lib, cli_install.BUNDLE_CODE).write_bytes((other / cli_install.BUNDLE_CODE).read_bytes())
    assert probe(lib)[:2] == ["False", "SourceFileLoader"]
    shutil.copy(other / cli_install.BUNDLE, Path(lib, cli_install.BUNDLE))  # both of the other build: stale sources
    assert probe(lib)[:2] == ["False", "SourceFileLoader"]


@pytest.mark.parametrize("kind", ["symlink", "fifo", "directory"])
def test_a_code_file_that_is_not_a_plain_file_is_not_followed_or_waited_on(lib, tmp_path, kind):
    """A symlink at the code file's place is not followed (even to the right bytes), a FIFO is not waited on (the
    command would hang before it starts): the sources are imported."""
    code = Path(lib, cli_install.BUNDLE_CODE)
    real = tmp_path / "real.code"
    shutil.move(code, real)
    if kind == "symlink":
        code.symlink_to(real)
    elif kind == "fifo":
        os.mkfifo(code)
    else:
        code.mkdir()
    r = subprocess.run([PYTHON, "-I", "-S", "-c", PROBE % lib], capture_output=True, text=True, check=True,
                       timeout=60)
    assert r.stdout.split()[:2] == ["False", "SourceFileLoader"]


def test_the_bundle_serves_only_hostlock_modules_it_has(lib):
    """Other names, and a module added to the package after the build, go to the usual finders. The finder is
    asked first (the built-in and frozen importers never have a hostlock module); what it serves has its source
    as __file__, as a module imported from it."""
    Path(lib, "hostlock", "added.py").write_text("WHERE = 'file'\n")
    code = PROBE % lib + (
        "import _hostlock_bundle as b, hostlock.added, hostlock.cli.run, json\n"
        "f = next(f for f in sys.meta_path if type(f).__name__ == 'BundleFinder')\n"
        "print(f.find_spec('json'), f.find_spec('hostlockx'), f.find_spec('hostlock.added'),"
        " type(hostlock.added.__spec__.loader).__name__)\n"
        "print(sys.meta_path.index(f), type(json.__spec__.loader).__name__, hostlock.cli.run.__file__)\n")
    out = subprocess.run([PYTHON, "-I", "-S", "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.splitlines()[-2] == "None None None SourceFileLoader"
    assert out.splitlines()[-1] == "0 SourceFileLoader %s/hostlock/cli/run.py" % lib


def test_a_package_imported_before_the_bundle_is_never_mixed_with_it(lib):
    code = (f"import sys\nsys.path.append({lib!r})\nimport hostlock\nimport _hostlock_bundle\n"
            "import hostlock.cli.run\n"
            "print(_hostlock_bundle.INSTALLED, type(hostlock.cli.run.__spec__.loader).__name__)")
    out = subprocess.run([PYTHON, "-I", "-S", "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "SourceFileLoader"]


def test_code_served_later_is_the_bundles_not_from_files_replaced_since(lib):
    """A module first imported after the package was replaced on disk (an upgrade under a running command, a
    privilege change) is the bundle's code, as built: never the new file's."""
    code = (f"import sys\nsys.path.append({lib!r})\nimport _hostlock_bundle\nimport hostlock.cli\n"
            "assert 'hostlock.host.record' not in sys.modules\n"
            f"open({lib!r} + '/hostlock/host/record.py', 'w').write('raise SystemExit(\"the new file ran\")')\n"
            "import hostlock.host.record\nprint(hasattr(hostlock.host.record, 'RecordMechanism'))")
    r = subprocess.run([PYTHON, "-I", "-S", "-c", code], capture_output=True, text=True, check=False)
    assert (r.returncode, r.stdout.split()) == (0, ["True"]), r.stderr


REBUILD = """
import os, subprocess, sys
sys.path.append(%(lib)r)
import _hostlock_bundle as b
import hostlock.cli
assert b.INSTALLED and 'hostlock.host.record' not in sys.modules
def rebuild():  # another build, as an upgrade writes it: record.py changed, the bundle built again (by renames)
    with open(%(lib)r + '/hostlock/host/record.py', 'a') as f:
        f.write('\\nNEW_BUILD = True\\n')
    subprocess.run([sys.executable, '-I', '-S', %(lib)r + '/hostlock/cli/bundle.py', %(lib)r], check=True,
                   stdout=subprocess.DEVNULL)
"""


def run_rebuild(lib, then):
    r = subprocess.run([PYTHON, "-I", "-S", "-c", REBUILD % {"lib": lib} + then], capture_output=True, text=True,
                       check=False)
    return r.returncode, r.stdout.split(), r.stderr


def test_a_new_build_written_under_a_running_command_is_not_mixed_with_the_one_it_started_with(lib):
    """The code file is held open from the start: a new build renamed over it (the role, upgrading) changes nothing
    for a running command, whose later imports are still of the build it started with."""
    got = run_rebuild(lib, "rebuild()\nimport hostlock.host.record as r\n"
                           "print(type(r.__spec__.loader).__name__, hasattr(r, 'RecordMechanism'),"
                           " hasattr(r, 'NEW_BUILD'))")
    assert got[:2] == (0, ["BundleFinder", "True", "False"]), got


@pytest.mark.parametrize("reused", [False, True])
def test_a_process_that_closed_the_code_file_opens_it_again_only_while_it_is_the_same_build(lib, reused):
    """A process that closed the descriptor itself (the watcher of `hostlock run` closes all but its own
    when it must act), its
    number perhaps another file's by then: the code file is opened again, by its path, and used while it is the
    build the process started with; another build there makes the import fail, never mixes two builds."""
    close = ("import os\nfd = b._FILE[0]\nos.close(fd)\n"
             + ("other = os.open('/dev/null', os.O_RDONLY)\nassert other == fd\n" if reused else ""))
    got = run_rebuild(lib, close + "import hostlock.host.record as r\n"
                                   "print(type(r.__spec__.loader).__name__, hasattr(r, 'RecordMechanism'))")
    assert got[:2] == (0, ["BundleFinder", "True"]), got
    got = run_rebuild(lib, close + "rebuild()\n"
                                   "try:\n    import hostlock.host.record\nexcept ImportError:\n"
                                   "    print('refused')\nelse:\n    print('imported')\n")
    assert got[:2] == (0, ["refused"]), got


def test_building_twice_writes_once_the_same_bytes(lib):
    """The role's task is changed only when the bundle is: same sources, same bytes. The code file is written
    first, the table second (a command starting in between finds two builds' stamps: the sources)."""
    files = [Path(lib, cli_install.BUNDLE_CODE), Path(lib, cli_install.BUNDLE)]
    before = [f.read_bytes() for f in files]
    script = os.path.join(lib, "hostlock", "cli", "bundle.py")
    r = subprocess.run([PYTHON, *cli_install.BUILD, script, lib], capture_output=True, text=True, check=True)
    assert (r.stdout, r.stderr) == ("", "")
    assert [f.read_bytes() for f in files] == before
    clock = Path(lib, "hostlock", "core", "clock.py")
    clock.write_text(clock.read_text() + "#\n")  # the same code, another size: the table alone changes
    r = subprocess.run([PYTHON, *cli_install.BUILD, script, lib], capture_output=True, text=True, check=True)
    assert r.stdout == "wrote %s\n" % files[1]
    clock.write_text(clock.read_text() + "ADDED = 1\n")  # other code: both
    r = subprocess.run([PYTHON, *cli_install.BUILD, script, lib], capture_output=True, text=True, check=True)
    assert r.stdout == "".join("wrote %s\n" % f for f in files)
    assert probe(lib)[:2] == ["True", "BundleFinder"]


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
    for name in (cli_install.BUNDLE, cli_install.BUNDLE_CODE):  # else the same bytes are there already
        os.unlink(os.path.join(lib, name))
    r = subprocess.run([*cmd, PYTHON, "-I", "-S", script, lib], capture_output=True, text=True, check=False)
    assert r.returncode == 1
    assert r.stderr.startswith("hostlock bundle: cannot write %s: " % os.path.join(lib, cli_install.BUNDLE))
    assert len(r.stderr.splitlines()) == 1
