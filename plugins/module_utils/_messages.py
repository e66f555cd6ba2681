# Copyright: (c) 2025, hostlock maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""PRIVATE to this collection: the lines a hostlock.core task fails or warns with, each written once.

The modules on the host, the actions and fleet leases on the controller build their messages here, so a
busy lock, a lock of the same run or a refused option reads alike whichever plugin says it. Each function
returns one line; a caller that has more to say (which module did not run) appends it. Standard library only:
it ships to managed hosts. Not a public API; other collections must not import it.
"""

from __future__ import annotations

from ._common import describe_holders, live_holders


def still_held(what: str, name: str, waited: float | None, holders: list, see: str, where: str = "") -> str:
    """A lock still busy when the wait ran out: who holds it and where to look.

    `what` says which lock ("lock", "fleet lock"), `where` where it lives (" in /run/hostlock", " (prefix)"),
    `see` the status command that shows it.
    """
    return (f"{what} {name}{where} is still held after {waited}s by {describe_holders(live_holders(holders))} "
            f"(see: {see})")


def same_run(what: str, name: str, holders: list, advice: str) -> str:
    """A lock this same ansible-playbook run holds where waiting for it would never end; `advice` says what works."""
    return (f"{what} {name} is held by this same playbook run ({describe_holders(holders)}): a run never waits "
            f"for itself. {advice}")


# What works instead, for each way a run can end up waiting for itself (same_run's advice).
AGAIN_ON_THIS_HOST = ("This host holds a lease of this name already (an enclosing hostlock.core.with_lock or lock "
                      "block): do not take it again inside it, or use another name")
LOCKED_INSIDE_LEASE = ("Inside a held hostlock.core.lock (or with_lock) of this name, run the task without "
                       "hostlock.core.locked; or use another name")
EARLIER_LEASE = ("A lease of this name that host {holder} took earlier in this run is still held (a lease without "
                 "heartbeat, never released): release it (state: released with its token) before taking it again")
DELEGATED = "for a lock delegated to one host for the play's hosts, take it once (run_once: true)"
FLEET_SHARED = ("For a lock shared by the play's hosts take it once (run_once: true), or per host with different "
                "names, or use slots")


def one_machine(name: str, holder: str, waiter: str, why: str, works: list) -> str:
    """Two inventory hosts of one run that are one machine, where the strategy lets them not take turns."""
    return (f"lock {name} is held by host {holder} of this same playbook run, on the same machine as {waiter}, and "
            f"{why}: {holder} could not release it while {waiter} waited, so the run would wait for itself; nothing "
            f"ran on {waiter} under it. What works: {'; '.join(works)}")


def coerced(option: str, value: object, kind: str) -> str:
    """An option Ansible's YAML read as a boolean or a number where a name was meant (`name: yes`)."""
    shown = str(value).lower() if isinstance(value, bool) else str(value)
    return (f"{option} is the {kind} {shown}, not a name: YAML reads unquoted yes/no/on/off/true/false as booleans "
            f"and digits as numbers; quote it ({option}: \"...\")")


def did_not_run(msg: str, module: str) -> str:
    """A refusal of a hostlock.core.locked task: the wrapped module never ran."""
    return f"{msg}; {module} did not run"


def lease_lost(name: str) -> str:
    """A heartbeat lease found ended before its release: what it covered may have run without the lock."""
    return (f"lock {name}: its heartbeat lease ended while the run lived, before this release (the renewals were "
            "refused or could not reach the host, or the lease was broken there): the work it covered since may have "
            "overlapped another holder's; see hostlock history or status on the host")
