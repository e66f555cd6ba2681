# Copyright: (c) 2025, hostlock maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""PRIVATE to this collection: fleet (etcd) locks taken on the controller for the hostlock.core plugins.

With `fleet`, a lock lives in etcd and is taken by the controller (the action plugin in its task worker,
or the serialize callback in ansible-playbook itself) with the controller's copy of the engine
(module_utils/hostlock), never on a managed host: hosts need no route to etcd, and nothing of the lock runs
there. Not a public API; other collections must not import it.
"""

from __future__ import annotations

import os
import time
import typing as t

from ansible_collections.hostlock.core.plugins.module_utils import _messages
from ansible_collections.hostlock.core.plugins.module_utils._common import (
    describe_holders,
    live_holders,
    would_acquire,
)
from ansible_collections.hostlock.core.plugins.module_utils._runner import own_holders
from ansible_collections.hostlock.core.plugins.module_utils._task import LockTask
from ansible_collections.hostlock.core.plugins.module_utils.hostlock import (
    HostlockError,
    Lock,
    LockTimeout,
    TokenError,
    break_lock,
    hold,
    parse_duration,
    release,
    renew,
    status,
    token_id,
)
from ansible_collections.hostlock.core.plugins.module_utils.hostlock.core.tokens import fence_of

# The controller's environment variable naming the fleet, as for the hostlock command (--fleet).
FLEET_ENV = "HOSTLOCK_FLEET"
# A task that names both: the CLI refuses --dir beside a fleet alike (never a silent fall-back either way).
DIRECTORY_CONFLICT = ("directory and fleet exclude each other: a fleet lock lives in etcd, not in a lock directory "
                      "(fleet: '' takes a host lock even when HOSTLOCK_FLEET is set)")
# The options the action plugins handle on the controller and never send to a host.
CONTROLLER_OPTIONS = ("fleet", "ttl")


def fleet_of(args: dict) -> str | None:
    """The task's fleet URL: its `fleet` option, else $HOSTLOCK_FLEET on the controller; '' means host locks."""
    value = args.get("fleet")
    if value is None:
        value = os.environ.get(FLEET_ENV)
    value = str(value or "").strip()
    return value or None


def host_args(args: dict) -> dict:
    """The task's arguments for the module on the host: the controller's own options removed."""
    return {k: v for k, v in args.items() if k not in CONTROLLER_OPTIONS}


def one_line(exc: BaseException) -> str:
    """An error as one line (a task's msg is shown on one line; etcd replies may carry newlines)."""
    return " ".join(str(exc).split()) or type(exc).__name__


def ttl_of(args: dict) -> float | None:
    """The `ttl` option in seconds (None: the engine's default); ValueError names the option."""
    if args.get("ttl") is None:
        return None
    ttl = parse_duration(args["ttl"], "ttl")
    if not ttl > 0:
        raise ValueError(f"ttl must be more than 0 seconds (got {args['ttl']})")
    return ttl


def holder_dicts(name: str, fleet: str) -> tuple[list, str]:
    """(holders as dicts, the key prefix shown to users) of a fleet lock, read from etcd."""
    st = status(name, fleet=fleet)
    return [h.as_dict() for h in st.holders], st.path


def still_held(name: str, fleet: str, fence: int | None) -> bool | None:
    """Whether our key (its fence) is still among the lock's holders in etcd; None when etcd cannot say.

    A key cannot come back once deleted (a new one gets a new creation revision), so finding it at the end
    proves the lock was held throughout, whatever the keep-alive thread saw or missed.
    """
    try:
        holders, _path = holder_dicts(name, fleet)
    except HostlockError:
        return None
    return any(h.get("fence") == fence for h in holders)


def own_blockers(holders: list, marker: str, mode: str, slots: int) -> list:
    """Leases of this same run that alone keep us out: waiting for them would outlast the run's patience.

    They end only when a later task releases them, which cannot run while this one waits (linear
    strategy), so the task fails at once instead. Holders of this run that end by themselves (a `locked`
    task of another host, labelled `[run ID task]`) are waited for: that is how a semaphore spreads one
    run's hosts over its slots.
    """
    mine = own_holders(holders, marker)
    return mine if mine and not would_acquire(mine, mode, slots) else []


class Refused(Exception):
    """The task ends without the lock (busy after the timeout, or held by this run); carries its result."""

    def __init__(self, msg: str, result: dict, skip: bool) -> None:
        super().__init__(msg)
        self.result = dict(result, msg=msg)
        self.skip = skip


