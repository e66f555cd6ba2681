# Copyright: (c) 2025, hostlock maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Action for hostlock.core.lock: names the play, task, controller and run in the lock's label.

A module on the host cannot see which play or task runs it; this controller-side step can, and adds
no round trip (the module is still run exactly once). With `fleet` (or $HOSTLOCK_FLEET on the controller)
the lease is an etcd lease taken here, on the controller, and the host is not contacted at all.
"""

from __future__ import annotations

import typing as t

from ansible.plugins.action import ActionBase
from ansible_collections.hostlock.core.plugins.module_utils.hostlock import HostlockError
from ansible_collections.hostlock.core.plugins.modules.lock import (
    ARGUMENT_SPEC,
    MUTUALLY_EXCLUSIVE,
    REQUIRED_IF,
    params_error,
)
from ansible_collections.hostlock.core.plugins.plugin_utils import _fleet
from ansible_collections.hostlock.core.plugins.plugin_utils._controller import task_label
from ansible_collections.hostlock.core.plugins.plugin_utils._runid import run_marker


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _supports_check_mode = True
    _supports_async = False

    def run(self, tmp: t.Any = None, task_vars: dict | None = None) -> dict:
        result = super().run(tmp, task_vars)
        del tmp
        fleet = _fleet.fleet_of(self._task.args)
        if fleet:
            result.update(self._run_fleet(fleet, task_vars))
            return result
        args = _fleet.host_args(self._task.args)
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

    def _run_fleet(self, fleet: str, task_vars: dict | None) -> dict:
        """The lease as an etcd lease, taken and released here on the controller: one clear line on failure."""
        _validation, p = self.validate_argument_spec(
            ARGUMENT_SPEC, required_if=REQUIRED_IF, mutually_exclusive=MUTUALLY_EXCLUSIVE
        )
        name = p["name"]
        error = params_error(p)
        if error is None and p["directory"]:
            error = _fleet.DIRECTORY_CONFLICT
        if error:
            return dict(failed=True, msg=f"lock {name}: {error}", name=name)
        marker = run_marker()
        if p["state"] == "acquired" and not p["token"]:
            p["label"] = f"{p['label'] or task_label(self._task, task_vars)} {marker}"
        try:
            lease = _fleet.Lease(p, fleet, bool(self._task.check_mode), marker)
            out = lease.run()
        except _fleet.Refused as e:
            out = dict(e.result, skipped=True) if e.skip else dict(e.result, failed=True)
            return dict(out, name=name)
        except (HostlockError, ValueError) as e:
            return dict(failed=True, msg=f"lock {name}: {_fleet.one_line(e)}", name=name, fleet=fleet)
        if lease.warnings:
            out["warnings"] = lease.warnings
        return dict(out, name=name)
