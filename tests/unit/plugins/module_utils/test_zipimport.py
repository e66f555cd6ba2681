"""Unit tests for plugins/module_utils/_zipimport.py: this collection's module_utils compiled once from a zip.

Each case runs a real interpreter (every CPython 3.8 to 3.13 found here) on a zip laid out as AnsiballZ
lays out a module's module_utils, counting compile() calls, with and without the finder.
"""

from __future__ import annotations

import glob
import json
import marshal
import subprocess
import zipfile
import zlib
from pathlib import Path

import pytest
from ansible_collections.hostlock.core.plugins.module_utils import _zipimport

MU = "ansible_collections/hostlock/core/plugins/module_utils"
PYTHONS = sorted({p for v in ("3.8", "3.9", "3.10", "3.11", "3.12", "3.13")
                  for p in glob.glob(f"/root/.pyenv/versions/{v}.*/bin/python{v}")[:1]}) or ["python3"]

PROBE = r"""
import builtins, json, sys, zipimport
sys.path.insert(0, sys.argv[1])
compiled = {}
real = builtins.compile
def counting(source, filename, *args, **kwargs):
    if "/module_utils/pkg/" in filename:
        key = filename.rsplit("/", 1)[-1]
        compiled[key] = compiled.get(key, 0) + 1
    return real(source, filename, *args, **kwargs)
builtins.compile = counting
zipimport.compile = counting  # zipimport (Python code since 3.8) finds compile() in its globals first
first = sys.meta_path[0]
preloaded = None
if sys.argv[2] != "plain":
    from ansible_collections.hostlock.core.plugins.module_utils import _zipimport
if sys.argv[2] == "early":  # the caller's own imports come before its arguments (and so the code) are read
    from ansible_collections.hostlock.core.plugins.module_utils.pkg import sibling
if sys.argv[2] in ("preload", "early"):
    with open(sys.argv[3], "rb") as f:
        preloaded = _zipimport.preload(f.read())
finders = [getattr(f, "__name__", type(f).__name__) for f in sys.meta_path]
compiled.clear()
from ansible_collections.hostlock.core.plugins.module_utils.pkg import mod
from ansible_collections.hostlock.core.plugins.module_utils import pkg
try:
    from ansible_collections.hostlock.core.plugins.module_utils.pkg import absent
    missing = "imported"
except ImportError as e:
    missing = type(e).__name__
print(json.dumps(dict(
    compiled=compiled, value=mod.VALUE, relative=mod.SIBLING, file=mod.__file__, pkg_file=pkg.__file__,
    pkg_path=list(pkg.__path__), package=mod.__package__, origin=mod.__spec__.origin,
    source=mod.__loader__.get_source(mod.__name__).splitlines()[0], missing=missing,
    first_kept=sys.meta_path[0] is first, finders=finders, preloaded=preloaded,
    compiled_here=_zipimport.compiled_here() if sys.argv[2] != "plain" else None,
)))
if sys.argv[2] in ("finder", "preload", "early") and len(sys.argv) > 4:
    with open(sys.argv[4], "wb") as f:
        f.write(_zipimport.exported())
"""


@pytest.fixture
def payload_zip(tmp_path: Path) -> str:
    """A zip with this collection's module_utils layout: the real _zipimport, a package with two modules."""
    path = tmp_path / "ansible_test_payload.zip"
    with zipfile.ZipFile(path, "w") as z:
        for package in ("ansible_collections", "ansible_collections/hostlock", "ansible_collections/hostlock/core",
                        "ansible_collections/hostlock/core/plugins", MU):
            z.writestr(f"{package}/__init__.py", "")
        z.writestr(f"{MU}/_zipimport.py", Path(_zipimport.__file__).read_text())
        z.writestr(f"{MU}/pkg/__init__.py", "# the package\n")
        z.writestr(f"{MU}/pkg/mod.py", "# the module\nfrom . import sibling\nVALUE = 42\nSIBLING = sibling.NAME\n")
        z.writestr(f"{MU}/pkg/sibling.py", "NAME = __name__\n")
    return str(path)


