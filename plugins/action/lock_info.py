# Copyright: (c) 2025, hostlock maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Action for hostlock.core.lock_info: fleet locks are read from etcd here, on the controller.

Without `fleet` (and $HOSTLOCK_FLEET) it only runs the module on the host, which reads the host's locks.
"""

from __future__ import annotations

import typing as t

from ansible.plugins.action import ActionBase
from ansible_collections.hostlock.core.plugins.module_utils import _messages
from ansible_collections.hostlock.core.plugins.module_utils._argspec import LOCK_INFO, coerced_option, on_controller
from ansible_collections.hostlock.core.plugins.module_utils.hostlock import HostlockError, list_locks, status
from ansible_collections.hostlock.core.plugins.module_utils.hostlock.core.metrics import with_figures
from ansible_collections.hostlock.core.plugins.plugin_utils import _fleet


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _supports_check_mode = True  # it only reads
    _supports_async = False

    def run(self, tmp: t.Any = None, task_vars: dict | None = None) -> dict:
        result = super().run(tmp, task_vars)
        del tmp
        coerced = coerced_option(self._task.args)
        if coerced:
            return dict(result, failed=True, msg=f"hostlock.core.lock_info: {_messages.coerced(*coerced)}")
        fleet = _fleet.fleet_of(self._task.args)
        if not fleet:
            args = _fleet.host_args(self._task.args)
            result.update(self._execute_module(module_name="hostlock.core.lock_info", module_args=args,
                                               task_vars=task_vars))
            self._remove_tmp_path(self._connection._shell.tmpdir)
            return result
        _validation, p = self.validate_argument_spec(on_controller(LOCK_INFO))
        if p["directory"]:
            return dict(result, failed=True, msg=f"lock_info: {_fleet.DIRECTORY_CONFLICT}")
        try:
            found = [status(p["name"], fleet=fleet)] if p["name"] else list_locks(fleet=fleet)
        except (HostlockError, ValueError) as e:
            return dict(result, failed=True, msg=f"lock_info: {_fleet.one_line(e)}", fleet=fleet)
        # the engine's one serializer, as for host locks (and `hostlock status --fleet --json`)
        locks = sorted((with_figures(s) for s in found), key=lambda s: s.get("name") or "")
        result.update(changed=False, locks=locks, fleet=fleet)
        return result
