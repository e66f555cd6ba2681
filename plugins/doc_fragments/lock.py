# Copyright: (c) 2025, hostlock maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The options hostlock.core.lock, locked and lock_info share, documented once.

Their specs live once too, in plugins/module_utils/_argspec.py; tests/unit/plugins/modules/test_argspec_docs.py
keeps the two alike. A module overrides a key of an option where it means something else there (lock_info's
name reports a lock instead of taking it).
"""

from __future__ import annotations


class ModuleDocFragment:
    # Which lock: name or path (hostlock.core.lock, hostlock.core.locked).
    DOCUMENTATION = r"""
options:
  name:
    description:
      - The lock's name, the one the host's own jobs use too (C(hostlock run NAME) in cron or a shell), for
        example V(apt) or V(deploy). 1 to 100 characters from C([A-Za-z0-9._+@-]), not starting with C(.),
        C(+), C(@) or C(-); quote names YAML would read as a boolean or a number (V("yes")).
      - Exactly one of O(name) and O(path).
    type: str
  path:
    description:
      - Instead of a named lock, the kernel lock C(flock(1)) takes on this file of the host, so the task and
        the host's C(flock FILE ...) scripts exclude each other. An absolute path whose directory exists; the
        file is created if missing, never written.
      - O(slots), O(directory) and O(fleet) do not apply.
    type: path
    version_added: 0.2.0
"""

    # How a lock is taken (hostlock.core.lock, hostlock.core.locked).
    TAKING = r"""
options:
  timeout:
    description:
      - How long to wait for the lock, as seconds (V(90), V(1.5)) or a duration (V(10m), V(1h30m)); V(0) tries
        once. Omit to wait as long as it takes. Then the task fails naming the holders (see O(on_conflict)).
    type: raw
  on_conflict:
    description:
      - When the lock is still busy after O(timeout), V(fail) fails the task naming the holders, V(skip) skips
        it.
    type: str
    choices: [fail, skip]
    default: fail
  mode:
    description:
      - V(exclusive) admits one holder (or O(slots) holders); V(shared) any number of shared holders and no
        exclusive one.
    type: str
    choices: [exclusive, shared]
    default: exclusive
  slots:
    description:
      - Above 1, the lock is a semaphore admitting that many holders at once (with O(mode=exclusive)).
    type: int
    default: 1
  label:
    description:
      - What C(hostlock status) and other tasks' errors show for the holder; by default the play, the task and
        the controller (and, in an AWX or AAP job, the job, its template and launching user, from C(awx_job_id)
        and the like; shown, never trusted), followed by this run's id.
    type: str
"""

    # Where the lock lives (hostlock.core.lock, locked, lock_info).
    WHERE = r"""
options:
  directory:
    description:
      - The lock directory on the host; by default C($HOSTLOCK_DIR), else C(/run/hostlock) when usable, else a
        per-user runtime directory. Absolute (or starting with C(~)). Whoever must be kept apart uses the same.
    type: path
  fleet:
    description:
      - A B(fleet lock) in etcd instead of a host lock, one lock per name for every run, control node and host
        of that etcd, for example V(etcd://10.0.0.5:2379) (TLS with C(etcds://)). The controller takes it; the
        host needs no route to etcd.
      - Defaults to E(HOSTLOCK_FLEET) in the controller's environment; V('') takes a host lock even when it is set.
    type: str
"""
