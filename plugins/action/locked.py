# Copyright: (c) 2025, hostlock maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Action hostlock.core.locked: build the wrapped module here, run it under the lock on the host in one go.

The controller resolves the wrapped module as the task executor would (module_defaults, environment,
become, check mode, diff, no_log: everything `_update_module_args`/`_configure_module` put in a payload,
as async does), and runs ONE module on the host, hostlock.core.locked, carrying that payload. The host
side (module_utils/_runner.py) takes the lock, runs the payload as its child, and releases after the child
ends, so the lock lives exactly as long as the work, whatever happens to the controller or the connection.

With `fleet` (or $HOSTLOCK_FLEET on the controller) the lock is an etcd lock taken here, in the task's
worker on the controller: it is acquired, the wrapped task runs as it would on its own (its own action
plugin included), and the lock is released. Hosts need no route to etcd.
"""

from __future__ import annotations

import time
import typing as t

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase
from ansible_collections.hostlock.core.plugins.module_utils import _messages
from ansible_collections.hostlock.core.plugins.module_utils._argspec import (
    LOCKED,
    MUTUALLY_EXCLUSIVE,
    REQUIRED_ONE_OF,
    coerced_option,
    on_controller,
)
from ansible_collections.hostlock.core.plugins.module_utils._common import (
    RESULT_KEY,
    would_acquire,
)
from ansible_collections.hostlock.core.plugins.module_utils.hostlock import HostlockError, LockTimeout, parse_duration
from ansible_collections.hostlock.core.plugins.plugin_utils import _fleet, _hostcode, _hostlease, _payload
from ansible_collections.hostlock.core.plugins.plugin_utils._controller import task_label
from ansible_collections.hostlock.core.plugins.plugin_utils._runid import (
    LOCAL_TRANSPORTS,
    controller_process,
    run_marker,
)

# The task's name in messages; the module it runs on the host is the internal one (plugins/modules/locked_host.py).
LOCKED_MODULE = "hostlock.core.locked"
HOST_MODULE = _hostlease.LOCKED_MODULE

# Task keywords that look like modules but are run by the strategy on the controller: there is
# nothing to run on the host while holding the lock.
NOT_WRAPPABLE = frozenset(
    "ansible.builtin." + n
    for n in (
        "include_tasks",
        "import_tasks",
        "include_role",
        "import_role",
        "import_playbook",
        "meta",
        "add_host",
        "group_by",
        "set_fact",
        "set_stats",
        "debug",
        "fail",
        "assert",
        "pause",
        "async_status",
        "include_vars",  # its variables would become the host's facts (another precedence), not included vars
        "wait_for_connection",  # waits here for a host that may not answer yet: the lease needs it to
        "validate_argument_spec",
    )
)

# Action plugins that only run their module (command) or the command module with a flag (shell): the
# payload of that module is exactly what they would run on the host.
THIN_ACTIONS = {
    "ansible.builtin.command": ("ansible.legacy.command", {}),
    "ansible.builtin.shell": ("ansible.legacy.command", {"_uses_shell": True}),
}

# Action plugins whose first step on the host is a module run (after housekeeping: the temporary directory,
# `~`): a locked task takes its lease in that run (plugin_utils/_hostlease.TaskLease). Others (script,
# raw, any other collection's) take it with a module run of its own before they start.
FOLDED = frozenset(
    prefix + n for prefix in ("ansible.builtin.", "ansible.legacy.")
    for n in ("template", "copy", "fetch", "package", "service")
)

# raw runs a command without the task's environment: nothing marks it as the lease's in-flight work.
RAW = frozenset(("ansible.builtin.raw", "ansible.legacy.raw"))

# What to do instead, for tasks that run on the controller only (nothing to lock on the host).
BLOCK_HINT = (
    "Put it in a tasks file and include the hostlock.core.with_lock role with with_lock_tasks: FILE (docs/ansible.md, "
    "'Several tasks'): the lock then lives as long as the file's work."
)

# The task's options (one home: module_utils/_argspec.py), checked here; paths are the host's, expanded there.
ARGUMENT_SPEC = on_controller(LOCKED)
# What the wrapped module finds in its environment under a fleet lock (as `hostlock run --fleet` jobs do).
FENCE_ENV = "HOSTLOCK_FENCE"


def split_task(task: dict) -> tuple[str, t.Any]:
    """(module, args) from `task`: {module: M, args: A} or the task's own shape {M: A}."""
    if "module" in task:
        extra = set(task) - {"module", "args"}
        if extra:
            raise AnsibleActionFail(f"hostlock.core.locked: task takes module and args, not {sorted(extra)}")
        return str(task["module"]), task.get("args")
    if len(task) != 1:
        raise AnsibleActionFail(
            "hostlock.core.locked: task must be {module: NAME, args: {...}} or one module as in a task "
            f"({{ansible.builtin.command: echo hi}}), not the keys {sorted(task)}"
        )
    ((name, args),) = task.items()
    return str(name), args


