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

from ansible_collections.hostlock.core.plugins.module_utils._common import (
    RESULT_KEY,
    describe_holders,
    live_holders,
    would_acquire,
)
from ansible_collections.hostlock.core.plugins.module_utils._runner import own_holders
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
    return (f"fleet lock {name} is held by this same playbook run ({describe_holders(blockers)}): a run never "
            "waits for itself. For a lock shared by the play's hosts take it once (run_once: true), or per host "
            "with different names, or use slots")


def conflict_msg(name: str, path: str, fleet: str, waited: float, holders: list) -> str:
    return (f"fleet lock {name} ({path}) is still held after {waited}s by {describe_holders(live_holders(holders))} "
            f"(see: hostlock status --fleet {fleet} {name})")


class Lease:
    """hostlock.core.lock with `fleet`: an etcd lease with TTL = the lease, held by nobody (no helper process)."""

    def __init__(self, p: dict, fleet: str, check_mode: bool, marker: str) -> None:
        self.p, self.fleet, self.check_mode, self.marker = p, fleet, check_mode, marker
        self.name: str = p["name"]
        self.warnings: list[str] = []
        self.holders, self.path = holder_dicts(self.name, fleet)

    def refresh(self) -> list:
        self.holders, self.path = holder_dicts(self.name, self.fleet)
        return self.holders

    def token_id(self) -> str:
        try:
            return token_id(self.p["token"] or "")
        except (HostlockError, ValueError):
            return (self.p["token"] or "").rpartition(".")[0]

    def mine(self, tid: str | None) -> dict | None:
        return next((h for h in live_holders(self.holders) if tid and h.get("token_id") == tid), None)

    def result(self, event: str, changed: bool, msg: str, waited: float = 0.0, **extra: t.Any) -> dict:
        report = dict(name=self.name, event=event, waited=waited, fleet=self.fleet)
        report.update((k, extra[k]) for k in ("token_id", "lease_expires", "fence") if extra.get(k) is not None)
        out = dict(changed=changed, msg=msg, waited=waited, holders=self.holders, fleet=self.fleet, path=self.path)
        out.setdefault("acquired", False)
        out.update(extra)
        out[RESULT_KEY] = report
        return out

    def run(self) -> dict:
        return self.acquire() if self.p["state"] == "acquired" else self.release()

    # -- state=acquired ------------------------------------------------------------------------------
    def acquire(self) -> dict:
        p = self.p
        if p["token"]:
            return self.renew()
        if self.check_mode:
            if would_acquire(self.holders, p["mode"], p["slots"]):
                return self.result("check", True, f"fleet lock {self.name} is free: a real run takes it", free=True)
            wait = f"up to {p['timeout']}s" if p["timeout"] is not None else "until it is released"
            busy = describe_holders(live_holders(self.holders))
            return self.result("check", False, f"fleet lock {self.name} is held by {busy}: a real run would wait "
                               f"{wait}", free=False)
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
                           fence=fence_of(token))

    def renew(self) -> dict:
        tid = self.token_id()
        if self.check_mode:
            held = self.mine(tid) is not None
            return self.result("check", held, f"would renew the lease on {self.name}" if held else
                               f"the token holds no lease on {self.name}: a real run fails", token_id=tid)
        try:
            expires = renew(self.name, self.p["token"], lease=self.p["lease"], fleet=self.fleet)
        except TokenError as e:
            raise HostlockError(f"cannot renew: {one_line(e)}. The lock is not ours any more: take it again "
                                f"(holders now: {describe_holders(live_holders(self.holders))})") from e
        self.refresh()
        until = time.strftime("%H:%M:%S", time.localtime(expires))
        return self.result("renewed", True, f"renewed the lease on fleet lock {self.name} until {until}",
                           acquired=True, token=self.p["token"], token_id=tid, lease_expires=expires,
                           fence=fence_of(self.p["token"]))

    # -- state=released ------------------------------------------------------------------------------
    def release(self) -> dict:
        if not self.p["token"]:
            return self.break_lock()
        tid = self.token_id()
        mine = self.mine(tid)
        if self.check_mode:
            msg = f"would release the lease {tid} on {self.name}" if mine else "the token holds no lease"
            return self.result("check", mine is not None, msg, released=[mine] if mine else [], token_id=tid)
        try:
            release(self.name, self.p["token"], fleet=self.fleet)
        except TokenError as e:
            if getattr(e, "reason", "") in ("malformed", "refused"):
                raise  # a wrong token for a live lease: the lock is NOT released, the task must say so
            self.warnings.append(f"fleet lock {self.name}: the token holds no lease: it was released already or its "
                                 f"lease ran out ({one_line(e)}). Holders now: "
                                 f"{describe_holders(live_holders(self.holders))}")
            return self.result("released", False, f"the lease on {self.name} was not held any more",
                               released=[], token_id=tid)
        self.refresh()  # etcd deleted the key before release() returned: the next task finds the lock free
        return self.result("released", True, f"released fleet lock {self.name}", released=[mine] if mine else [],
                           token_id=tid)

    def break_lock(self) -> dict:
        live = live_holders(self.holders)
        if not self.p["force"]:
            if not live:
                return self.result("released", False, f"fleet lock {self.name} is not held", released=[])
            raise HostlockError(f"fleet lock {self.name} is held by {describe_holders(live)}; pass the token "
                                "returned when it was acquired, or force=true to break the lock")
        if self.check_mode:
            return self.result("check", bool(live), f"would break fleet lock {self.name} held by "
                               f"{describe_holders(live)}", released=live)
        removed = [h.as_dict() for h in break_lock(self.name, fleet=self.fleet, force=True)]
        self.refresh()
        msg = (f"broke fleet lock {self.name}: revoked {describe_holders(removed)}" if removed
               else f"{self.name} is not held")
        return self.result("broken", bool(removed), msg, released=removed)


def fleet_lock(name: str, fleet: str, p: dict, label: str, on_lost: t.Callable[[], None]) -> Lock:
    """A fleet Lock for `locked` and the serialize callback (ValueError/HostlockError on bad options)."""
    options: dict[str, t.Any] = dict(mode=p.get("mode") or "exclusive", slots=p.get("slots") or 1, fleet=fleet,
                                     label=label, on_lost=on_lost)
    ttl = ttl_of(p)
    if ttl is not None:
        options["ttl"] = ttl
    return Lock(name, **options)
