# Copyright: (c) 2025, hostlock maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Action for hostlock.core.lock: names the play, task, controller and run in the lock's label.

A module on the host cannot see which play or task runs it; this controller-side step can, and adds
no round trip (the module is still run exactly once).
"""

from __future__ import annotations

import typing as t

from ansible.plugins.action import ActionBase
from ansible_collections.hostlock.core.plugins.plugin_utils._controller import task_label
from ansible_collections.hostlock.core.plugins.plugin_utils._runid import run_marker


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _supports_check_mode = True
    _supports_async = False

    def run(self, tmp: t.Any = None, task_vars: dict | None = None) -> dict:
        result = super().run(tmp, task_vars)
        del tmp
        args = dict(self._task.args)
        if args.get("state", "acquired") == "acquired" and not args.get("token"):
            # the run marker lets the host refuse at once a wait on a lock this same run holds
            args["label"] = f"{args.get('label') or task_label(self._task, task_vars)} {run_marker()}"
        result.update(self._execute_module(module_name="hostlock.core.lock", module_args=args, task_vars=task_vars))
        if result.get("hostlock", {}).get("event") == "renewed" and isinstance(args.get("token"), str):
            # The module masks values equal to its no_log parameter, so a renewal's `token` comes back as
            # VALUE_SPECIFIED_IN_NO_LOG_PARAMETER; a playbook re-registering it would lose the lease. It
            # is the token the task passed in: put it back.
            result["token"] = args["token"]
        return result
