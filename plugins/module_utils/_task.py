# Copyright: (c) 2025, hostlock maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""PRIVATE to this collection: the hostlock.core.lock task, written once for its two homes.

A host lock's task runs in the module on the managed host (plugins/modules/lock.py, Task); a fleet lock's on
the controller (plugins/plugin_utils/_fleet.py, Lease). Both take, renew, release and break a lease the same
way, with the same results, check-mode predictions and messages: this base holds those steps, and a subclass
says only what differs (where the lock lives, how it is taken, which engine calls it makes). It imports no
lock mechanism, so a host payload carries no fleet code. Not a public API; other collections must not import it.
"""

from __future__ import annotations

import time
import typing as t

from ._common import RESULT_KEY, describe_holders, live_holders, would_acquire
from .hostlock.core.errors import HostlockError, TokenError


def held_for(holder: dict | None) -> dict:
    """{"held": seconds} a released lease was held, from when it was taken (its wait left out) to now; {} when its
    record does not say when it was taken. Both ends are read by one clock: the host's for a host lease."""
    taken = (holder or {}).get("acquired_at")
    if not isinstance(taken, (int, float)) or isinstance(taken, bool):
        return {}
    return dict(held=round(max(0.0, time.time() - taken), 3))


class LockTask:
    """One lock task: its parameters, the lock's holders, and the result it builds."""

    # How messages name the lock ("lock deploy", "fleet lock deploy").
    what = "lock"
    # The result's hostlock.* keys (for the serialize callback's recap) besides name, event and waited.
    report_keys: tuple = ("token_id", "lease_expires", "held")
    # A renewal's message, and the word for what breaking a lock did to its holders.
    renewed_msg = "renewed the lease on {name} until {until}"
    broke_verb = "ended"

    def __init__(self, p: dict, name: str, check_mode: bool) -> None:
        self.p = p
        self.name = name
        self.check_mode = check_mode
        self.holders: list = []

    # -- what a subclass provides --------------------------------------------------------------------
    def refresh(self) -> list:
        """Read the lock's holders again (as dicts), keep and return them."""
        raise NotImplementedError

    def location(self) -> dict:
        """The result's fields saying where the lock lives (directory, path, fleet)."""
        raise NotImplementedError

    def report(self) -> dict:
        """Extra hostlock.* fields for the recap."""
        return {}

    def take(self) -> dict:
        """Take a new lease (not in check mode): the result, or an exception naming why not."""
        raise NotImplementedError

    def lease_fields(self, token: str) -> dict:
        """What a result carries about a lease taken or renewed, besides its token, id and expiry."""
        return {}

    def engine_renew(self, token: str, lease: float | None) -> float:
        raise NotImplementedError

    def renew_refused(self, error: TokenError) -> HostlockError:
        """The task's error when the engine refuses to renew the token."""
        raise NotImplementedError

    def engine_release(self, token: str) -> None:
        raise NotImplementedError

    def in_flight_work(self, token: str) -> list:
        """Pids of work under the lease still running where it is held (host leases); [] where none can be."""
        return []

    def engine_expire(self, token: str) -> None:
        """End the lease now, its holder freeing the lock once its in-flight work has ended."""
        raise NotImplementedError

    def released(self, token_id: str) -> None:
        """After a release: return once the next task finds the lock free."""
        self.refresh()

    def engine_break(self) -> list:
        """Break the lock (force): the holders removed, as dicts."""
        raise NotImplementedError

    def warn(self, msg: str) -> None:
        raise NotImplementedError

    def refuse(self, msg: str) -> t.NoReturn:
        """Fail the task: the lock is held and the task may not break it."""
        raise HostlockError(msg)

    def error_text(self, error: Exception) -> str:
        """An engine error inside a message of ours."""
        return str(error)

    def force_hint(self) -> str:
        return ", or force=true to break the lock"

    # -- the steps both share ------------------------------------------------------------------------
    def lasting(self) -> bool:
        """Whether a lease taken now may outlive this run (and so changes the host): every lease but a heartbeat
        lease, which ends with the run at the latest. docs/ansible.md, "When a lock task reports changed"."""
        return not self.p.get("heartbeat")

    def token_id(self) -> str:
        # A host token is "<token_id>.<secret>": the id is public, shown in holder records.
        return (self.p["token"] or "").partition(".")[0]

    def mine(self, token_id: str | None) -> dict | None:
        return next((h for h in live_holders(self.holders) if token_id and h.get("token_id") == token_id), None)

    def result(self, event: str, changed: bool, msg: str, waited: float = 0.0, **extra: t.Any) -> dict:
        report: dict = dict(name=self.name, event=event, waited=waited, **self.report())
        report.update((k, extra[k]) for k in self.report_keys if extra.get(k) is not None)
        out = dict(changed=changed, msg=msg, waited=waited, holders=self.holders, **self.location())
        out.setdefault("acquired", False)
        out.update(extra)
        out[RESULT_KEY] = report
        return out

    # -- state=acquired ------------------------------------------------------------------------------
    def acquire(self) -> dict:
        p = self.p
        if p["token"]:
            return self.renew()
        if self.check_mode:
            if would_acquire(self.holders, p["mode"], p["slots"]):
                return self.result("check", self.lasting(), f"{self.what} {self.name} is free: a real run takes it",
                                   free=True)
            wait = f"up to {p['timeout']}s" if p["timeout"] is not None else "until it is released"
            busy = describe_holders(live_holders(self.holders))
            return self.result("check", False, f"{self.what} {self.name} is held by {busy}: a real run would wait "
                               f"{wait}", free=False)
        return self.take()

    def renew(self) -> dict:
        token_id = self.token_id()
        if self.check_mode:
            held = self.mine(token_id) is not None
            return self.result("check", held, f"would renew the lease on {self.name}" if held else
                               f"the token holds no lease on {self.name}: a real run fails", token_id=token_id)
        token = self.p["token"]
        try:
            expires = self.engine_renew(token, self.p["lease"])
        except TokenError as e:
            raise self.renew_refused(e) from e
        self.refresh()
        until = time.strftime("%H:%M:%S", time.localtime(expires))
        return self.result("renewed", True, self.renewed_msg.format(name=self.name, until=until), acquired=True,
                           token=token, token_id=token_id, lease_expires=expires, **self.lease_fields(token))

    # -- state=released ------------------------------------------------------------------------------
    def release(self) -> dict:
        if not self.p["token"]:
            return self.break_lock()
        token_id = self.token_id()
        mine = self.mine(token_id)
        if self.check_mode:
            msg = f"would release the lease {token_id} on {self.name}" if mine else "the token holds no lease"
            return self.result("check", mine is not None, msg, released=[mine] if mine else [], token_id=token_id)
        # Work of the lease still running (a task of its block that Ansible's `timeout:` ended, left going):
        # the lease ends now but its holder frees the lock only after that work, as when a run dies.
        leftover = self.in_flight_work(self.p["token"])
        try:
            if leftover:
                self.engine_expire(self.p["token"])
            else:
                self.engine_release(self.p["token"])
        except TokenError as e:
            if getattr(e, "reason", "") in ("malformed", "refused"):
                raise  # a wrong secret for a live lease: the lock is NOT released, the task must say so
            self.warn(f"{self.what} {self.name}: the token holds no lease: it was released already or its lease "
                      f"ran out ({self.error_text(e)}). Holders now: {describe_holders(live_holders(self.holders))}")
            return self.result("released", False, f"the lease on {self.name} was not held any more",
                               released=[], token_id=token_id)
        if leftover:
            shown = ", ".join(str(pid) for pid in leftover[:10]) + (" ..." if len(leftover) > 10 else "")
            msg = (f"released {self.what} {self.name} after its work: process(es) {shown} carrying its lease's "
                   "environment still run here, and the lock is held until they end")
            self.warn(msg)
            return self.result("released", True, msg, released=[mine] if mine else [], token_id=token_id,
                               in_flight=leftover, **held_for(mine))
        self.released(token_id)
        return self.result("released", True, f"released {self.what} {self.name}", released=[mine] if mine else [],
                           token_id=token_id, **held_for(mine))

    def break_lock(self) -> dict:
        live = live_holders(self.holders)
        if not self.p["force"]:
            if not live:
                return self.result("released", False, f"{self.what} {self.name} is not held", released=[])
            self.refuse(f"{self.what} {self.name} is held by {describe_holders(live)}; pass the token returned when "
                        f"it was acquired{self.force_hint()}")
        if self.check_mode:
            return self.result("check", bool(live), f"would break {self.what} {self.name} held by "
                               f"{describe_holders(live)}", released=live)
        removed = self.engine_break()
        self.refresh()
        msg = (f"broke {self.what} {self.name}: {self.broke_verb} {describe_holders(removed)}" if removed
               else f"{self.name} is not held")
        return self.result("broken", bool(removed), msg, released=removed)
