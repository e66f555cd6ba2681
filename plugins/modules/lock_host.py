#!/usr/bin/python
# Copyright: (c) 2025, hostlock maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# The host side of hostlock.core.lock, which its action (plugins/action/lock.py) runs; users write
# hostlock.core.lock, documented in plugins/modules/lock.py.

from __future__ import annotations

DOCUMENTATION = r"""
---
module: lock_host
short_description: "Internal: the managed host's side of hostlock.core.lock; use hostlock.core.lock"
version_added: 0.4.0
description:
  - The module the M(hostlock.core.lock) action runs on the managed host. Write M(hostlock.core.lock) in tasks;
    its action sets the options below that the user does not, and takes fleet locks on the controller.
options:
  state:
    description: V(acquired) takes (or, with O(token), renews) a lease; V(released) gives it up.
    type: str
    choices: [acquired, released]
    default: acquired
  lease:
    description: The lease's length, seconds or a duration.
    type: raw
  heartbeat:
    description: The controller renews the lease while the run lives (its default O(lease) is then 60).
    type: bool
    default: false
  token:
    description: The lease's token, to renew or release it.
    type: str
  force:
    description: With O(state=released) and no O(token), break the lock.
    type: bool
    default: false
  controller:
    description: The C(ansible-playbook) process (C(PID:START)), watched while the task waits (local connection).
    type: str
  turns:
    description: The run's other inventory hosts that share this machine, and whether the task may wait for them.
    type: dict
extends_documentation_fragment:
  - hostlock.core.lock
  - hostlock.core.lock.taking
  - hostlock.core.lock.where
  - ansible.builtin.action_common_attributes
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
  platform:
    platforms: posix
author:
  - hostlock maintainers (@hostlock)
"""

EXAMPLES = r"""
# Internal: write hostlock.core.lock instead (ansible-doc hostlock.core.lock).
"""

RETURN = r"""
# As hostlock.core.lock (ansible-doc hostlock.core.lock).
"""

import os
import time
import typing as t

from ansible.module_utils.basic import AnsibleModule

# First: the engine below is then compiled once, not twice, from the AnsiballZ zip (see _zipimport).
from ansible_collections.hostlock.core.plugins.module_utils import _zipimport  # noqa: F401  # pylint: disable=unused-import
from ansible_collections.hostlock.core.plugins.module_utils._argspec import (
    HOST_LOCK,
    LOCK_MUTUALLY_EXCLUSIVE,
    REQUIRED_ONE_OF,
    lock_params_error,
)
from ansible_collections.hostlock.core.plugins.module_utils._common import (
    describe_holders,
    engine_message,
    lease_marker,
    live_holders,
    path_holder_dicts,
    would_acquire,
)
from ansible_collections.hostlock.core.plugins.module_utils._messages import (
    AGAIN_ON_THIS_HOST,
    DELEGATED,
    EARLIER_LEASE,
    one_machine,
    same_run,
    still_held,
)
from ansible_collections.hostlock.core.plugins.module_utils._runner import (
    SELF_CHECK_EVERY,
    ControllerGone,
    controller_gone,
    detach,
    own_holders,
)
from ansible_collections.hostlock.core.plugins.module_utils._task import LockTask
from ansible_collections.hostlock.core.plugins.module_utils._turns import judge
from ansible_collections.hostlock.core.plugins.module_utils.hostlock import (
    HostlockError,
    LockTimeout,
    TokenError,
    break_lock,
    hold,
    release,
    renew,
    status,
)
from ansible_collections.hostlock.core.plugins.module_utils.hostlock.lease import (
    EXPIRE_NOW,
    in_flight_environment,
    in_flight_pids,
)
from ansible_collections.hostlock.core.plugins.module_utils.hostlock.lease import hold as hold_path
from ansible_collections.hostlock.core.plugins.module_utils.hostlock.lease import release as release_path
from ansible_collections.hostlock.core.plugins.module_utils.hostlock.lease import renew as renew_path


class Turn(Exception):
    """A lease of this same run keeps us out and waiting for it would never end: the task fails (or skips) at once."""

    def __init__(self, msg: str, holders: list) -> None:
        super().__init__(msg)
        self.holders = holders


# A bound, not a delay: the holder unlocks first and then answers (hostlock.lease), so when release() returns the
# lock is free and settle() normally returns at once; this bounds it should status still show our holder.
RELEASE_SETTLE = 2.0


class Conflict(Exception):
    """The lock stayed busy until the timeout; carries the result to report."""

    def __init__(self, msg: str, result: dict) -> None:
        super().__init__(msg)
        self.result = result