def self_wait_msg(name: str, blockers: list) -> str:
    return _messages.same_run("fleet lock", name, blockers, _messages.FLEET_SHARED)


def conflict_msg(name: str, path: str, fleet: str, waited: float, holders: list) -> str:
    return _messages.still_held("fleet lock", name, waited, holders, f"hostlock status --fleet {fleet} {name}",
                                where=f" ({path})")


class Lease(LockTask):
    """hostlock.core.lock with `fleet`: an etcd lease with TTL = the lease, held by nobody (no helper process)."""

    what = "fleet lock"
    report_keys = ("token_id", "lease_expires", "fence", "held")
    renewed_msg = "renewed the lease on fleet lock {name} until {until}"
    broke_verb = "revoked"

    def __init__(self, p: dict, fleet: str, check_mode: bool, marker: str) -> None:
        super().__init__(p, p["name"], check_mode)
        self.fleet, self.marker = fleet, marker
        self.warnings: list[str] = []
        self.path = ""
        self.refresh()

    def refresh(self) -> list:
        self.holders, self.path = holder_dicts(self.name, self.fleet)
        return self.holders

    def location(self) -> dict:
        return dict(fleet=self.fleet, path=self.path)

    def report(self) -> dict:
        return dict(fleet=self.fleet)

    def token_id(self) -> str:
        try:
            return token_id(self.p["token"] or "")
        except (HostlockError, ValueError):
            return (self.p["token"] or "").rpartition(".")[0]

    def lease_fields(self, token: str) -> dict:
        return dict(fence=fence_of(token))

    def warn(self, msg: str) -> None:
        self.warnings.append(msg)

    def error_text(self, error: Exception) -> str:
        return one_line(error)

    def run(self) -> dict:
        return self.acquire() if self.p["state"] == "acquired" else self.release()

    # -- state=acquired ------------------------------------------------------------------------------
    def take(self) -> dict:
        p = self.p
        blockers = own_blockers(self.holders, self.marker, p["mode"], p["slots"])
        if blockers:
            raise Refused(self_wait_msg(self.name, blockers), self.result("self", False, ""), skip=False)
        started = time.monotonic()
        try:
            token = hold(self.name, p["lease"], fleet=self.fleet, mode=p["mode"], slots=p["slots"],
                         label=p["label"], timeout=p["timeout"])
        except LockTimeout as e:
            waited = round(time.monotonic() - started, 3)
            self.holders = [h.as_dict() for h in e.holders]
            msg = conflict_msg(self.name, self.path, self.fleet, waited, self.holders)
            raise Refused(msg, self.result("conflict", False, "", waited), skip=p["on_conflict"] == "skip") from e
        waited = round(time.monotonic() - started, 3)
        tid = token_id(token)
        self.refresh()
        expires = (self.mine(tid) or {}).get("lease_expires") or time.time() + p["lease"]
        return self.result("acquired", True, f"took fleet lock {self.name} (waited {waited}s, lease {p['lease']}s)",
                           waited, acquired=True, token=token, token_id=tid, lease_expires=expires,
                           **self.lease_fields(token))

    def engine_renew(self, token: str, lease: float | None) -> float:
        return renew(self.name, token, lease=lease, fleet=self.fleet)

    def renew_refused(self, error: TokenError) -> HostlockError:
        return HostlockError(f"cannot renew: {one_line(error)}. The lock is not ours any more: take it again "
                             f"(holders now: {describe_holders(live_holders(self.holders))})")

    # -- state=released ------------------------------------------------------------------------------
    def engine_release(self, token: str) -> None:
        release(self.name, token, fleet=self.fleet)
        # etcd deleted the key before release() returned: released() reads the holders once, and the next
        # task finds the lock free

    def engine_break(self) -> list:
        return [h.as_dict() for h in break_lock(self.name, fleet=self.fleet, force=True)]


def fleet_lock(name: str, fleet: str, p: dict, label: str, on_lost: t.Callable[[], None]) -> Lock:
    """A fleet Lock for `locked` and the serialize callback (ValueError/HostlockError on bad options)."""
    options: dict[str, t.Any] = dict(mode=p.get("mode") or "exclusive", slots=p.get("slots") or 1, fleet=fleet,
                                     label=label, on_lost=on_lost)
    ttl = ttl_of(p)
    if ttl is not None:
        options["ttl"] = ttl
    return Lock(name, **options)
