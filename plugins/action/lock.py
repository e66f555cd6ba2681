# Copyright: (c) 2025, hostlock maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Action for hostlock.core.lock: names the play, task, controller and run in the lock's label, and keeps
`heartbeat: true` leases alive from the controller while the run lives.

A module on the host cannot see which play or task runs it; this controller-side step can, and adds
no round trip (the module is still run exactly once). With `fleet` (or $HOSTLOCK_FLEET on the controller)
the lease is an etcd lease taken here, on the controller, and the host is not contacted at all. With
`heartbeat: true` it starts, once a host lease is taken, the lease's heartbeat on the control node
(plugin_utils/_heartbeat.py), and a `state: released` with a token stops that heartbeat before releasing.
"""

from __future__ import annotations

import typing as t

from ansible.errors import AnsibleActionFail
from ansible.module_utils.parsing.convert_bool import boolean
from ansible.plugins.action import ActionBase
from ansible_collections.hostlock.core.plugins.module_utils import _messages, _turns
from ansible_collections.hostlock.core.plugins.module_utils._argspec import (
    LOCK,
    LOCK_MUTUALLY_EXCLUSIVE,
    coerced_option,
    lock_params_error,
    on_controller,
)
from ansible_collections.hostlock.core.plugins.module_utils.hostlock import HostlockError
from ansible_collections.hostlock.core.plugins.plugin_utils import _fleet, _heartbeat, _hostlease
from ansible_collections.hostlock.core.plugins.plugin_utils._controller import (
    in_with_lock,
    included_by,
    task_label,
    turns,
)
from ansible_collections.hostlock.core.plugins.plugin_utils._runid import (
    LOCAL_TRANSPORTS,
    controller_process,
    run_marker,
)

LOCK_MODULE = _hostlease.LOCK_MODULE  # the host's side, plugins/modules/lock_host.py


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _supports_check_mode = True
    _supports_async = False

    def run(self, tmp: t.Any = None, task_vars: dict | None = None) -> dict:
        result = self._run(tmp, task_vars)
        if not in_with_lock(self._task):
            return result
        # The with_lock role's own tasks: its user never sees them, only their outcome.
        if result.get("token"):
            result["_ansible_no_log"] = True  # the lease's secret: shown nowhere, kept in what the role registers
        elif result.get("failed"):
            where, origin = included_by(self._task)
            msg = str(result.get("msg") or "the lock was not taken")
            tail = "" if "nothing ran" in msg else "; nothing ran under it"
            raise AnsibleActionFail(f"{msg}{tail}{where}", obj=origin)
        return result

    def _run(self, tmp: t.Any, task_vars: dict | None) -> dict:
        result = super().run(tmp, task_vars)
        del tmp
        coerced = coerced_option(self._task.args)
        if coerced:
            return dict(result, failed=True, msg=f"hostlock.core.lock: {_messages.coerced(*coerced)}")
        fleet = _fleet.fleet_of(self._task.args)
        if fleet and self._task.args.get("path"):
            return dict(result, failed=True, msg=f"lock {self._task.args.get('path')}: path (a kernel lock on a file "
                        "of the host) and fleet (a lock in etcd) exclude each other; fleet: '' takes a host lock")
        if fleet and boolean(self._task.args.get("heartbeat"), strict=False):
            return dict(result, failed=True, msg=f"lock {self._task.args.get('name')}: heartbeat applies to host "
                        "leases; a fleet lease is kept alive by its own ttl")
        if fleet:
            result.update(self._run_fleet(fleet, task_vars))
            return result
        args = _fleet.host_args(self._task.args)
        releasing = args.get("state", "acquired") == "released"
        if not releasing and not args.get("token"):
            # the run marker lets the host refuse at once a wait on a lock this same run holds, and the host marker
            # lets it wait for another inventory host of the run on the same machine where the strategy allows it
            host = (task_vars or {}).get("inventory_hostname") or ""
            args["label"] = (f"{args.get('label') or task_label(self._task, task_vars)} {run_marker()} "
                             f"{_turns.host_marker(host)}")
            args["turns"] = turns(self._task, task_vars or {})
            if getattr(self._connection, "transport", None) in LOCAL_TRANSPORTS:
                # the host is this machine: the wait watches the run's process itself (a SIGKILLed
                # ansible-playbook leaves its worker, and so the module's stdout, alive)
                args["controller"] = controller_process()
        token = args.get("token")
        beating = _heartbeat.NONE
        if releasing and isinstance(token, str) and not self._task.check_mode:
            # stop renewing first: a renewal racing the release could only fail, but why send it
            beating = _heartbeat.stop(token)
        result.update(self._execute_module(module_name=LOCK_MODULE, module_args=args, task_vars=task_vars))
        gone = (result.get("hostlock") or {}).get("event") == "released" and not result.get("changed")
        if (beating == _heartbeat.LOST or (beating and gone)) and not result.get("failed"):
            # A heartbeat lease renews until its release stops it: found ended (its heartbeat saw it, or the release
            # found no lease), what it covered may have overlapped another holder's. Released all the same; say so.
            return dict(result, failed=True, changed=False,
                        msg=_messages.lease_lost(str(args.get("name") or args.get("path"))))
        if beating and result.get("changed") and _own_run(result.get("released") or []):
            # this run's own heartbeat lease: it would have ended with the run anyway, so the host is left as the
            # run found it (docs/ansible.md, "When a lock task reports changed")
            result["changed"] = False
        info = result.get("hostlock") or {}
        if info.get("event") == "acquired" and boolean(args.get("heartbeat"), strict=False) and result.get("token"):
            try:
                result["heartbeat"] = self._start_heartbeat(args, result, task_vars or {})
            except (OSError, ValueError) as e:  # no heartbeat: give the lease back rather than hold it unrenewed
                which = {k: args[k] for k in ("name", "path") if args.get(k)}
                self._execute_module(module_name=LOCK_MODULE, task_vars=task_vars, module_args=dict(
                    which, state="released", token=result["token"], directory=result.get("directory")))
                shown = args.get("name") or args.get("path")
                return dict(failed=True, name=shown, msg=f"lock {shown}: cannot start the lease's "
                            f"heartbeat on the control node ({e}); the lease was released")
        if result.get("hostlock", {}).get("event") == "renewed" and isinstance(args.get("token"), str):
            # The module masks values equal to its no_log parameter, so a renewal's `token` comes back as
            # VALUE_SPECIFIED_IN_NO_LOG_PARAMETER; a playbook re-registering it would lose the lease. It
            # is the token the task passed in: put it back.
            result["token"] = args["token"]
        return result

    def _run_fleet(self, fleet: str, task_vars: dict | None) -> dict:
        """The lease as an etcd lease, taken and released here on the controller: one clear line on failure."""
        _validation, p = self.validate_argument_spec(on_controller(LOCK), mutually_exclusive=LOCK_MUTUALLY_EXCLUSIVE)
        name = p["name"]
        error = lock_params_error(p)
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

    def _start_heartbeat(self, args: dict, result: dict, task_vars: dict) -> dict:
        """Renew the lease from the control node until its release or the end of this run."""
        return _hostlease.start_heartbeat(self, args, result, task_vars)


def _own_run(released: list) -> bool:
    """Whether every released holder is a lease this run took (its label carries this run's marker)."""
    marker = run_marker()
    return all(marker in str(h.get("label") or "") for h in released if isinstance(h, dict))
