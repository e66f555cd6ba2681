#!/usr/bin/python
# Copyright: (c) 2025, hostlock maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# The host side of hostlock.core.locked, which its action (plugins/action/locked.py) runs with the wrapped module's
# payload; users write hostlock.core.locked, documented in plugins/modules/locked.py.

from __future__ import annotations

DOCUMENTATION = r"""
---
module: locked_host
short_description: "Internal: the managed host's side of hostlock.core.locked; use hostlock.core.locked"
version_added: 0.4.0
description:
  - The module the M(hostlock.core.locked) action runs on the managed host, with the wrapped module built on the
    controller. Write M(hostlock.core.locked) in tasks; its action sets the options below.
options:
  task:
    description: The wrapped module (O(task.module)); its arguments travel in O(payload).
    type: dict
    required: true
    suboptions:
      module:
        description: The wrapped module's name.
        type: str
      args:
        description: Unused on the host.
        type: raw
  lease:
    description: With O(heartbeat), the lease's length.
    type: raw
  ttl:
    description: Unused on the host (fleet locks are the controller's).
    type: raw
  payload:
    description: The wrapped module as built for the host, base64-encoded.
    type: str
  controller:
    description: The C(ansible-playbook) process (C(PID:START)), watched while the task waits (local connection).
    type: str
  heartbeat:
    description: Take a heartbeat lease and keep it after the wrapped module (the first step of a task with its own
      action plugin) instead of a lock that ends with it.
    type: bool
    default: false
  compiled:
    description: The engine as this host's interpreter compiled it earlier in this run (base64); V("") asks for it.
    type: str
extends_documentation_fragment:
  - hostlock.core.lock
  - hostlock.core.lock.taking
  - hostlock.core.lock.where
  - ansible.builtin.action_common_attributes
attributes:
  check_mode:
    support: full
  diff_mode:
    support: full
  platform:
    platforms: posix
author:
  - hostlock maintainers (@hostlock)
"""

EXAMPLES = r"""
# Internal: write hostlock.core.locked instead (ansible-doc hostlock.core.locked).
"""

RETURN = r"""
# As hostlock.core.locked (ansible-doc hostlock.core.locked).
"""
import base64

from ansible.module_utils.basic import AnsibleModule

# First: the engine is then compiled once, not twice, from the AnsiballZ zip; or not at all, from code this
# host's interpreter compiled in an earlier run (the `compiled` option): see _zipimport. The engine is
# imported in main(), once the options are read.
from ansible_collections.hostlock.core.plugins.module_utils import _zipimport
from ansible_collections.hostlock.core.plugins.module_utils._argspec import (
    HOST_LOCKED,
    MUTUALLY_EXCLUSIVE,
    REQUIRED_ONE_OF,
)

# The payload zip AnsiballZ runs this module from (ansible-core 2.19+ gives the module this global): see
# _runner.end_now.
MODLIB = globals().get("_modlib_path")


def main() -> None:
    module = AnsibleModule(argument_spec=HOST_LOCKED, supports_check_mode=True,
                           mutually_exclusive=MUTUALLY_EXCLUSIVE, required_one_of=REQUIRED_ONE_OF)
    if module.params["compiled"]:
        try:
            _zipimport.preload(base64.b64decode(module.params["compiled"]))
        except ValueError:  # not base64: compile from the zip, as without it
            pass
    run(module)


def with_compiled(module: AnsibleModule, info: dict) -> dict:
    """`info`, with this run's compiled engine when the controller asked for it and this run compiled any."""
    if module.params["compiled"] is not None and _zipimport.compiled_here():
        info["compiled"] = base64.b64encode(_zipimport.exported()).decode("ascii")
    return info


