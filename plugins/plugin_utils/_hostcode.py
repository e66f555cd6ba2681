# Copyright: (c) 2025, hostlock maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""PRIVATE to this collection: the engine as a host's interpreter compiled it, kept for the rest of the run.

AnsiballZ ships module_utils as sources, so every hostlock.core.locked run compiled the engine on the host
(about 30 ms of Python 3.8's time, most of what the lock adds to a module run). The first locked run on a
host answers with the code objects it compiled (module_utils/_zipimport.py: tagged with the interpreter's
magic number and version, which must match for them to be loaded); the next runs on that host send them
back in their `compiled` option and compile nothing.

Kept in this ansible-playbook run's own local temporary directory (ansible-core's DEFAULT_LOCAL_TMP:
created 0700 for this run, removed when it ends), one file per key. Code is only ever sent back where it
came from: the key is the host as the connection reaches it, the remote user, the become user and method,
and the interpreter, so code that one host or one user's process produced never runs on another host or as
another user (a host could tamper with what it returns; it gains nothing by tampering with its own code).
"""

from __future__ import annotations

import base64
import hashlib
import os
import tempfile
import typing as t

DIRECTORY = "hostlock-compiled"


def key(action: t.Any, interpreter: str | None, task_vars: dict) -> str | None:
    """Where this task's code runs, as one string; None when that cannot be told (nothing is cached)."""
    if not interpreter:
        return None
    pc = action._play_context
    conn = action._connection
    parts = (
        getattr(conn, "transport", None) or type(conn).__name__,
        task_vars.get("inventory_hostname"),
        pc.remote_addr,
        pc.port,
        pc.remote_user,
        bool(pc.become),
        pc.become_user if pc.become else None,
        pc.become_method if pc.become else None,
        interpreter,
    )
    return hashlib.sha256(repr(parts).encode("utf-8", "surrogateescape")).hexdigest()


def _path(name: str, directory: str = DIRECTORY) -> str | None:
    from ansible import constants as C

    local_tmp = getattr(C, "DEFAULT_LOCAL_TMP", None)
    if not local_tmp or not os.path.isdir(local_tmp):
        return None
    return os.path.join(local_tmp, directory, name)


def load(name: str | None, directory: str = DIRECTORY) -> str:
    """The code kept for key `name` (base64 text), or "" (ask the host for its own); `directory`: another
    kind of text kept for the run (plugin_utils/_payload.py)."""
    path = _path(name, directory) if name else None
    if path is None:
        return ""
    try:
        with open(path, encoding="ascii") as f:
            return f.read()
    except (OSError, ValueError):
        return ""


def compiled(name: str | None) -> bytes:
    """The code kept for key `name`, decoded (b"": none)."""
    text = load(name)
    try:
        return base64.b64decode(text) if text else b""
    except ValueError:
        return b""


def store(name: str | None, compiled: t.Any, directory: str = DIRECTORY) -> None:
    """Keep `compiled` (a host's answer) for key `name`; a failure to keep it costs only speed."""
    path = _path(name, directory) if name else None
    if path is None or not isinstance(compiled, str) or not compiled:
        return
    try:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".new-")
        try:
            with os.fdopen(fd, "w", encoding="ascii") as f:
                f.write(compiled)
            os.replace(tmp, path)  # whole or not at all: another worker may read it meanwhile
        except BaseException:
            os.unlink(tmp)
            raise
    except (OSError, ValueError):
        pass


def run_with(execute: t.Callable[[dict], dict], module_args: dict, name: str | None, result_key: str) -> dict:
    """Run hostlock.core.locked (`execute(args)`) with the code kept for key `name`, and keep what it returns.

    The answer's code is taken out of the result here: it never reaches the task's result, a callback or
    a registered variable.
    """
    args = dict(module_args, compiled=load(name)) if name else module_args
    result = execute(args)
    info = result.get(result_key) if isinstance(result, dict) else None
    if isinstance(info, dict):
        store(name, info.pop("compiled", None))
    return result