class Task(LockTask):
    """One run of the module: a host lock (named, or flock(1)'s on a file) taken through a lease holder."""

    def __init__(self, module: AnsibleModule) -> None:
        p = module.params
        super().__init__(p, p["name"] if p["name"] is not None else p["path"], module.check_mode)
        self.module = module
        self.path: str | None = p["path"]
        self.directory: str | None = p["directory"]
        self.resolved: str | None = ""
        self.refresh()

    def refresh(self) -> list:
        if self.path:  # flock(1)'s lock on a file: holders from /proc, no directory
            self.holders, self.resolved = path_holder_dicts(self.path), None
            return self.holders
        st = status(self.name, directory=self.directory)
        self.holders, self.resolved = [h.as_dict() for h in st.holders], st.directory
        return self.holders

    def location(self) -> dict:
        return dict(directory=self.resolved, path=self.path) if self.path else dict(directory=self.resolved)

    def status_hint(self) -> str:
        return f"hostlock status --path {self.path}" if self.path else f"hostlock status {self.name}"

    def lease_fields(self, token: str) -> dict:
        return dict(environment=in_flight_environment(token))

    def warn(self, msg: str) -> None:
        self.module.warn(msg)

    def refuse(self, msg: str) -> t.NoReturn:
        self.module.fail_json(msg=msg, holders=self.holders, directory=self.resolved)
        raise AssertionError("unreachable: fail_json exits")  # for the type checker (ansible-core is untyped here)

    def force_hint(self) -> str:
        return "" if self.path else super().force_hint()

    # -- state=acquired ------------------------------------------------------------------------------
    def take(self) -> dict:
        p = self.p
        started = time.monotonic()
        try:
            token = self.hold(started)
        except Turn as e:
            self.holders = e.holders
            msg = str(e)
            raise Conflict(msg, self.result("self", False, msg, round(time.monotonic() - started, 3))) from None
        except LockTimeout as e:
            waited = round(time.monotonic() - started, 3)
            self.holders = path_holder_dicts(self.path) if self.path else [h.as_dict() for h in e.holders]
            msg = still_held(self.what, self.name, waited, self.holders, self.status_hint(),
                             where="" if self.path else f" in {self.resolved}")
            raise Conflict(msg, self.result("conflict", False, msg, waited)) from e
        waited = round(time.monotonic() - started, 3)
        token_id = token.partition(".")[0]
        self.refresh()
        mine = self.mine(token_id) or {}
        expires = mine.get("lease_expires") or time.time() + p["lease"]
        # A heartbeat lease ends with this run at the latest: taking it changes nothing the run leaves behind.
        return self.result("acquired", self.lasting(), f"took lock {self.name} (waited {waited}s, lease {p['lease']}s)",
                           waited, acquired=True, token=token, token_id=token_id, lease_expires=expires,
                           lease=p["lease"], **self.lease_fields(token))

    def turn(self, mine: list) -> None:
        """Leases of this same run in our way: wait for them (another host of this machine that runs on to its
        release, where the strategy lets it), or raise Turn saying what works instead."""
        verdict = judge(mine, self.p.get("turns"))
        if verdict.wait:
            return
        if verdict.kind == "strategy":
            turns = self.p["turns"]
            waiter = (turns.get("batch") or {}).get(turns.get("host"), turns.get("host") or "this host")
            raise Turn(one_machine(self.name, verdict.holder, waiter, turns.get("why") or "",
                                   list(turns.get("works") or [])), mine)
        if verdict.kind == "earlier":
            advice = EARLIER_LEASE.format(holder=verdict.holder)
        else:
            advice = AGAIN_ON_THIS_HOST
        delegated = (self.p.get("turns") or {}).get("delegated")
        if delegated and verdict.kind != "again":
            advice = f"{advice}; {DELEGATED}"
        raise Turn(same_run(self.what, self.name, mine, advice), mine)

    def hold(self, started: float) -> str:
        """hold() in slices: between them, judge holders of our own run (turn), stop if the controller left."""
        p = self.p
        marker = lease_marker(p["label"])  # a locked task's lease ("[run ID task]") never waits for ours
        deadline = None if p["timeout"] is None else started + p["timeout"]
        while True:
            if marker:
                mine = own_holders(self.refresh(), marker, os.geteuid())
                if mine and not would_acquire(mine, p["mode"], p["slots"]):
                    self.turn(mine)
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            step = SELF_CHECK_EVERY if left is None else min(left, SELF_CHECK_EVERY)
            try:
                # in_flight: a lease that runs out waits for the processes carrying its environment mark
                if self.path:  # the engine's lease on flock(1)'s lock on a file (hostlock.lease.hold(path=))
                    token = hold_path(self.name, lease=p["lease"], mode=p["mode"], timeout=step, in_flight=True,
                                      path=self.path)
                else:
                    token = hold(self.name, lease=p["lease"], mode=p["mode"], slots=p["slots"],
                                 directory=self.directory, timeout=step, label=p["label"], in_flight=True)
            except LockTimeout:
                if deadline is not None and time.monotonic() >= deadline:
                    raise
            else:
                if controller_gone(controller=p["controller"]):
                    # Nobody will ever read the token, so nobody could release the lease: give it back now
                    # rather than keep the lock for a whole lease (a controller Ctrl-C'd during our last slice).
                    self.give_back(token)
                    raise ControllerGone()
                return token
            if controller_gone(controller=p["controller"]):
                raise ControllerGone()

    def give_back(self, token: str) -> None:
        try:
            if self.path:
                release_path(self.name, token, path=self.path)
            else:
                release(self.name, token, directory=self.directory)
        except HostlockError:  # gone already: nothing is held
            pass

    def engine_renew(self, token: str, lease: float | None) -> float:
        if self.path:
            return renew_path(self.name, token, lease=lease, path=self.path)
        return renew(self.name, token, lease=lease, directory=self.directory)

    def renew_refused(self, error: TokenError) -> HostlockError:
        live = live_holders(self.holders)
        now = describe_holders(live) if live else "nobody"  # never "released meanwhile": maybe never held
        if getattr(error, "reason", "") in ("malformed", "refused"):
            return HostlockError(f"cannot renew: {error}. The token is not a lease on this lock (a wrong token: "
                                 f"another lock's, or from another run); holders now: {now}")
        return HostlockError(f"cannot renew: {error}. The lock is not ours any more: take it again "
                             f"(holders now: {now})")

    # -- state=released ------------------------------------------------------------------------------
    def engine_release(self, token: str) -> None:
        if self.path:
            release_path(self.name, token, path=self.path)
        else:
            release(self.name, token, directory=self.directory)

    def in_flight_work(self, token: str) -> list:
        try:
            return in_flight_pids(token)
        except (HostlockError, ValueError):  # not a token of ours: the release says so
            return []

    def engine_expire(self, token: str) -> None:
        self.engine_renew(token, EXPIRE_NOW)

    def released(self, token_id: str) -> None:
        """Return once our lease holder is gone, so the next task finds the lock free."""
        deadline = time.monotonic() + RELEASE_SETTLE
        while self.mine(token_id) and time.monotonic() < deadline:
            time.sleep(0.005)
            self.refresh()

    def break_lock(self) -> dict:
        if self.path and self.p["force"]:
            # the kernel lock of a file: no record proves what its holders are, so nobody is ended
            live = live_holders(self.holders)
            if not live:
                return self.result("released", False, f"lock {self.name} is not held", released=[])
            self.module.fail_json(msg=f"lock {self.name}: force=true breaks named locks only; the kernel lock on "
                                  f"this file is held by {describe_holders(live)} (see: {self.status_hint()})",
                                  holders=self.holders, path=self.path)
        return super().break_lock()

    def engine_break(self) -> list:
        return [h.as_dict() for h in break_lock(self.name, directory=self.directory, force=True)]


