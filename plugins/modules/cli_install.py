#!/usr/bin/python
# Copyright: (c) 2025, hostlock maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# The install step of the hostlock.core.cli role (roles/cli/tasks/install.yml): every file of the command in one
# module run, where a copy task per file cost two module runs each (a stat, then a copy or a file).

from __future__ import annotations

DOCUMENTATION = r"""
---
module: cli_install
short_description: "Internal: installs the hostlock command's files for the hostlock.core.cli role; use the role"
version_added: 0.5.0
description:
  - The step of the M(hostlock.core.cli) role that writes the C(hostlock) package, the launcher, the man page and
    the bash completion in one module run, writing only the files that differ, then byte-compiles the package and
    builds its bundle with the launcher's interpreter. Apply the role; its tasks set every option.
  - Files and directories are owned by root. A file is replaced by a rename (a command starting meanwhile reads the
    old file or the new one, never half of one); a file whose content is right but not its mode or owner is fixed
    in place. Symbolic links are never followed at a file's path.
options:
  lib_dir:
    description: The library directory; the package goes to C(<lib_dir>/hostlock), the bundle beside it.
    type: path
    required: true
  package:
    description:
      - The package's files, path relative to C(<lib_dir>/hostlock) -> text, written with mode 0644.
      - A C(*.py) file under C(<lib_dir>/hostlock) that is not here (an older version's) is removed.
    type: dict
    required: true
  files:
    description: Other files (the launcher, the man page, the completion). Missing directories above them are
      created with mode 0755, as M(ansible.builtin.file) creates them; existing ones are left as they are.
    type: list
    elements: dict
    default: []
    suboptions:
      path:
        description: Absolute path.
        type: path
        required: true
      content:
        description: The file's text.
        type: str
        required: true
      mode:
        description: Octal mode.
        type: str
        required: true
  python:
    description: The launcher's interpreter, which byte-compiles the package and builds the bundle.
    type: path
    required: true
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
attributes:
  check_mode:
    support: full
    details: Reports the files it would write or remove and whether the bytecode or the bundle would change.
  diff_mode:
    support: none
  platform:
    platforms: posix
author:
  - hostlock maintainers (@hostlock)
"""

EXAMPLES = r"""
# Apply the role rather than this module; it sets every option:
- name: Install the hostlock command
  ansible.builtin.include_role:
    name: hostlock.core.cli
"""

RETURN = r"""
written:
  description: Files written (or, in check mode, that would be), package files first.
  returned: always
  type: list
  elements: str
fixed:
  description: Files and directories whose mode or owner was set (or would be); created directories too.
  returned: always
  type: list
  elements: str
removed:
  description: Files of an older version removed (or that would be).
  returned: always
  type: list
  elements: str
compiled:
  description: Whether byte-compiling the package compiled anything (in check mode, whether it would).
  returned: always
  type: bool
bundled:
  description: Whether the bundle was rewritten (in check mode, whether it would be).
  returned: always
  type: bool
"""

import os
import stat
import subprocess
import tempfile

from ansible.module_utils.basic import AnsibleModule

ROOT = 0  # uid and gid of every file and directory written
DIR_MODE = 0o755
PACKAGE_MODE = 0o644
BUNDLE = "cli/bundle.py"  # inside the package: run as a script by the launcher's interpreter (hostlock/cli/bundle.py)

# Check mode's view of what compileall and bundle.py would do, asked of the launcher's interpreter (its bytecode tag,
# its magic number, its compiler): "compile" when a module's bytecode is not the one compileall would leave as it is,
# "bundle" when bundle.build() would not give the files there, byte for byte. Reads only.
_PROBE = r"""
import importlib.util, os, sys
pkg, lib = sys.argv[1], sys.argv[2]
out = []
for dirpath, dirnames, filenames in os.walk(pkg):
    dirnames[:] = [d for d in dirnames if d != "__pycache__"]
    for name in filenames:
        if not name.endswith(".py"):
            continue
        src = os.path.join(dirpath, name)
        mtime = int(os.stat(src).st_mtime) & 0xFFFFFFFF
        expect = importlib.util.MAGIC_NUMBER + bytes(4) + mtime.to_bytes(4, "little")
        try:
            with open(importlib.util.cache_from_source(src), "rb") as f:
                fresh = f.read(12) == expect
        except OSError:
            fresh = False
        if not fresh:
            out.append("compile")
            break
    if out:
        break
spec = importlib.util.spec_from_file_location("_hostlock_bundle_build", os.path.join(pkg, "cli", "bundle.py"))
bundle = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bundle)
for path, data in zip((bundle.NAME + ".pyc", bundle.CODE), bundle.build(lib)):
    try:
        with open(os.path.join(lib, path), "rb") as f:
            same = f.read() == data
    except OSError:
        same = False
    if not same:
        out.append("bundle")
        break
print(" ".join(out))
"""


