# Copyright: (c) 2025, hostlock maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""PRIVATE to this collection: the option specs of the hostlock.core tasks and their checks, written once.

A user's task is checked against the same spec wherever it is checked: by the module on the host
(modules/lock_host.py, locked_host.py, lock_info.py) or by the action on the controller (fleet locks, and
`locked`, which builds the wrapped module before anything runs). Each option a user sets is documented once,
in plugins/doc_fragments/lock.py; tests/unit/plugins/modules/test_argspec_docs.py keeps docs and specs alike.
The internal modules add the options only the actions set (HOST_LOCK, HOST_LOCKED). Standard library and the
engine only: it ships to managed hosts. Not a public API; other collections must not import it.
"""

from __future__ import annotations

from ._common import HEARTBEAT_LEASE, path_params_error

# Which lock: a name in the lock directory, or a file flock(1) locks. Exactly one of the two.
WHICH: dict = dict(
    name=dict(type="str"),
    path=dict(type="path"),
)
MUTUALLY_EXCLUSIVE = [("name", "path")]
REQUIRED_ONE_OF = [("name", "path")]

# How a lock is taken: shared by lock and locked (doc fragment hostlock.core.lock.TAKING).
TAKING: dict = dict(
    mode=dict(type="str", choices=["exclusive", "shared"], default="exclusive"),
    slots=dict(type="int", default=1),
    timeout=dict(type="raw"),
    # on the managed host: the module expands it there
    directory=dict(type="path"),
    label=dict(type="str"),
    on_conflict=dict(type="str", choices=["fail", "skip"], default="fail"),
    # taken by the action on the controller (plugin_utils/_fleet.py); never sent to a host
    fleet=dict(type="str"),
)

# hostlock.core.lock, as a task writes it.
LOCK: dict = dict(
    WHICH,
    **TAKING,
    state=dict(type="str", choices=["acquired", "released"], default="acquired"),
    lease=dict(type="raw"),
    heartbeat=dict(type="bool", default=False),
    token=dict(type="str", no_log=True),
    force=dict(type="bool", default=False),
)
LOCK_MUTUALLY_EXCLUSIVE = [("token", "force"), *MUTUALLY_EXCLUSIVE]

# hostlock.core.locked, as a task writes it.
LOCKED: dict = dict(
    WHICH,
    **TAKING,
    # accepted and ignored (the lock lives as long as the wrapped module): tasks written for 0.1 keep working
    lease=dict(type="raw"),
    # the fleet lease's time to live (with fleet)
    ttl=dict(type="raw"),
    # as written in the task ({MODULE: ARGS} or {module: M, args: A}); the action reads either
    task=dict(type="dict", required=True),
)

# hostlock.core.lock_info.
LOCK_INFO: dict = dict(
    name=dict(type="str"),
    directory=dict(type="path"),
    fleet=dict(type="str"),
)

# The options only the actions set, for the internal modules the actions run on the host.
INTERNAL_LOCK: dict = dict(
    # the ansible-playbook process ("PID:START"), watched while the task waits (local connection)
    controller=dict(type="str"),
    # how this run's other inventory hosts share the machine (module_utils/_turns.py)
    turns=dict(type="dict"),
)
INTERNAL_LOCKED: dict = dict(
    # the action's `task` as it sends it: module and args apart
    task=dict(type="dict", required=True, options=dict(module=dict(type="str"), args=dict(type="raw"))),
    # the wrapped module's arguments can hold secrets: never echo the payload back (invocation, logs)
    payload=dict(type="str", no_log=True),
    controller=dict(type="str"),
    heartbeat=dict(type="bool", default=False),
    # code, not a secret: no_log keeps ~300 kB out of the invocation and the host's log
    compiled=dict(type="str", no_log=True),
)
HOST_LOCK: dict = dict(LOCK, **INTERNAL_LOCK)
HOST_LOCKED: dict = dict(LOCKED, **INTERNAL_LOCKED)


def on_controller(spec: dict) -> dict:
    """`spec` for checking on the controller: a `path` there would be expanded against the controller's home and
    environment, while the file or directory is the managed host's (its module expands it there)."""
    return {k: dict(v, type="str") if v.get("type") == "path" else v for k, v in spec.items()}


def lock_params_error(p: dict) -> str | None:
    """What is wrong with a lock task's options, or None; parses lease and timeout in place.

    The module on the host checks a host lock's task, the action a fleet lock's, with this one rule.
    """
    from .hostlock import parse_duration  # the engine's duration rule (on first use: the spec loads without it)

    error = path_params_error(p)
    if error:
        return error
    if p["slots"] < 1:
        return f"slots must be 1 or more (got {p['slots']})"
    if p["slots"] > 1 and p["mode"] != "exclusive":
        return f"slots={p['slots']} makes a semaphore, which needs mode=exclusive (got {p['mode']})"
    for key in ("lease", "timeout"):
        if p[key] is not None:
            try:
                p[key] = parse_duration(p[key], key)
            except ValueError as e:
                return str(e)
    if p["lease"] is not None and not p["lease"] > 0:
        return f"lease must be more than 0 seconds (got {p['lease']})"
    if p.get("heartbeat"):
        if p["state"] != "acquired" or p["token"]:
            return "heartbeat=true applies when taking a new lease (state=acquired, no token)"
        if p["lease"] is None:
            p["lease"] = HEARTBEAT_LEASE
    if p["state"] == "acquired" and p["lease"] is None:
        return "state is acquired but all of the following are missing: lease (or heartbeat=true, which defaults it)"
    if p["force"] and p["state"] != "released":
        return "force=true only applies to state=released"
    return None


# YAML 1.1 reads `name: yes`, `name: on`, `name: 0755` as a boolean or a number: Ansible would then lock "True"
# or "493". The options that name something, which such a value never means.
NAMING = ("name",)


def coerced_option(args: dict) -> tuple[str, object, str] | None:
    """(option, value, kind) of the first naming option a task gave as a boolean or a number, or None."""
    for option in NAMING:
        value = args.get(option)
        if isinstance(value, bool):
            return option, value, "boolean"
        if isinstance(value, (int, float)):
            return option, value, "number"
    return None