def probe(python: str, zip_path: str, mode: str, blob: str = "-", out: str | None = None) -> dict:
    argv = [python, "-I", "-c", PROBE, zip_path, mode, blob] + ([out] if out else [])
    done = subprocess.run(argv, capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


@pytest.mark.parametrize("python", PYTHONS)
def test_each_module_is_compiled_once_with_the_attributes_zipimport_gives(python, payload_zip):
    plain = probe(python, payload_zip, "plain")
    once = probe(python, payload_zip, "finder")
    # CPython compiles a zipped source twice (get_filename() for the spec, then the load); the finder once
    assert plain["compiled"] == {"__init__.py": 2, "mod.py": 2, "sibling.py": 2}, plain
    assert once["compiled"] == {"__init__.py": 1, "mod.py": 1, "sibling.py": 1}, once
    for key in ("value", "relative", "file", "pkg_file", "pkg_path", "package", "origin", "source", "missing"):
        assert once[key] == plain[key], (key, once[key], plain[key])
    assert once["value"] == 42 and once["relative"].endswith(".pkg.sibling"), once
    assert once["missing"] == "ImportError", "a name the zip lacks must fail as it does without the finder"
    # just before the path finder: whatever is first (ansible-test's import checker) still sees every import
    assert once["first_kept"] and once["finders"].index("ZipFinder") + 1 == once["finders"].index("PathFinder"), once


def test_modules_on_disk_are_left_to_the_usual_finders(tmp_path):
    finder = _zipimport.ZipFinder()
    assert finder.find_spec(_zipimport.PREFIX + "pkg", [str(tmp_path)]) is None  # a directory, not a zip
    assert finder.find_spec("json", None) is None  # not this collection's
    assert finder.find_spec(_zipimport.PREFIX + "pkg", [str(tmp_path / "no.zip" / "x")]) is None  # no such zip


@pytest.mark.parametrize("python", PYTHONS)
def test_a_later_run_of_the_same_interpreter_compiles_nothing(python, payload_zip, tmp_path):
    """What a run compiled (exported) lets the next run of that interpreter import the same modules with no
    compile() at all, with the same attributes (the controller keeps it between a host's runs)."""
    blob = str(tmp_path / "compiled")
    first = probe(python, payload_zip, "finder", out=blob)
    assert first["compiled"] == {"__init__.py": 1, "mod.py": 1, "sibling.py": 1}, first
    second = probe(python, payload_zip, "preload", blob, out=str(tmp_path / "again"))
    assert second["preloaded"] is True and second["compiled"] == {}, second
    for key in ("value", "relative", "file", "pkg_file", "pkg_path", "package", "origin", "source", "missing"):
        assert second[key] == first[key], (key, second[key], first[key])
    # what the second run hands back still holds every module (given, not compiled, this time)
    third = probe(python, payload_zip, "preload", str(tmp_path / "again"))
    assert third["preloaded"] is True and third["compiled"] == {}, third
    assert first["compiled_here"] is True and second["compiled_here"] is third["compiled_here"] is False


@pytest.mark.parametrize("python", PYTHONS[-1:])
def test_a_module_imported_before_the_code_arrives_is_not_a_reason_to_send_it_back(python, payload_zip, tmp_path):
    """A module the caller imports before it can read its arguments is compiled in every run, although the code
    it is given holds it: that must not make every run hand all the code back (and the controller store it)."""
    blob = str(tmp_path / "compiled")
    probe(python, payload_zip, "finder", out=blob)
    early = probe(python, payload_zip, "early", blob)
    assert early["preloaded"] is True and early["compiled_here"] is False, early
    # code that lacks a module this run compiled: then there is something to hand back
    with zipfile.ZipFile(payload_zip, "a") as z:
        z.writestr(f"{MU}/pkg/absent.py", "NAME = 1\n")
    grown = probe(python, payload_zip, "early", blob)
    assert grown["missing"] == "imported" and grown["compiled_here"] is True, grown


def test_code_of_another_interpreter_or_damaged_code_is_never_loaded(payload_zip, tmp_path):
    """The tag (magic number and version) must be the running interpreter's: anything else is compiled from
    the zip as if no code had been given."""
    if len(PYTHONS) < 2:
        pytest.skip("needs two Python versions")
    other, this = PYTHONS[0], PYTHONS[-1]
    theirs = str(tmp_path / "theirs")
    probe(other, payload_zip, "finder", out=theirs)
    got = probe(this, payload_zip, "preload", theirs)
    assert got["preloaded"] is False and got["compiled"] == {"__init__.py": 1, "mod.py": 1, "sibling.py": 1}, got
    ours = tmp_path / "ours"
    probe(this, payload_zip, "finder", out=str(ours))
    data = ours.read_bytes()
    cut = data.index(b"\0", len(b"hostlock-code/1\0") + 4) + 1  # the tag: marker, magic number, version
    for damaged in (data[:cut] + b"not zlib", data[:cut] + zlib.compress(b"\xff\x00"), data[: cut - 3], b""):
        (tmp_path / "bad").write_bytes(damaged)
        got = probe(this, payload_zip, "preload", str(tmp_path / "bad"))
        assert got["preloaded"] is False and got["compiled"]["mod.py"] == 1, (damaged[:40], got)
    # and in-process: code objects only, under names of this package
    assert _zipimport.preload(_zipimport.TAG + zlib.compress(marshal.dumps({"x": 1}))) is True
    assert _zipimport.take("x") is None