class Installer:
    """Plans the writes (check mode stops there), then makes them."""

    def __init__(self, module: AnsibleModule) -> None:
        self.module = module
        self.check = module.check_mode
        self.written: list[str] = []
        self.fixed: list[str] = []
        self.removed: list[str] = []
        self.seen: set[str] = set()  # directories already made right (or, in check mode, found wrong)

    def directory(self, path: str, fix: bool = True) -> None:
        """`path` a directory, created root's and 0755 with its missing parents (as the file module creates them);
        with `fix`, an existing one made root's and 0755 too (the library's own directories, not bin_dir)."""
        if path in self.seen:
            return
        self.seen.add(path)
        try:
            st = os.stat(path)  # followed: a lib_dir that is a link to a directory is used, as the file module does
        except FileNotFoundError:
            self.directory(os.path.dirname(path), fix=False)
            self.fixed.append(path)
            if not self.check:
                os.mkdir(path, DIR_MODE)
                os.chown(path, ROOT, ROOT)
                os.chmod(path, DIR_MODE)  # whatever the umask
            return
        if not stat.S_ISDIR(st.st_mode):
            raise OSError("%s exists and is not a directory" % path)
        if fix and (stat.S_IMODE(st.st_mode) != DIR_MODE or (st.st_uid, st.st_gid) != (ROOT, ROOT)):
            self.fixed.append(path)
            if not self.check:
                os.chown(path, ROOT, ROOT)
                os.chmod(path, DIR_MODE)

    def file(self, path: str, data: bytes, mode: int) -> None:
        """`path` a plain file of `data`, root's, `mode`: replaced by a rename unless its content is right already."""
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            st = None
        if st is not None and stat.S_ISREG(st.st_mode) and st.st_size == len(data) and self._reads(path, data):
            if stat.S_IMODE(st.st_mode) != mode or (st.st_uid, st.st_gid) != (ROOT, ROOT):
                self.fixed.append(path)
                if not self.check:
                    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
                    try:
                        os.fchown(fd, ROOT, ROOT)
                        os.fchmod(fd, mode)
                    finally:
                        os.close(fd)
            return
        self.written.append(path)
        if self.check:
            return
        if st is not None and stat.S_ISDIR(st.st_mode):
            raise OSError("%s is a directory" % path)
        fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", dir=os.path.dirname(path))
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                os.fchown(f.fileno(), ROOT, ROOT)
                os.fchmod(f.fileno(), mode)
            os.rename(tmp, path)
        except BaseException:
            os.unlink(tmp)
            raise
        if path.endswith(".py"):
            self._forget_bytecode(path)
        if self.module.selinux_enabled():
            self.module.set_default_selinux_context(path, False)

    @staticmethod
    def _forget_bytecode(path: str) -> None:
        """Remove a rewritten source's cached bytecode, so compileall compiles it again: its check compares the
        source's mtime in whole seconds and its size, which a rewrite within the same second to text of the same
        length would pass with the old code."""
        cache = os.path.join(os.path.dirname(path), "__pycache__")
        stem = os.path.basename(path)[:-3] + "."
        try:
            names = os.listdir(cache)
        except OSError:
            return
        for name in names:
            if name.startswith(stem) and name.endswith(".pyc"):
                os.unlink(os.path.join(cache, name))

    @staticmethod
    def _reads(path: str, data: bytes) -> bool:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            return False
        with os.fdopen(fd, "rb") as f:
            return f.read(len(data) + 1) == data

    def stale(self, package_dir: str, keep: set[str]) -> None:
        """Remove the *.py files under package_dir that `keep` (relative paths) does not name."""
        for dirpath, dirnames, filenames in os.walk(package_dir):  # never into a linked directory
            dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
            for name in sorted(filenames):
                path = os.path.join(dirpath, name)
                if name.endswith(".py") and os.path.relpath(path, package_dir) not in keep:
                    self.removed.append(path)
                    if not self.check:
                        os.unlink(path)

    def run(self, argv: list[str]) -> str:
        """The interpreter's stdout; its stderr as the task's one-line failure."""
        try:
            done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, check=False)
        except OSError as e:
            self.module.fail_json(msg="cannot run %s: %s" % (argv[0], e), **self.result())
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["exit status %d" % done.returncode])[-1]
            self.module.fail_json(msg="%s failed: %s" % (" ".join(argv), last), stderr=done.stderr, **self.result())
        return done.stdout

    def result(self) -> dict:
        return dict(written=self.written, fixed=self.fixed, removed=self.removed)


