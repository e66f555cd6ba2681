"""The `hostlock` command as the cli role installs it, for tests and benchmarks: the launcher rendered from the
role's own template (roles/cli/templates/hostlock.py.j2, the one text of it) and, beside the package, the
engine's bundle for the launcher's interpreter (hostlock/cli/bundle.py, run as the role runs it)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import jinja2

ROOT = Path(__file__).resolve().parents[1]
TEMPLATE = ROOT / "roles" / "cli" / "templates" / "hostlock.py.j2"
BUNDLE = "_hostlock_bundle.pyc"  # hostlock.cli.bundle.NAME + ".pyc" (test_cli_bundle.py checks it)
BUNDLE_CODE = "_hostlock_bundle.code"  # hostlock.cli.bundle.CODE: the modules' code, beside it
BUILD = ["-X", "no_debug_ranges", "-I", "-S"]  # the interpreter's options in the role's install module (cli_install)


def real_python() -> str:
    """The interpreter behind .venv/bin/python (never a pyenv shim, which adds ~100 ms a start)."""
    venv = ROOT / ".venv" / "bin" / "python"
    return os.path.realpath(venv if venv.exists() else sys.executable)


def package_at(rev: str, directory: str | Path) -> Path:
    """The directory holding commit `rev`'s hostlock package (git archive of plugins/module_utils/hostlock,
    extracted under `directory`/src-REV): an older engine to install beside this checkout's."""
    dest = Path(directory, "src-" + rev)
    dest.mkdir()
    tar = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "plugins/module_utils/hostlock"],
                         capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=tar, check=True)
    return dest / "plugins" / "module_utils"


def render(python: str, lib: str | Path) -> str:
    """The launcher's text for `python` and the library directory `lib`, as the role's template module writes it
    (Ansible renders templates with trim_blocks; ansible_managed is a comment line)."""
    env = jinja2.Environment(trim_blocks=True, keep_trailing_newline=True, undefined=jinja2.StrictUndefined)
    return env.from_string(TEMPLATE.read_text()).render(
        __cli_interpreter=python, __cli_lib_dir_literal=json.dumps(str(lib)), ansible_managed="Ansible managed")


def bundle(python: str, lib: str | Path) -> Path:
    """Build lib's bundle with `python` (the role's task); returns the path of its module (the .pyc)."""
    lib = str(lib)
    subprocess.run([python, *BUILD, os.path.join(lib, "hostlock", "cli", "bundle.py"), lib], check=True,
                   stdout=subprocess.DEVNULL)
    return Path(lib, BUNDLE)


def install(path: str | Path, python: str, lib: str | Path, bundled: bool = True) -> Path:
    """Write the launcher at `path` (mode 0755) for `python` and `lib`; with `bundled`, build lib's bundle first."""
    if bundled:
        bundle(python, lib)
    path = Path(path)
    path.write_text(render(python, lib))
    path.chmod(0o755)
    return path


def installed(directory: str | Path, python: str, package_parent: str | Path, name: str = "hostlock") -> Path:
    """All the role does for the command, into `directory`: the package (from `package_parent`/hostlock) copied
    to NAME.lib, byte-compiled and bundled for `python` (bundled only when that package has a bundle.py: an
    older commit's may not), the launcher at NAME. Returns the launcher's path."""
    lib = Path(directory, name + ".lib")
    shutil.copytree(Path(package_parent, "hostlock"), lib / "hostlock", dirs_exist_ok=True,
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    subprocess.run([python, "-I", "-S", "-m", "compileall", "-q", str(lib / "hostlock")], check=True)
    return install(Path(directory, name), python, lib, bundled=(lib / "hostlock" / "cli" / "bundle.py").exists())
