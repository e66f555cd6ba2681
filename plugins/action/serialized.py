# Copyright: (c) 2025, hostlock maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Action for hostlock.core.serialized: fail unless the serialize callback of this run holds this host.

The callback registers itself in plugin_utils/_serialize_state.py when it loads; this worker, forked from
ansible-playbook for this task, sees that state as the callback left it when the play's locks were taken.
"""

from __future__ import annotations

import typing as t

from ansible.plugins.action import ActionBase
from ansible_collections.hostlock.core.plugins.plugin_utils._serialize_config import why_not_active
from ansible_collections.hostlock.core.plugins.plugin_utils._serialize_state import active

PREFIX = "hostlock.core.serialized: "


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _supports_check_mode = True  # it only reads the callback's state
    _supports_async = False

    def run(self, tmp: t.Any = None, task_vars: dict | None = None) -> dict:
        result = super().run(tmp, task_vars)
        del tmp
        self.validate_argument_spec({})  # no options: a typo among them fails the task
        host = str((task_vars or {}).get("inventory_hostname") or "?")
        serializer = active()
        if serializer is None:
            return dict(result, failed=True, changed=False, msg=PREFIX + why_not_active())
        held = serializer.holds(host)
        if held:
            return dict(result, changed=False, msg=held)
        if serializer.check_only():
            return dict(result, changed=False, msg="hostlock.core.serialize is active; check mode takes no lock")
        return dict(result, failed=True, changed=False,
                    msg=PREFIX + f"hostlock.core.serialize is active but does not hold host {host}: it locks the "
                    "inventory hosts a play targets when the play starts, not hosts added later (add_host) nor "
                    "delegate_to targets")