def run(module: AnsibleModule) -> None:
    """Take the lock, run the wrapped module under it, and answer with its result and ours."""
    from ansible_collections.hostlock.core.plugins.module_utils import _messages
    from ansible_collections.hostlock.core.plugins.module_utils._common import (
        HEARTBEAT_LEASE,
        RESULT_KEY,
        engine_message,
        lease_marker,
        path_holder_dicts,
        path_params_error,
        would_acquire,
    )
    from ansible_collections.hostlock.core.plugins.module_utils._runner import (
        ControllerGone,
        LeaseTake,
        SelfWait,
        detach,
        emit_result,
        run_leased,
        run_locked,
        run_payload,
    )
    from ansible_collections.hostlock.core.plugins.module_utils.hostlock import (
        HostlockError,
        Lock,
        LockTimeout,
        parse_duration,
        status,
    )
    from ansible_collections.hostlock.core.plugins.module_utils.hostlock.host.pathlock import PathLock

    def holder_dicts(name: str, directory: str | None, path: str | None = None) -> list:
        if path:
            return path_holder_dicts(path)
        return [h.as_dict() for h in status(name, directory=directory).holders]

    p = module.params
    name = p["name"] if p["name"] is not None else p["path"]  # "" is a name, and an empty one
    path_error = path_params_error(p)
    if path_error:
        module.fail_json(msg=f"lock {name}: {path_error}")
    wrapped = (p["task"] or {}).get("module") or "?"
    if p["fleet"]:
        module.fail_json(msg="fleet locks are taken by the controller (the hostlock.core.locked action), never on "
                         "the host: run this module from a task, not on its own")
    if not p["payload"]:
        module.fail_json(msg="hostlock.core.locked runs through its action plugin, which builds the wrapped "
                         "module: run it from a playbook task (payload missing)")
    try:
        timeout = None if p["timeout"] is None else parse_duration(p["timeout"], "timeout")
        lease = HEARTBEAT_LEASE if p["lease"] is None else parse_duration(p["lease"], "lease")
        payload = base64.b64decode(p["payload"])
        if p["heartbeat"] and not module.check_mode:
            lock: Lock | PathLock | LeaseTake = LeaseTake(
                name, lease, mode=p["mode"], slots=p["slots"], directory=p["directory"], label=p["label"],
                path=p["path"],
            )
        elif p["path"]:
            lock = PathLock(p["path"], mode=p["mode"])
        else:
            lock = Lock(name, mode=p["mode"], slots=p["slots"], directory=p["directory"], label=p["label"])
    except (HostlockError, ValueError, TypeError) as e:
        module.fail_json(msg=f"lock {name}: {engine_message(e)}")
    marker = lease_marker(p["label"])  # the run's leases, never its tasks: those end by themselves
    info = dict(name=name, module=wrapped, directory=lock.directory, taken=False, waited=0.0)
    if p["path"]:
        info.update(path=p["path"], directory=None)
    # Out of reach of the controller's signals and of the `ssh -tt` terminal's hangup (see _runner.detach).
    detach()

    if module.check_mode:
        holders = holder_dicts(name, p["directory"], p["path"])
        info.update(event="check", free=would_acquire(holders, p["mode"], p["slots"]), holders=holders)
        result, _pid = run_payload(payload)
        result[RESULT_KEY] = with_compiled(module, info)
        emit_result(result, MODLIB)

    def holders_of() -> list:
        return holder_dicts(name, p["directory"])

    try:
        # A path lock has no record to carry a run marker: nothing to tell our own run's holders apart by.
        if isinstance(lock, LeaseTake):
            result = run_leased(lock, payload, timeout, holders_of=None if p["path"] else holders_of,
                                marker=None if p["path"] else marker, controller=p["controller"])
        else:
            result = run_locked(lock, payload, timeout, holders_of=None if p["path"] else holders_of,
                                marker=None if p["path"] else marker, module=wrapped, controller=p["controller"])
    except ControllerGone:  # nobody reads a result any more: the wrapped module never ran
        module.fail_json(msg=f"lock {name}: the controller is gone (its connection closed) while we waited; "
                         f"{wrapped} did not run", **{RESULT_KEY: info})
    except SelfWait as e:
        info.update(event="self", holders=e.holders)
        msg = _messages.did_not_run(_messages.same_run("lock", name, e.holders, _messages.LOCKED_INSIDE_LEASE), wrapped)
        if p["on_conflict"] == "skip":
            module.exit_json(skipped=True, changed=False, msg=msg, **{RESULT_KEY: info})
        module.fail_json(msg=msg, **{RESULT_KEY: info})
    except LockTimeout as e:
        holders = path_holder_dicts(p["path"]) if p["path"] else [h.as_dict() for h in e.holders]
        info.update(event="conflict", holders=holders, waited=timeout)
        where, see = ("", f"--path {name}") if p["path"] else (f" in {lock.directory}", name)
        msg = _messages.did_not_run(_messages.still_held("lock", name, timeout, holders, f"hostlock status {see}",
                                                         where=where), wrapped)
        if p["on_conflict"] == "skip":
            module.exit_json(skipped=True, changed=False, msg=msg, **{RESULT_KEY: info})
        module.fail_json(msg=msg, **{RESULT_KEY: info})
    except HostlockError as e:
        module.fail_json(msg=f"lock {name}: {engine_message(e)}", **{RESULT_KEY: info})
    info.update(result.pop(RESULT_KEY, {}), event="locked", taken=True)
    result[RESULT_KEY] = with_compiled(module, info)
    emit_result(result, MODLIB)


if __name__ == "__main__":
    main()