def install(module: AnsibleModule) -> dict:
    p = module.params
    lib_dir = os.path.normpath(p["lib_dir"])
    package_dir = os.path.join(lib_dir, "hostlock")
    package = {os.path.normpath(rel): text for rel, text in p["package"].items()}
    for rel in package:
        if rel.startswith(("/", "..")) or not rel.endswith(".py"):
            module.fail_json(msg="package file %s: not a .py path inside the package" % rel)
    if BUNDLE not in package:
        module.fail_json(msg="the package has no %s: not a hostlock package" % BUNDLE)
    todo = Installer(module)
    try:
        todo.directory(lib_dir)
        todo.directory(package_dir)
        for rel in sorted(package):
            todo.directory(os.path.dirname(os.path.join(package_dir, rel)))
            todo.file(os.path.join(package_dir, rel), package[rel].encode("utf-8"), PACKAGE_MODE)
        todo.stale(package_dir, set(package))
        for f in p["files"]:
            todo.directory(os.path.dirname(f["path"]), fix=False)
            todo.file(f["path"], f["content"].encode("utf-8"), int(f["mode"], 8))
    except (OSError, ValueError) as e:
        module.fail_json(msg="cannot install the hostlock command: %s" % e, **todo.result())
    python = p["python"]
    # As bundle.py's docstring says the bundle is built: no column positions (3.11+; older ones ignore -X).
    build = [python, "-X", "no_debug_ranges", "-I", "-S"]
    sources_change = any(path.startswith(package_dir + "/") for path in todo.written + todo.removed)
    if todo.check:
        if sources_change or not os.path.isdir(package_dir):
            compiled = bundled = True
        else:
            probe = todo.run([*build, "-c", _PROBE, package_dir, lib_dir]).split()
            compiled, bundled = "compile" in probe, "bundle" in probe
    else:
        compiled = "Compiling " in todo.run([python, "-I", "-S", "-m", "compileall", package_dir])
        bundled = "wrote " in todo.run([*build, os.path.join(package_dir, BUNDLE), lib_dir])
    changed = bool(todo.written or todo.fixed or todo.removed or compiled or bundled)
    # The package's text is the bulk of the arguments: not echoed back in the result.
    args = dict(lib_dir=lib_dir, python=python, package=sorted(package),
                files=[dict(path=f["path"], mode=f["mode"]) for f in p["files"]])
    return dict(changed=changed, compiled=compiled, bundled=bundled, invocation=dict(module_args=args),
                **todo.result())


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            lib_dir=dict(type="path", required=True),
            package=dict(type="dict", required=True),
            files=dict(type="list", elements="dict", default=[], options=dict(
                path=dict(type="path", required=True),
                content=dict(type="str", required=True),
                mode=dict(type="str", required=True),
            )),
            python=dict(type="path", required=True),
        ),
        supports_check_mode=True,
    )
    module.exit_json(**install(module))


if __name__ == "__main__":
    main()