def check_params(module: AnsibleModule) -> None:
    if module.params.get("fleet"):
        module.fail_json(msg="fleet locks are taken by the controller (the hostlock.core.lock action), never on the "
                         "host: run this module from a task, not on its own")
    error = lock_params_error(module.params)
    if error:
        module.fail_json(msg=error)


def main() -> None:
    module = AnsibleModule(
        argument_spec=HOST_LOCK,
        mutually_exclusive=LOCK_MUTUALLY_EXCLUSIVE,
        required_one_of=REQUIRED_ONE_OF,
        supports_check_mode=True,
    )
    check_params(module)
    name = module.params["name"] or module.params["path"]
    # Out of reach of the controller's signals and of the `ssh -tt` terminal's hangup (see _runner.detach):
    # a wait cut short by SIGHUP would leave the engine's holder to take the lease for nobody.
    detach()
    try:
        task = Task(module)
        result = task.acquire() if module.params["state"] == "acquired" else task.release()
    except ControllerGone:  # nobody reads a result any more: no lease was taken
        module.fail_json(msg=f"lock {name}: the controller is gone (its connection closed) while we waited")
    except Conflict as e:
        if module.params["on_conflict"] == "skip":
            module.exit_json(skipped=True, name=name, **e.result)
        module.fail_json(name=name, **e.result)
    except (HostlockError, ValueError) as e:
        module.fail_json(msg=f"lock {name}: {engine_message(e)}", name=name, directory=getattr(e, "directory", None))
    module.exit_json(name=name, **result)


if __name__ == "__main__":
    main()