def parse_args(args: t.Any, name: str = "") -> dict:
    """The wrapped task's args as the task's own parser makes them (ansible.parsing.mod_args): a string is
    `key=value` words, and for a free-form module (command, shell, script, raw) the rest is its command,
    its own options (`creates=`, `chdir=`...) taken out as they would be."""
    if args is None:
        return {}
    if isinstance(args, str):  # `ansible.builtin.command: echo hi chdir=/tmp`, `ansible.builtin.file: path=/x`
        from ansible.parsing.mod_args import FREEFORM_ACTIONS
        from ansible.parsing.splitter import parse_kv

        return dict(parse_kv(args, check_raw=name in FREEFORM_ACTIONS))
    if not isinstance(args, dict):
        raise AnsibleActionFail(f"hostlock.core.locked: task args must be a mapping or a string, not {args!r}")
    return dict(args)


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _supports_check_mode = True
    # async would return before the wrapped module ends, so the lock would not cover it.
    _supports_async = False

    def run(self, tmp: t.Any = None, task_vars: dict | None = None) -> dict:
        coerced = coerced_option(self._task.args)
        if coerced:
            raise AnsibleActionFail(f"{LOCKED_MODULE}: {_messages.coerced(*coerced)}")
        self._check_shape()
        result = super().run(tmp, task_vars)
        del tmp
        task_vars = task_vars or {}
        # raises AnsibleActionFail naming the bad option; args are the validated, defaulted ones
        try:
            _validation, args = self.validate_argument_spec(
                ARGUMENT_SPEC, mutually_exclusive=MUTUALLY_EXCLUSIVE, required_one_of=REQUIRED_ONE_OF
            )
        except AnsibleActionFail as e:  # ansible-core names the plugin by its file's import path: say the task's
            raise AnsibleActionFail(str(e.message).replace(str(self._load_name), LOCKED_MODULE)) from None
        for key in ("timeout", "lease"):
            if args[key] is not None:
                try:
                    args[key] = parse_duration(args[key], key)
                except ValueError as e:
                    raise AnsibleActionFail(f"hostlock.core.locked: {e}") from None
        name, raw = split_task(args["task"])
        fleet = _fleet.fleet_of(args)
        if fleet and args["path"]:
            raise AnsibleActionFail(
                "hostlock.core.locked: path (a kernel lock on a file of the host) and fleet (a lock in etcd) "
                "exclude each other; fleet: '' takes a host lock when HOSTLOCK_FLEET is set"
            )
        fqcn, module_args = self._resolve(name, parse_args(raw, name))
        if fleet:
            result.update(self._run_fleet(fleet, args, fqcn, module_args, task_vars))
            return result
        if self._handler != "ansible.legacy.normal":  # its own action plugin: under a lease on the host
            result.update(self._run_leased(args, fqcn, module_args, task_vars))
            return result

        if not self._is_pipelining_enabled("new") and self._connection._shell.tmpdir is None:
            # the wrapped module's _ansible_tmpdir must be the task's one, made before its args are built
            self._make_tmp_path()
        self._update_module_args(fqcn, module_args, task_vars)
        bits, _path = self._configure_module(fqcn, module_args, task_vars)
        if bits.module_style != "new":
            raise AnsibleActionFail(
                f"hostlock.core.locked: {fqcn} is not an AnsiballZ (Python) module ({bits.module_style} style): "
                "it cannot run under the host-side lock; lock it with hostlock.core.lock around it"
            )
        label = args["label"] or task_label(self._task, task_vars)
        locked_args = {k: args[k] for k in ("name", "path", "timeout", "mode", "slots", "directory", "on_conflict")}
        locked_args = {k: v for k, v in locked_args.items() if v is not None or k not in ("name", "path")}
        if getattr(self._connection, "transport", None) in LOCAL_TRANSPORTS:
            # the host is this machine: its wait can watch the run's process itself (a SIGKILLed
            # ansible-playbook leaves its worker, and so the module's stdout, alive)
            locked_args["controller"] = controller_process()
        locked_args.update(
            # "[run ID task]": a holder that ends by itself, so the run's other hosts wait for it in turn
            label=f"{label} {run_marker(task=True)}",
            task=dict(module=fqcn),
            payload=_payload.encoded(self, bits.b_module_data, task_vars, HOST_MODULE),
        )
        result.update(_hostcode.run_with(
            lambda a: self._execute_module(module_name=HOST_MODULE, module_args=a, task_vars=task_vars),
            locked_args, _hostcode.key(self, bits.shebang, task_vars), RESULT_KEY,
        ))
        self._remove_tmp_path(self._connection._shell.tmpdir)
        return result

    def _check_shape(self) -> None:
        """What ansible-core's own checks would say less clearly: async, an unknown option (even with `name`
        missing, which it reports instead), and a `task` that is not a mapping (a list, or a `k=v` string it
        would turn into one)."""
        if self._task.async_val:
            raise AnsibleActionFail(
                "hostlock.core.locked: async is refused: the task would return before the wrapped module ends, so "
                "the lock would not cover it. Drop async/poll, or hold the lock around an async task with "
                "hostlock.core.lock (heartbeat: true) in a block")
        given = self._task.args
        unknown = sorted(str(k) for k in given if k not in ARGUMENT_SPEC)
        if unknown:
            raise AnsibleActionFail(f"Unsupported parameters for ({LOCKED_MODULE}) module: {', '.join(unknown)}. "
                                    f"Supported parameters include: {', '.join(sorted(ARGUMENT_SPEC))}.")
        task = given.get("task")
        if task is not None and not isinstance(task, dict):
            kind = "a list" if isinstance(task, list) else "a string" if isinstance(task, str) else type(task).__name__
            raise AnsibleActionFail(f"hostlock.core.locked: task must be a mapping, one module as in a task "
                                    f"({{ansible.builtin.copy: {{src: a, dest: b}}}}) or {{module: NAME, args: ...}}, "
                                    f"not {kind}")

    def _resolve(self, name: str, module_args: dict) -> tuple[str, dict]:
        """The module the task executor would run for `name`, with the play's module_defaults applied.

        A module with its own action plugin is run by that plugin (`self._handler`), as the task would be on its
        own: under a fleet lock held here, or under a lease on the host (_run_leased).
        """
        self._handler = "ansible.legacy.normal"
        collections = self._task.collections
        ctx = self._shared_loader_obj.module_loader.find_plugin_with_context(name, collection_list=collections)
        action_loader = self._shared_loader_obj.action_loader
        has_action = bool(ctx.resolved and ctx.action_plugin) or action_loader.has_plugin(
            name, collection_list=collections
        )
        fqcn = ctx.resolved_fqcn if ctx.resolved else name
        if fqcn in NOT_WRAPPABLE or fqcn in (LOCKED_MODULE, HOST_MODULE):
            raise AnsibleActionFail(
                f"hostlock.core.locked: {fqcn} runs on the controller, not as one step on the host, so it cannot be "
                f"wrapped. {BLOCK_HINT}"
            )
        if not ctx.resolved and not has_action:
            raise AnsibleActionFail(f"hostlock.core.locked: no module or action named {name!r} to run (task.module)")
        module_args = self._with_module_defaults(fqcn, module_args)
        if fqcn in THIN_ACTIONS:
            module, extra = THIN_ACTIONS[fqcn]
            return module, {**module_args, **extra}
        if has_action:
            self._handler = fqcn
        return fqcn, module_args

    def _with_module_defaults(self, fqcn: str, module_args: dict) -> dict:
        """Apply the play's module_defaults for the wrapped module, as if it were the task itself."""
        try:
            from ansible.executor.module_common import _apply_action_arg_defaults
        except ImportError:  # a future ansible-core moved it: the wrapped args stay as written
            return module_args
        return _apply_action_arg_defaults(fqcn, self._task, module_args, self._templar)

    def _run_fleet(self, fleet: str, args: dict, fqcn: str, module_args: dict, task_vars: dict) -> dict:
        """Take the fleet lock here, run the wrapped task as it would run on its own, release; one line on failure."""
        name = args["name"]
        info: dict[str, t.Any] = dict(name=name, module=fqcn, fleet=fleet, taken=False, waited=0.0)
        if args["directory"]:
            return dict(failed=True, msg=f"lock {name}: {_fleet.DIRECTORY_CONFLICT}", **{RESULT_KEY: info})
        # "[run ID task]", not "[run ID]": a lock this run holds only for one task ends by itself, so other
        # hosts of the run may wait for it (a semaphore spreading the run's hosts over its slots).
        label = f"{args['label'] or task_label(self._task, task_vars)} {run_marker(task=True)}"
        lost: list[float] = []
        try:
            holders, info["path"] = _fleet.holder_dicts(name, fleet)
            if self._task.check_mode:
                info.update(event="check", free=would_acquire(holders, args["mode"], args["slots"]), holders=holders)
                return dict(self._run_wrapped(fqcn, module_args, task_vars, {}), **{RESULT_KEY: info})
            blockers = _fleet.own_blockers(holders, run_marker(), args["mode"], args["slots"])
            if blockers:
                info.update(event="self", holders=blockers)
                return self._refused(_messages.did_not_run(_fleet.self_wait_msg(name, blockers), fqcn), args, info)
            lock = _fleet.fleet_lock(name, fleet, args, label, on_lost=lambda *_a: lost.append(time.time()))
            started = time.monotonic()
            try:
                lock.acquire(timeout=args["timeout"])
            except LockTimeout as e:
                waited = round(time.monotonic() - started, 3)
                holders = [h.as_dict() for h in e.holders]
                info.update(event="conflict", holders=holders, waited=waited)
                msg = _messages.did_not_run(_fleet.conflict_msg(name, info["path"], fleet, waited, holders), fqcn)
                return self._refused(msg, args, info)
        except (HostlockError, ValueError) as e:
            return dict(failed=True, msg=f"lock {name}: {_fleet.one_line(e)}", **{RESULT_KEY: info})
        held_from = time.monotonic()
        fence = lock.fence
        info.update(event="locked", taken=True, waited=round(held_from - started, 3), fence=fence)
        try:
            result = self._run_wrapped(fqcn, module_args, task_vars, {FENCE_ENV: str(fence), _fleet.FLEET_ENV: fleet})
            held = _fleet.still_held(name, fleet, fence)  # before our release deletes the key
        finally:
            try:
                lock.release()
                info["released"] = True
            except HostlockError as e:  # etcd unreachable: the key ends with its lease, within the TTL
                info["released"] = False
                self._display.warning(f"lock {name}: could not release the fleet lock ({_fleet.one_line(e)}); "
                                      "it ends when its etcd lease runs out (ttl)")
            info["held"] = round(time.monotonic() - held_from, 3)
        result["fence"] = fence
        if held is None and not (lost or lock.lost):
            self._display.warning(f"lock {name}: etcd could not be read after {fqcn} ran, so the controller cannot "
                                  "confirm it held the fleet lock to the end (its keep-alive saw no loss)")
        if lost or lock.lost or held is False:
            when = time.strftime(" at %H:%M:%S", time.localtime(lost[0])) if lost else ""
            result.update(failed=True, msg=(
                f"fleet lock {name} was lost{when} while {fqcn} ran (its etcd lease ended: etcd unreachable "
                f"past the ttl, or the lock was broken); {fqcn} was not stopped and ran to its end, so it may have "
                f"overlapped the next holder, whose fence is higher than ours ({fence}). "
                f"Result of {fqcn}: {result.get('msg') or ('failed' if result.get('failed') else 'ok')}"
            ))
            info["event"] = "lost"
        result[RESULT_KEY] = info
        return result

    def _run_leased(self, args: dict, fqcn: str, module_args: dict, task_vars: dict) -> dict:
        """A task with its own action plugin (copy, template, package, raw, ...), under a heartbeat lease.

        Such a task runs partly here (rendering, transfers) and may run several modules on the host, so the
        lock cannot live inside one module run there: a lease on the host takes its place (as
        hostlock.core.lock with heartbeat: true), taken at the task's first step on the host, renewed from
        here while the run lives, and released after its last step (plugin_utils/_hostlease.TaskLease). The
        task's steps carry the lease's in-flight mark, so if the run dies the lease frees the lock only after
        the work it started on the host.
        """
        which = {k: args[k] for k in ("name", "path") if args[k] is not None}
        label = f"{args['label'] or task_label(self._task, task_vars)} {run_marker(task=True)}"
        lock_args = dict(which, state="acquired", heartbeat=True, mode=args["mode"], slots=args["slots"],
                         directory=args["directory"], timeout=args["timeout"], on_conflict="fail", label=label)
        lock_args = {k: v for k, v in lock_args.items() if v is not None}
        if getattr(self._connection, "transport", None) in LOCAL_TRANSPORTS:
            lock_args["controller"] = controller_process()  # as for the lock action: the run itself is watched
        if which.get("path"):
            lock_args.pop("slots", None)
        locked_args = {k: v for k, v in lock_args.items() if k not in ("state", "heartbeat", "on_conflict")}
        info: dict[str, t.Any] = dict(which, module=fqcn, taken=False, waited=0.0)
        # raw takes no environment (it would only warn): its command is not marked as in-flight work
        lease = _hostlease.TaskLease(self, lock_args, locked_args, task_vars, mark=fqcn not in RAW)
        handler = self._wrapped_handler(fqcn, module_args, {})
        came_to_its_end = False  # else (the task's `timeout:`, a broken connection, an error) its work may run on
        try:
            if fqcn in FOLDED:  # its first step on the host is a module run: the lease is taken with it
                lease.attach()
            else:
                lease.take_first()
                lease.mark_task(handler._task)
            result = handler.run(task_vars=task_vars)
            came_to_its_end = not result.get("unreachable")
        except _hostlease.NotTaken as e:
            got = e.result
            lock_info = got.get(RESULT_KEY) or {}
            info.update(directory=lock_info.get("directory", got.get("directory")), waited=lock_info.get("waited", 0.0),
                        event=lock_info.get("event"), holders=lock_info.get("holders", got.get("holders", [])))
            shown = args["name"] or args["path"]
            return self._refused(_messages.did_not_run(got.get("msg") or f"lock {shown} not taken", fqcn), args, info)
        finally:
            lease.detach()
            taken = bool(lease.token)
            # Ended early, the task may have left its work running on the host: the lease then ends after it
            # (its in-flight mark), never before, as when the run dies.
            released = lease.end(expire=not came_to_its_end)
        lock_info = lease.info
        info.update(directory=lease.got.get("directory", lock_info.get("directory")),
                    waited=lock_info.get("waited", 0.0))
        if lease.checked:
            info.update(event="check", free=lock_info.get("free"), holders=lock_info.get("holders", []))
        elif taken:
            # from when the host had the lease (the wait left out) to after its release
            info.update(event="locked", taken=True, released=released, held=lease.held())
            if lease.lost:  # the lease ended under the task: what ran since may have overlapped another holder
                result.update(failed=True, msg=_messages.lease_lost(str(args["name"] or args["path"])))
            elif not released:
                self._display.warning(f"lock {args['name'] or args['path']}: could not release the lease after "
                                      f"{fqcn} ({lease.release_error}); it ends when its heartbeat stops")
        else:  # the task never reached the host: nothing to lock
            info.update(event="untouched")
        result[RESULT_KEY] = info
        return result

    def _refused(self, msg: str, args: dict, info: dict) -> dict:
        if args["on_conflict"] == "skip":
            return dict(skipped=True, changed=False, msg=msg, **{RESULT_KEY: info})
        return dict(failed=True, msg=msg, **{RESULT_KEY: info})

    def _run_wrapped(self, fqcn: str, module_args: dict, task_vars: dict, env: dict) -> dict:
        """Run the wrapped task as the task executor would run it on its own: its action plugin, its module.

        `env` is added to the task's environment (the fence); `no_log`, `become`, check mode and `--diff`
        are the task's own.
        """
        return self._wrapped_handler(fqcn, module_args, env).run(task_vars=task_vars)

    def _wrapped_handler(self, fqcn: str, module_args: dict, env: dict) -> t.Any:
        """The wrapped task's action plugin, on a copy of this task (its args, and `env` in its environment)."""
        task = self._task.copy()
        task.action = fqcn
        task._resolved_action = fqcn  # no setter: the task executor sets it the same way
        task.args = module_args
        own = task.environment if isinstance(task.environment, list) else [task.environment or {}]
        task.environment = [*own, env] if env else own
        return self._shared_loader_obj.action_loader.get(
            self._handler,
            task=task,
            connection=self._connection,
            play_context=self._play_context,
            loader=self._loader,
            templar=self._templar,
            shared_loader_obj=self._shared_loader_obj,
        )
