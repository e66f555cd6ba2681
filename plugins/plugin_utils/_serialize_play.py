# Copyright: (c) 2025, hostlock maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""PRIVATE to this collection: what the serialize callback adds to a play before it runs.

Every task of a serialized play carries this run's in-flight mark in its environment, and a play whose hosts
an earlier run may have left work on starts with a task that waits for that work there (hostlock.core.serialize_host,
the callback's internal module: proc/marks.py's scan).
"""

from __future__ import annotations

import json
import typing as t

from ansible.module_utils.parsing.convert_bool import BOOLEANS_FALSE, BOOLEANS_TRUE
from ansible.playbook.block import Block
from ansible.playbook.task import Task
from ansible.template import trust_as_template

MARK_HOST = "HOSTLOCK_SERIALIZE_HOST"
MARK_RUN = "HOSTLOCK_SERIALIZE_RUN"
WAIT_TASK = "hostlock.core.serialize: wait for earlier runs' tasks on this host"
WAIT_MODULE = "hostlock.core.serialize_host"
# The words Ansible reads as booleans, as strings (a host var may be a string, a bool or an int).
_TRUE_WORDS = sorted({str(w).lower() for w in BOOLEANS_TRUE})
_FALSE_WORDS = sorted({str(w).lower() for w in BOOLEANS_FALSE})


def _with_marker(env: t.Any, marker: dict) -> list:
    """An `environment` keyword value with this run's marker first (and no earlier run's marker)."""
    items = env if isinstance(env, list) else [env] if env else []
    return [marker] + [e for e in items if not (isinstance(e, dict) and MARK_RUN in e)]


def mark_play(play: t.Any, scope: str, run_id: str, timeout: float | None, wait_on: list[str] | None) -> None:
    """Mark this play's tasks with this run and host; start the play by waiting for other runs' marks on the
    hosts `wait_on` names (None: every host of the play; empty: none, and no wait task at all).

    The play is post-validated but its iterator is not built yet (TaskQueueManager.run sends the callback's
    v2_playbook_on_play_start first), so a block prepended to pre_tasks becomes the play's first task.
    `scope` names the lock set (runs that do not exclude each other on the controller do not wait for each
    other on the hosts either); `timeout` is the wait's, in seconds, None for no end.
    """
    host_mark = scope + ":{{ inventory_hostname }}"  # a template, trusted where it is used (a tag is lost by +)
    marker = {MARK_HOST: trust_as_template(host_mark), MARK_RUN: run_id}
    # Tasks inherit `environment` from the Play their blocks were loaded with: the playbook's own Play
    # object, not this copy (TaskQueueManager.run copies it per batch); dynamic includes use the copy.
    plays = {id(play): play}
    for item in [*play.pre_tasks, *play.tasks, *play.post_tasks, *play.handlers, *play.roles]:
        parent = getattr(item, "_play", None)
        if parent is not None:
            plays[id(parent)] = parent
    for each in plays.values():
        each.environment = _with_marker(each.environment, marker)
    if wait_on is not None and not wait_on:
        return  # every host's last holder ended cleanly: no module run at all
    block = Block(play=play)
    block.run_once = False
    task = Task(block=block)
    # Waits until no process of the module's uid carrying this host's mark from another run is left there
    # (plugins/modules/serialize_host.py); fails with rc 75 once `timeout` seconds are up.
    task.action = WAIT_MODULE
    task.name = WAIT_TASK
    task.args = {"mark": trust_as_template(f"{MARK_HOST}={host_mark}"), "unless": f"{MARK_RUN}={run_id}"}
    if timeout is not None:
        task.args["timeout"] = timeout
    task.changed_when = [False]
    # The wait itself carries no host mark (the task's environment overrides the play's): two waits
    # left by killed runs must never wait for each other.
    task.environment = [{MARK_HOST: "-"}]
    # A host without /proc or Python (network devices, Windows) opts out with this host var. Only
    # a recognised false skips the wait. Any other value that is not a recognised true fails the host
    # here, before its first task, with one line (mandatory's msg): the bool filter would read a typo
    # as false, and skip the wait unasked.
    value = "(hostlock_serialize_wait_in_flight | default(true) | string | lower)"
    refusal = ("'hostlock.core.serialize: hostlock_serialize_wait_in_flight must be true or false, not ' ~ "
               "(hostlock_serialize_wait_in_flight | string | truncate(40) | to_json) ~ '; nothing ran on "
               "this host'")
    when = [trust_as_template(
        f"{value} in {_TRUE_WORDS!r} or ({value} not in {_FALSE_WORDS!r} and "
        f"(hostlock_serialize__never_defined | mandatory(msg={refusal})))"
    )]
    if wait_on is not None:
        # Only the hosts whose earlier holder may have left work: the callback's own list, as a literal (a
        # variable could be overridden by extra vars); inventory_hostname is Ansible's, never the user's.
        when.insert(0, trust_as_template(f"inventory_hostname in {json.dumps(sorted(wait_on))}"))
    task.when = when
    task.check_mode = False
    task.tags = ["always"]
    task.set_loader(play._loader)
    block.block = [task]
    play.pre_tasks = [block] + list(play.pre_tasks or [])
