# Copyright: (c) 2025, hostlock maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""PRIVATE to this collection: inventory hosts of one run that are one machine, waiting for each other's lease.

Two inventory names can reach one machine (two local-connection names, a local name and an SSH name for
127.0.0.1, aliases of one server): a `hostlock.core.lock` lease (a `with_lock` block) that one of them holds
is then in the other's way. Whether the other may wait for it depends on the strategy, which only the
controller knows: under `free` and `host_pinned` the holder runs on to its release while the other waits (as
long as the waiting hosts cannot take every fork), under `linear` no host runs its next task before every host
has finished this one, so the holder could never release it. The action therefore names the task's inventory
host in the lease's label (`[host NAME]`, beside the run's `[run ID]`) and tells the module on the host which
hosts of this batch may be waited for (`turns`), or why none may; the module decides from the holders it sees.

Not a public API; other collections must not import it.
"""

from __future__ import annotations

import hashlib
import re
import typing as t

# A host tag in a lease's label: the inventory name when it is made of label-safe characters, else a hash.
HOST_MARKER = re.compile(r"\[host ([0-9A-Za-z._:@-]{1,80})\]")
_SAFE = re.compile(r"^[0-9A-Za-z._:@-]{1,64}$")


def host_tag(inventory_hostname: str) -> str:
    """How a lease's label names the inventory host that took it."""
    if _SAFE.match(inventory_hostname):
        return inventory_hostname
    return "h-" + hashlib.sha256(inventory_hostname.encode("utf-8", "surrogateescape")).hexdigest()[:16]


def host_marker(inventory_hostname: str) -> str:
    return f"[host {host_tag(inventory_hostname)}]"


def host_of(holder: dict) -> str | None:
    """The host tag a holder's label carries, or None (a lease taken before hosts were named)."""
    found = HOST_MARKER.search(holder.get("label") or "")
    return found.group(1) if found else None


class Verdict(t.NamedTuple):
    """What to do about this run's own leases in the way: wait, or refuse with `why` (`kind` for the message)."""

    wait: bool
    kind: str = ""  # "again" (this host's own), "earlier" (a host not in this batch), "strategy" (see `turns`)
    holder: str = ""


def judge(mine: list, turns: dict | None) -> Verdict:
    """Whether a task may wait for `mine`, the leases of its own run that keep it out.

    `turns` (from the action): {"host": our tag, "batch": {tag: inventory name} of the hosts running this task
    with us, "wait": whether the strategy lets them take turns, "why"/"works": what to say when not}. Without it
    (an older controller, a direct module run) nothing of the run is waited for, as before.
    """
    if not turns:
        return Verdict(False, "again")
    me, batch = turns.get("host"), turns.get("batch") or {}
    for holder in mine:
        tag = host_of(holder)
        if tag is None or tag == me:
            return Verdict(False, "again")
        if tag not in batch:
            return Verdict(False, "earlier", tag)
    if turns.get("wait"):
        return Verdict(True)
    return Verdict(False, "strategy", batch.get(host_of(mine[0]) or "", host_of(mine[0]) or "?"))
