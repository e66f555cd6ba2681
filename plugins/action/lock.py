# Copyright: (c) 2025, hostlock maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Action for hostlock.core.lock: names the play, task and controller in the lock's default label.

A module on the host cannot see which play or task runs it; this controller-side step can, and adds
no round trip (the module is still run exactly once).
"""

from __future__ import annotations

import typing as t

from ansible.plugins.action import ActionBase
from ansible_collections.hostlock.core.plugins.plugin_utils._controller import task_label


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _supports_check_mode = True
    _supports_async = False

    def run(self, tmp: t.Any = None, task_vars: dict | None = None) -> dict:
        result = super().run(tmp, task_vars)
        del tmp
        args = dict(self._task.args)
        if not args.get("label") and args.get("state", "acquired") == "acquired":
            args["label"] = task_label(self._task, task_vars)
        result.update(self._execute_module(module_name="hostlock.core.lock", module_args=args, task_vars=task_vars))
        return result
