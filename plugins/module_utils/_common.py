# Copyright: (c) 2025, hostlock maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""PRIVATE to this collection: helpers shared by the hostlock.core modules and controller plugins.

Nothing here is a public API; other collections must not import it. It runs on managed hosts
(Python 3.8+, no third-party packages) and on the controller, so it imports only the stdlib.
Lock logic does not live here (that is lib/hostlock, shipped as module_utils/hostlock): only the
wording and arithmetic the Ansible side needs on top of it.
"""

from __future__ import annotations

import re
import typing as t

# The key under which every hostlock.core result reports its lock timings, so the
# hostlock.core.serialize callback can build its recap without knowing each plugin's result shape.
RESULT_KEY = "hostlock"
# A heartbeat lease's default length (lock with heartbeat: true, locked around a task with its own action
# plugin): the controller renews it every quarter of it.
HEARTBEAT_LEASE = 60.0

# The controller appends "[run ID]" to a lease's label and "[run ID task]" to a hostlock.core.locked task's
# (plugin_utils/_runid.py): how a host recognises a holder of the same run. A task's lock ends by itself, so
# the run's other hosts wait for it; a lease ends only with a later task, so the run never waits for one.
RUN_MARKER = re.compile(r"\[run ([0-9A-Za-z._:@-]+)(?: task)?\]")


def lease_marker(label: str | None) -> str | None:
    """The "[run ID]" that the run's own leases carry, from our label (either form), or None."""
    found = RUN_MARKER.search(label or "")
    return f"[run {found.group(1)}]" if found else None


def holder_summary(holder: dict) -> str:
    """One line naming a holder: who (pid, user, command or job), why (label) and until when."""
    from .hostlock.core.holder import describe_holder  # the engine's one holder text, in its detailed form

    return describe_holder(holder, detailed=True)


def describe_holders(holders: list) -> str:
    """Join holder summaries for an error message; says 'nobody' rather than an empty string."""
    if not holders:
        return "nobody (it was released meanwhile)"
    return "; ".join(holder_summary(h) for h in holders)


def live_holders(holders: list) -> list:
    """Holders that still count: stale records (owner proven dead, lease ended) never block anyone."""
    return [h for h in holders if not h.get("stale")]


class _Taker(t.NamedTuple):
    """A holder record as the admission rule sees it."""

    mode: str
    slots: int


def would_acquire(holders: list, mode: str, slots: int) -> bool:
    """Whether a lock with these holders admits one more holder in `mode` (check mode's prediction).

    The engine's admission rule (core/admission.py), applied without taking anything to the live holders.
    Holder records do not say a semaphore's size: a lock's exclusive holders are counted as takers of the size
    asked (a lock name has one size on a host). Waiters queued before us are not counted: they can only delay
    us, not refuse us.
    """
    from .hostlock.core.admission import blockers  # a leaf: the rule, none of the engine's mechanisms

    slots = max(1, int(slots))
    takers = [_Taker("shared", 1) if h.get("mode") == "shared" else _Taker("exclusive", slots)
              for h in live_holders(holders)]
    return not blockers(takers, mode, slots)


# The engine's messages address the command line (HOSTLOCK_DIR); a module's user sets `directory:`.
_DIR_HINTS = (
    ("point HOSTLOCK_DIR at a real directory", "give the module a real directory (its directory: option)"),
    ("use a writable HOSTLOCK_DIR", "give the module a writable directory (its directory: option)"),
    ("set HOSTLOCK_DIR", "set the module's directory: option"),
    ("HOSTLOCK_DIR", "the module's directory: option"),
)


def engine_message(error: object) -> str:
    """An engine error as one line for a module's `msg`, its hints naming the module's `directory:` option."""
    text = " ".join(str(error).split())
    for engine_words, module_words in _DIR_HINTS:
        text = text.replace(engine_words, module_words)
    return text


def directory_params_error(p: dict) -> str | None:
    """A relative `directory:` (resolved in the module's working directory, Ansible's: another task, another
    playbook's directory or another connection would lock elsewhere), or None."""
    d = p.get("directory")
    if d and not str(d).startswith(("/", "~")):
        return f"directory must be absolute (got {d!r}): a module's working directory is Ansible's"
    return None


def path_params_error(p: dict) -> str | None:
    """What a `path:` lock cannot do (flock(2) on a file: no slots, no lock directory, no fleet), or None."""
    if not p.get("path"):
        return directory_params_error(p)
    if not str(p["path"]).startswith("/"):
        return f"path must be absolute (got {p['path']!r}): a module's working directory is Ansible's"
    if p.get("fleet"):
        return "path (a kernel lock on a file of the host) and fleet (a lock in etcd) exclude each other"
    if p.get("directory"):
        return "directory does not apply to a path lock (the file is the lock)"
    if (p.get("slots") or 1) != 1:
        return "slots does not apply to a path lock: flock(2) has no semaphores (use a named lock)"
    return None


def path_holder_dicts(path: str) -> list:
    """Holders of the kernel locks on `path`'s file, read from /proc as `hostlock status --path` does, in the
    shape of a named lock's holder records (pid, uid, cmdline, job_pid, job_cmdline, mode)."""
    import os

    from .hostlock.host import proclocks as _proclocks

    try:
        st = os.stat(path)  # follows a symlink, as flock(1) does when it opens the path to lock it
    except OSError:
        return []  # no file, no lock on it
    found = []
    for lk in _proclocks.locks_on(st.st_dev, st.st_ino):
        if lk.waiting:
            continue
        for h in lk.holders:
            job = h.jobs[0] if h.jobs else (None, None)
            found.append(dict(pid=h.pid, uid=h.uid, cmdline=h.cmdline, job_pid=job[0], job_cmdline=job[1],
                              mode=lk.mode, mechanism=lk.kind))
    return found
