# Copyright: (c) 2025, hostlock maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""PRIVATE to this collection: call one engine function on a managed host in one short interpreter run.

A module run costs a Python start plus ansible.module_utils.basic and the AnsiballZ unpacking (about
180 ms locally, 270 ms over SSH); releasing a lease needs none of that. This sends the engine's own
source files (those the called function imports, read from this collection's module_utils/hostlock, the
same files every payload carries) and the call's arguments on the standard input of
`PYTHON -I -S -c BOOT`, where BOOT imports them from memory and prints one result line. The token
travels on standard input, never on a command line (`ps` shows those to every user).

The engine's package __init__ files are replaced by empty ones: `hostlock/__init__.py` imports the
whole engine, and the called function's own imports say what it needs.

Compiling those sources is most of such a run's own time (about 11 ms of Python 3.8's for a release).
Given the code the host's interpreter compiled in this run's locked module runs (plugin_utils/_hostcode.py;
the release runs the same interpreter, as the same user), BOOT loads that instead, through the same
module_utils/_zipimport.py (its preload() refuses another interpreter's code: then BOOT compiles).
"""

from __future__ import annotations

import ast
import marshal
import os
import shlex
import typing as t

ENGINE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "module_utils", "hostlock")

# Runs on the host (any Python 3 the collection supports): a finder serving the shipped sources, the call,
# one line out. Python's own marshal reads what the controller's wrote (format 4, plain values only).
_BOOT = r'''
import sys
from importlib.machinery import ModuleSpec
S = D["modules"]
Z = {"__name__": "_zipimport", "take": lambda name: None}
if D["compiled"]:  # compiled and checked by _zipimport only when there is code to load
    exec(compile(D["zipimport"], "<hostlock>/_zipimport", "exec"), Z)
    Z["preload"](D["compiled"])
class F:
    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if name in S:
            return ModuleSpec(name, cls, is_package=S[name][0])
    @staticmethod
    def create_module(spec):
        return None
    @staticmethod
    def exec_module(m):
        if S[m.__name__][0]:
            m.__path__ = []
        c = None if S[m.__name__][0] else Z["take"](m.__name__)  # packages stay empty
        exec(c or compile(S[m.__name__][1], "<hostlock>/" + m.__name__, "exec"), m.__dict__)
sys.meta_path.insert(0, F)
module, _, func = D["call"].partition(":")
try:
    __import__(module)
    getattr(sys.modules[module], func)(*D["args"], **D["kwargs"])
except Exception as e:
    print("hostlock-call: error %s %s %s" % (type(e).__name__, getattr(e, "reason", "-") or "-",
                                              str(e).replace("\n", " ")))
else:
    print("hostlock-call: ok")
'''
COMMAND = "-I -S -c " + shlex.quote("import marshal,sys;D=marshal.loads(sys.stdin.buffer.read());exec(D['boot'])")
_CACHE: dict = {}


def _source(name: str) -> tuple[bool, str]:
    """(is a package, source) of engine module `name` (hostlock.X.Y); packages come empty."""
    parts = name.split(".")[1:]
    base = os.path.join(ENGINE, *parts)
    if os.path.isdir(base):
        return True, ""
    with open(base + ".py", encoding="utf-8") as f:
        return False, f.read()


def _imports(name: str, source: str, is_package: bool) -> set:
    """Engine modules `name` imports at its top level (function-level imports are the caller's roots)."""
    package = name if is_package else name.rpartition(".")[0]
    found = set()
    for node in ast.parse(source).body:
        if isinstance(node, ast.ImportFrom) and node.level:
            base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
            target = ".".join(base + ([node.module] if node.module else []))
            for alias in node.names:
                sub = target + "." + alias.name
                found.add(sub if os.path.exists(os.path.join(ENGINE, *sub.split(".")[1:]) + ".py") else target)
    return found


def closure(roots: t.Iterable[str]) -> dict:
    """Sources of `roots` and every engine module they import at top level, with their packages."""
    key = tuple(sorted(roots))
    if key in _CACHE:
        return _CACHE[key]
    modules: dict = {}
    todo = list(key)
    while todo:
        name = todo.pop()
        if name in modules:
            continue
        parts = name.split(".")
        for i in range(1, len(parts)):  # its packages, empty
            modules.setdefault(".".join(parts[:i]), [True, ""])
        is_package, source = _source(name)
        modules[name] = [is_package, source]
        todo.extend(_imports(name, source, is_package) - set(modules))
    _CACHE[key] = modules
    return modules


def _plain(value: t.Any) -> t.Any:
    """`value` in the plain types marshal writes (ansible-core's tagged strings and containers are subclasses)."""
    if value is None or type(value) in (bool, int, float):
        return value
    if isinstance(value, str):
        return value.encode("utf-8", "surrogateescape").decode("utf-8", "surrogateescape")
    if isinstance(value, dict):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    raise TypeError(f"cannot send a {type(value).__name__} to the host")


def _zipimport_source() -> str:
    if "_zipimport" not in _CACHE:
        with open(os.path.join(os.path.dirname(ENGINE), "_zipimport.py"), encoding="utf-8") as f:
            _CACHE["_zipimport"] = f.read()
    return _CACHE["_zipimport"]


def request(call: str, roots: t.Iterable[str], *args: t.Any, compiled: bytes = b"",
            **kwargs: t.Any) -> tuple[str, bytes]:
    """(the command's arguments after the interpreter, its standard input) for calling `call` (module:function);
    `compiled`: what module_utils/_zipimport.exported() gave on the host, for this same interpreter."""
    data = dict(boot=_BOOT, modules=closure(roots), zipimport=_zipimport_source(), compiled=bytes(compiled),
                call=call, args=_plain(list(args)), kwargs=_plain(kwargs))
    return COMMAND, marshal.dumps(data, 4)


def outcome(stdout: str) -> tuple[bool, str]:
    """(ok, the error line) from the command's output: only our own last line counts."""
    lines = [line for line in stdout.splitlines() if line.startswith("hostlock-call: ")]
    if not lines:
        return False, "no answer from the host's interpreter"
    last = lines[-1][len("hostlock-call: "):]
    return last == "ok", "" if last == "ok" else last[len("error "):]


# What a lease release imports: the channel client, and host.safepath, which find_channel imports when called.
RELEASE_ROOTS = ("hostlock.host.channel", "hostlock.host.safepath")
RELEASE_CALL = "hostlock.host.channel:release"


def warm() -> None:
    """Read and parse the release's sources now: called at import, which happens in ansible-playbook's own
    process (its strategy loads the action plugins), so each task's forked worker inherits them instead of
    parsing them again (about 7 ms a task)."""
    try:
        closure(RELEASE_ROOTS)
        _zipimport_source()
    except (OSError, SyntaxError, ValueError):  # said again, and reported, by the first request
        pass


warm()
