# Copyright: (c) 2025, hostlock maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Action hostlock.core.locked: run one module (or action) while holding a host lock.

Three steps on the host: take a lease with the hostlock.core.lock module, run the wrapped module with
its arguments, release the lease. The release runs whatever the wrapped module did (failed, raised,
lost the connection); if the release cannot reach the host, the lease frees the lock when it ends.
The lock costs exactly two extra module runs, sharing the task's remote temporary directory.
"""

from __future__ import annotations

import time
import typing as t

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase
from ansible.utils.display import Display
from ansible_collections.hostlock.core.plugins.module_utils._common import RESULT_KEY, describe_holders, live_holders
from ansible_collections.hostlock.core.plugins.plugin_utils._controller import task_label

display = Display()

LOCK_MODULE = "hostlock.core.lock"

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
    )
)

ARGUMENT_SPEC = dict(
    name=dict(type="str", required=True),
    lease=dict(type="float", required=True),
    timeout=dict(type="float"),
    mode=dict(type="str", choices=["exclusive", "shared"], default="exclusive"),
    slots=dict(type="int", default=1),
    # str, not path: the directory is on the managed host, the lock module expands it there.
    directory=dict(type="str"),
    label=dict(type="str"),
    on_conflict=dict(type="str", choices=["fail", "skip"], default="fail"),
    task=dict(
        type="dict",
        required=True,
        options=dict(
            module=dict(type="str", required=True),
            args=dict(type="dict", default={}),
        ),
    ),
)


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _supports_check_mode = True
    # async would return before the wrapped module ends, so the lock would not cover it.
    _supports_async = False

    def run(self, tmp: t.Any = None, task_vars: dict | None = None) -> dict:
        result = super().run(tmp, task_vars)
        del tmp
        task_vars = task_vars or {}
        # raises AnsibleActionFail naming the bad option; args are the validated, defaulted ones
        _validation, args = self.validate_argument_spec(ARGUMENT_SPEC)
        wrapped_name = args["task"]["module"]
        wrapped_args = dict(args["task"]["args"] or {})
        runner = self._wrapped_runner(wrapped_name, wrapped_args, task_vars)

        lock_args = {k: args[k] for k in ("name", "lease", "timeout", "mode", "slots", "directory", "on_conflict")}
        lock_args["label"] = args["label"] or task_label(self._task, task_vars)
        info: dict[str, t.Any] = dict(name=args["name"], event="locked", module=wrapped_name, lease=args["lease"])
        result[RESULT_KEY] = info

        taken = self._execute_module(module_name=LOCK_MODULE, module_args=lock_args, task_vars=task_vars)
        info.update(waited=taken.get("waited", 0.0), directory=taken.get("directory"))
        if taken.get("failed") or taken.get("skipped"):
            # Not locked: the wrapped module did not run. Report the lock module's verdict as ours.
            for key in ("failed", "skipped", "msg", "holders", "warnings"):
                if key in taken:
                    result[key] = taken[key]
            info.update(event="conflict" if taken.get("holders") else "error", held=0.0, released=True)
            result["changed"] = False
            return result

        token = taken.get("token")
        if self._task.check_mode:
            info.update(free=taken.get("free"), holders=taken.get("holders", []))
            if not taken.get("free"):
                display.warning(
                    "hostlock.core.locked: lock {} is held by {}; a real run would wait for it".format(
                        args["name"], describe_holders(live_holders(taken.get("holders", [])))
                    )
                )
        held_from = time.monotonic()
        try:
            result.update(runner())
        finally:
            info["held"] = round(time.monotonic() - held_from, 3)
            info["released"] = self._release(args, token, info, task_vars) if token else True
        result[RESULT_KEY] = info
        return result

    def _wrapped_runner(self, name: str, module_args: dict, task_vars: dict) -> t.Callable[[], dict]:
        """Resolve the wrapped name as the task executor would: its own action plugin, else the module."""
        collections = self._task.collections
        ctx = self._shared_loader_obj.module_loader.find_plugin_with_context(name, collection_list=collections)
        action_loader = self._shared_loader_obj.action_loader
        handler_name = None
        if ctx.resolved and ctx.action_plugin:
            handler_name = ctx.action_plugin
        elif action_loader.has_plugin(name, collection_list=collections):
            handler_name = name
        elif not ctx.resolved:
            raise AnsibleActionFail(f"hostlock.core.locked: no module or action named {name!r} to run (task.module)")
        fqcn = ctx.resolved_fqcn if ctx.resolved else name
        if fqcn in NOT_WRAPPABLE or fqcn == "hostlock.core.locked":
            raise AnsibleActionFail(
                f"hostlock.core.locked: {fqcn} runs on the controller, not as one step on the host, so it cannot be "
                "wrapped; take the lock with hostlock.core.lock (state=acquired) before it and release it after"
            )
        module_args = self._with_module_defaults(fqcn, module_args)

        if handler_name is None:

            def run_module() -> dict:
                return self._execute_module(module_name=fqcn, module_args=module_args, task_vars=task_vars)

            return run_module

        def run_action() -> dict:
            sub_task = self._task.copy(exclude_parent=False, exclude_tasks=True)
            sub_task.action = name
            sub_task.args = module_args
            handler = action_loader.get(
                handler_name,
                task=sub_task,
                connection=self._connection,
                play_context=self._play_context,
                loader=self._loader,
                templar=self._templar,
                shared_loader_obj=self._shared_loader_obj,
                collection_list=collections,
            )
            if handler is None:
                raise AnsibleActionFail(f"hostlock.core.locked: cannot load the action {handler_name!r} for {name}")
            return handler.run(task_vars=task_vars)

        return run_action

    def _with_module_defaults(self, fqcn: str, module_args: dict) -> dict:
        """Apply the play's module_defaults for the wrapped module, as if it were the task itself."""
        try:
            from ansible.executor.module_common import _apply_action_arg_defaults
        except ImportError:  # a future ansible-core moved it: the wrapped args stay as written
            return module_args
        return _apply_action_arg_defaults(fqcn, self._task, module_args, self._templar)

    def _release(self, args: dict, token: str, info: dict, task_vars: dict) -> bool:
        """Give the lease back; never raises (a failed release leaves the lease to end the lock)."""
        release_args = dict(name=args["name"], state="released", token=token, directory=args["directory"])
        try:
            res = self._execute_module(module_name=LOCK_MODULE, module_args=release_args, task_vars=task_vars)
        except Exception as e:  # connection lost, host gone: the lease is the safety net
            display.warning(
                "hostlock.core.locked: could not release lock {} ({}); its lease frees it within {}s".format(
                    args["name"], e, args["lease"]
                )
            )
            return False
        if res.get("failed"):
            display.warning(
                "hostlock.core.locked: releasing lock {} failed: {}; its lease frees it within {}s".format(
                    args["name"], res.get("msg"), args["lease"]
                )
            )
            return False
        if not res.get("changed"):
            display.warning(
                "hostlock.core.locked: the lease on {} had ended before the task did (lease {}s): "
                "the task was not covered by the lock to the end; raise lease".format(args["name"], args["lease"])
            )
            info["lease_ran_out"] = True
        return True
