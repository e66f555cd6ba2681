# Copyright: (c) 2025, hostlock maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""PRIVATE to this collection: a heartbeat lease on a managed host, for the action plugins that take one.

hostlock.core.lock takes one when asked (`heartbeat: true`); hostlock.core.locked takes one around a wrapped
task that has its own action plugin (copy, template, package, raw, ...): that task runs partly on the
controller and may call several modules on the host, so the lock cannot live inside one module run there.
The lease lives on the host (it excludes the host's own `hostlock run` jobs), is renewed from the control
node while the run lives, and when the run dies its holder frees the lock once the work it marked (the
lease's in-flight environment, given to the wrapped task) has ended on the host.
"""

from __future__ import annotations

import os
import shlex
import time
import typing as t

from ansible_collections.hostlock.core.plugins.module_utils._common import RESULT_KEY
from ansible_collections.hostlock.core.plugins.plugin_utils import _engine_call, _heartbeat, _hostcode, _payload

# The modules the actions run on the host (internal: users write hostlock.core.lock and hostlock.core.locked,
# whose actions set the options only they know, such as the wrapped module's payload).
LOCK_MODULE = "hostlock.core.lock_host"
LOCKED_MODULE = "hostlock.core.locked_host"


def start_heartbeat(action: t.Any, args: dict, result: dict, task_vars: dict) -> dict:
    """Renew the lease from the control node until its release or the end of this run."""
    lease = float(result["lease"])
    renewal = {
        **{k: args[k] for k in ("name", "path") if args.get(k)},  # the one the lease was taken with
        "token": result["token"],
        "directory": result.get("directory") or args.get("directory"),
        "state": "acquired",
    }

    task_tmpdir = action._connection._shell.tmpdir

    def renew(seconds: float) -> str:  # runs in the heartbeat process, a copy of this worker
        if action._connection._shell.tmpdir == task_tmpdir:
            # the task's temporary directory is removed when the task ends: each renewal makes its own
            action._connection._shell.tmpdir = None
        try:
            got = action._execute_module(module_name=LOCK_MODULE, module_args=dict(renewal, lease=seconds),
                                         task_vars=task_vars)
        except Exception:  # noqa: BLE001 - connection failures: the next renewal tries again
            return _heartbeat.UNREACHABLE
        finally:
            try:
                action._remove_tmp_path(action._connection._shell.tmpdir)
            except Exception:  # noqa: BLE001 - a leftover temporary directory must not stop the heartbeat
                pass
        if got.get("unreachable"):
            return _heartbeat.UNREACHABLE
        if got.get("failed"):
            # only the holder saying the lease is gone ends the heartbeat; any other failure is retried
            return _heartbeat.GONE if "cannot renew" in str(got.get("msg")) else _heartbeat.UNREACHABLE
        return _heartbeat.OK

    # Workers are forked by the ansible-playbook process: the run is our parent.
    # The whole token: the heartbeat's socket name carries a proof made with its secret (_heartbeat._address).
    pid = _heartbeat.start(renew, result["token"], lease, os.getppid())
    return dict(pid=pid, every=round(lease / _heartbeat.RENEWALS_PER_LEASE, 3), lease=lease)


class NotTaken(BaseException):
    """The lease was not taken at the task's first step: the step and the task stop here.

    A BaseException: the wrapped action plugin's own `except Exception` must not turn it into its own failure.
    """

    def __init__(self, result: dict) -> None:
        super().__init__(result.get("msg"))
        self.result = result


# ActionBase steps that prepare or clean up (the task's temporary directory, its files' modes, `~`): they may
# run on the host before the lease is taken. Any other command is work, and is run under the lease.
HOUSEKEEPING = ("_make_tmp_path", "_remove_tmp_path", "_remote_expand_user", "_fixup_perms2", "_remote_chmod",
                "_remote_chown", "_remote_chgrp", "_remote_set_user_facl")


class TaskLease:
    """The heartbeat lease around one task that has its own action plugin, taken at its first step on the host.

    The wrapped action plugin runs as it would alone; its first module run goes through hostlock.core.locked
    with `heartbeat: true`, which takes the lease on the host and runs that module under it in the same run
    (no extra module run to take the lock). A command or a file fetch before any module run takes the lease
    first with hostlock.core.lock. Once the lease is taken, the controller renews it (the heartbeat), the task's
    next steps carry its in-flight mark, and end() releases it with one short interpreter run of the engine's
    own release (plugin_utils/_engine_call.py), or hostlock.core.lock where that cannot run.
    """

    def __init__(self, action: t.Any, lock_args: dict, locked_args: dict, task_vars: dict, mark: bool = True) -> None:
        self.action, self.lock_args, self.locked_args, self.task_vars = action, lock_args, locked_args, task_vars
        self.mark = mark  # give the task's steps the in-flight mark (raw takes no environment)
        self.release_error: str | None = None
        self.lost = False  # the heartbeat found the lease ended before the release
        self._detach: t.Callable[[], object] = lambda: None
        self.got: dict = {}  # the take's result: token, lease, directory, environment
        self.checked = False  # check mode: the first step reported the lock; nothing is held
        self.info: dict = {}
        self.interpreter: str | None = None
        self._busy = 0  # inside a housekeeping step or our own take: commands pass through
        self.deferred: list = []  # the task's temporary directories' removal, run with the release
        self.code_key: str | None = None  # where the first step ran: the host's compiled engine (_hostcode)
        self.answered_at: float | None = None  # when the host answered the take (monotonic)
        self.ended_at: float | None = None  # when the release was answered

    @property
    def token(self) -> str | None:
        return self.got.get("token")

    def attach(self) -> None:
        """Route the task's steps on the host through the lease until detach().

        The wrapped action plugin may run others (template runs copy's), each its own instance: the routing
        is on ActionBase itself, in this worker process, which runs this one task; our own action's calls
        (take, release, the heartbeat's renewals) pass through.
        """
        from ansible.plugins.action import ActionBase

        lease = self
        orig_module, orig_command = ActionBase._execute_module, ActionBase._low_level_execute_command
        routed = ("_execute_module", "_low_level_execute_command", *HOUSEKEEPING)
        saved = {name: ActionBase.__dict__[name] for name in routed}

        def execute_module(act: t.Any, module_name: t.Any = None, module_args: t.Any = None, tmp: t.Any = None,
                           task_vars: t.Any = None, persist_files: bool = False, delete_remote_tmp: t.Any = None,
                           wrap_async: bool = False, **kwargs: t.Any) -> dict:
            kwargs.update(tmp=tmp, persist_files=persist_files, delete_remote_tmp=delete_remote_tmp)
            if act is lease.action or lease.checked or lease._busy:
                return orig_module(act, module_name=module_name, module_args=module_args, task_vars=task_vars,
                                   wrap_async=wrap_async, **kwargs)
            if lease.token:
                lease.mark_task(act._task)
                return orig_module(act, module_name=module_name, module_args=module_args, task_vars=task_vars,
                                   wrap_async=wrap_async, **kwargs)
            return lease._take_with(act, orig_module, module_name, module_args, task_vars, wrap_async, kwargs)

        def low_level(act: t.Any, *args: t.Any, **kwargs: t.Any) -> dict:
            if not (act is lease.action or lease.token or lease.checked or lease._busy):
                lease.take_first()
            return orig_command(act, *args, **kwargs)

        ActionBase._execute_module = execute_module
        ActionBase._low_level_execute_command = low_level
        for name in HOUSEKEEPING:
            setattr(ActionBase, name, self._quiet(saved[name]))
        remove_now = self._quiet(saved["_remove_tmp_path"])

        def remove_tmp_path(act: t.Any, tmp_path: t.Any = None, force: bool = False) -> None:
            if tmp_path is None and act._connection._shell.tmpdir:
                tmp_path = act._connection._shell.tmpdir
            # Said in the release's command, one command on the host instead of two, where that command runs
            # as the user who made the directory or as root (the release runs with the task's become).
            if (lease.token and lease.interpreter and act is not lease.action and tmp_path
                    and not act._is_become_unprivileged() and (force or act._should_remove_tmp_path(tmp_path))):
                lease.deferred.append(act._connection._shell.remove(tmp_path, recurse=True))
                act._connection._shell.tmpdir = None
                return None
            return remove_now(act, tmp_path, force)

        ActionBase._remove_tmp_path = remove_tmp_path
        connection = self.action._connection
        orig_fetch = connection.fetch_file

        def fetch_file(*args: t.Any, **kwargs: t.Any) -> t.Any:
            if not (lease.token or lease.checked):
                lease.take_first()
            return orig_fetch(*args, **kwargs)

        connection.fetch_file = fetch_file

        def restore() -> None:
            for name, value in saved.items():
                setattr(ActionBase, name, value)
            connection.__dict__.pop("fetch_file", None)

        self._detach = restore

    def detach(self) -> None:
        self._detach()
        self._detach = lambda: None

    def _quiet(self, step: t.Callable) -> t.Callable:
        def run(*args: t.Any, **kwargs: t.Any) -> t.Any:
            self._busy += 1
            try:
                return step(*args, **kwargs)
            finally:
                self._busy -= 1
        return run

    def mark_task(self, task: t.Any) -> None:
        """The lease's in-flight mark in `task`'s environment (once), so its processes on the host carry it."""
        env = self.got.get("environment") or {}
        if not env or not self.mark:
            return
        own = task.environment if isinstance(task.environment, list) else [task.environment or {}]
        if env not in own:
            task.environment = [*own, env]

    def _take_with(self, act: t.Any, orig_module: t.Callable, module_name: t.Any, module_args: t.Any,
                   task_vars: t.Any, wrap_async: bool, kwargs: dict) -> dict:
        """The first module run: hostlock.core.locked with heartbeat takes the lease and runs it."""
        task_vars = task_vars if task_vars is not None else {}
        module_name = module_name or act._task.action
        module_args = dict(act._task.args if module_args is None else module_args)
        self._busy += 1
        try:
            if wrap_async or act._task.async_val:  # async returns before the module ends: take the lease first
                self.take_first()
            else:
                if not act._is_pipelining_enabled("new") and act._connection._shell.tmpdir is None:
                    act._make_tmp_path()  # the module's _ansible_tmpdir must be the task's, made before its args
                act._update_module_args(module_name, module_args, task_vars,
                                        ignore_unknown_opts=kwargs.get("ignore_unknown_opts", False))
                bits, _path = act._configure_module(module_name, module_args, task_vars)
                if bits.module_style != "new":
                    self.take_first()
                else:
                    args = dict(self.locked_args, heartbeat=True, task=dict(module=module_name),
                                payload=_payload.encoded(act, bits.b_module_data, task_vars, LOCKED_MODULE))
                    self.code_key = _hostcode.key(act, bits.shebang, task_vars)
                    result = _hostcode.run_with(
                        lambda a: orig_module(act, module_name=LOCKED_MODULE, module_args=a, task_vars=task_vars),
                        args, self.code_key, RESULT_KEY,
                    )
                    self.answered_at = time.monotonic()
                    self._taken(result, bits.shebang)
                    return result
        finally:
            self._busy -= 1
        self.mark_task(act._task)
        return orig_module(act, module_name=module_name, module_args=module_args, task_vars=task_vars,
                           wrap_async=wrap_async, **kwargs)

    def _taken(self, result: dict, shebang: str | None) -> None:
        info = result.pop(RESULT_KEY, None) or {}
        for key in ("token", "lease", "environment", "directory", "interpreter"):
            if key in info:
                self.got[key] = info.pop(key)
        self.info = info
        if info.get("event") == "check":
            self.checked = True
            return
        if info.get("event") != "locked" or not self.token:
            raise NotTaken(dict(result, **{RESULT_KEY: info}))
        self.interpreter = self.got.pop("interpreter", None) or _interpreter(shebang)
        self._started()

    def take_first(self) -> None:
        """Take the lease with its own module run (hostlock.core.lock): before a task whose first step on the
        host may not be a module run (script, raw), or before such a step."""
        a = self.action
        self._busy += 1
        try:
            got = a._execute_module(module_name=LOCK_MODULE, module_args=self.lock_args, task_vars=self.task_vars)
        finally:
            self._busy -= 1
        self.answered_at = time.monotonic()
        info = got.get(RESULT_KEY) or {}
        self.info = dict(info, waited=info.get("waited", 0.0))
        if a._task.check_mode:
            self.checked = True
            self.info.update(event="check")
            return
        if got.get("failed") or not got.get("token"):
            raise NotTaken(dict(got, **{RESULT_KEY: dict(info, event=info.get("event"))}))
        self.got = dict(token=got["token"], lease=got["lease"], directory=got.get("directory"),
                        environment=got.get("environment") or {})
        self.interpreter = _interpreter(getattr(a, "_used_interpreter", None))
        self.info["event"] = "locked"
        self._started()

    def _started(self) -> None:
        """The lease is ours: the controller renews it, and the task's next steps carry its in-flight mark."""
        try:
            start_heartbeat(self.action, dict(self.lock_args), self.got, self.task_vars)
        except (OSError, ValueError) as e:  # no heartbeat: give the lease back rather than hold it unrenewed
            self.end()
            raise NotTaken(dict(failed=True, msg=f"cannot start the lease's heartbeat on the control node ({e})",
                                **{RESULT_KEY: dict(self.info, event="error")})) from None

    def held(self) -> float:
        """Seconds the lease was held: on the host from its take to the end of the step that took it (no wait in it:
        the host measures from when it had the lease), then here from that answer to the release's. Two intervals,
        each on one clock, so a host's clock that differs from ours changes nothing."""
        if self.answered_at is None:
            return 0.0
        on_host = float(self.info.get("held") or 0.0)
        return round(on_host + max(0.0, (self.ended_at or time.monotonic()) - self.answered_at), 3)

    def end(self, expire: bool = False) -> bool:
        """Release the lease (stop its heartbeat first); whether the host said it is released.

        With `expire` (the task did not come to its end here: its `timeout:` struck, the connection broke, an
        error) the work it started on the host may run on: the release is then hostlock.core.lock's, which
        ends the lease after whatever still carries its in-flight mark (_task.LockTask.release), never the
        engine's plain release, which would let the next holder in beside that work.
        """
        token = self.got.pop("token", None)
        if not token:
            return True
        try:
            return self._release(token, expire)
        finally:
            self.ended_at = time.monotonic()

    def _release(self, token: str, expire: bool) -> bool:
        beating = _heartbeat.stop(token)
        self.lost = beating == _heartbeat.LOST  # released all the same; the task must fail
        which = {k: self.lock_args[k] for k in ("name", "path") if self.lock_args.get(k)}
        deferred, self.deferred = self.deferred, []
        if self.interpreter and not expire:
            try:
                args, data = _engine_call.request(
                    _engine_call.RELEASE_CALL, _engine_call.RELEASE_ROOTS, which.get("name", ""), token,
                    directory=self.got.get("directory"), path=which.get("path"),
                    compiled=_hostcode.compiled(self.code_key))
                command = "".join(f"{rm}; " for rm in deferred) + f"{shlex.quote(self.interpreter)} {args}"
                out = self.action._low_level_execute_command(command, in_data=data)
                deferred = []  # the command ran: its removals with it
                ok, _why = _engine_call.outcome(str(out.get("stdout", "")))
                if ok:
                    return True
            except Exception:  # noqa: BLE001 - the module below says what is wrong, or releases
                pass
        for rm in deferred:
            self.action._low_level_execute_command(rm, sudoable=False)
        release = dict(which, state="released", token=token, directory=self.got.get("directory"))
        freed = self.action._execute_module(module_name=LOCK_MODULE, module_args=release, task_vars=self.task_vars)
        self.release_error = None if not freed.get("failed") else str(freed.get("msg"))
        if beating and (freed.get("hostlock") or {}).get("event") == "released" and not freed.get("changed"):
            self.lost = True  # renewed until now, yet no lease to release: it ended under the task
        return not freed.get("failed")


def _interpreter(shebang: str | None) -> str | None:
    """The interpreter a module ran with (its `#!` line), when it is a plain path: the release runs it too."""
    if not shebang or not shebang.startswith("#!"):
        return None
    words = shebang[2:].split()
    if len(words) != 1 or not words[0].startswith("/"):  # `#!/usr/bin/env python3`: let the module release
        return None
    return words[0]
