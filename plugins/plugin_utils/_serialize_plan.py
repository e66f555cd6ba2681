# Copyright: (c) 2025, hostlock maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""PRIVATE to this collection: what the serialize callback locks, planned before anything is taken.

Which lock names cover a host, how hosts hash into buckets, which locks (and modes) cover a play within the
descriptor budget, whether a --check play still changes hosts for real, and the callback's settings, checked
once. No lock is taken here; callback/serialize.py takes them.
"""

from __future__ import annotations

import hashlib
import os
import resource
import typing as t

import ansible.constants as C
from ansible.module_utils.parsing.convert_bool import BOOLEANS_FALSE, BOOLEANS_TRUE
from ansible.playbook.block import Block
from ansible.playbook.task import Task
from ansible.utils.sentinel import Sentinel
from ansible_collections.hostlock.core.plugins.module_utils.hostlock import parse_duration, validate_name
from ansible_collections.hostlock.core.plugins.module_utils.hostlock.core.names import MAX_NAME_LENGTH, name_chars
from ansible_collections.hostlock.core.plugins.module_utils.hostlock.core.text import one_line

# With a fleet, each lock is an etcd lease kept alive by the run: plays whose hosts plus buckets exceed this
# take their buckets exclusive instead (at most 64 leases), as descriptors bound local locks.
FLEET_BUDGET = 128
# Hosts hash into this many buckets. Every run must use the same number (it decides which bucket lock
# covers a host), so it is a constant, not an option.
BUCKETS = 64


def lock_name(prefix: str, host: str) -> str:
    """A valid lock name for a host; names needing changes get a hash so two hosts never collide."""
    clean = name_chars(host)
    name = prefix + clean
    # a host starting with "." is hashed too: prefix + ".bucket-NN" belongs to the bucket locks
    if clean != host or len(name) > MAX_NAME_LENGTH or host.startswith("."):
        digest = hashlib.sha256(host.encode("utf-8", "surrogateescape")).hexdigest()[:10]
        name = f"{name[:MAX_NAME_LENGTH - 1 - len(digest)]}-{digest}"
    return name


def bucket_of(host: str) -> int:
    """The bucket a host hashes into (the same in every run)."""
    return int.from_bytes(hashlib.sha256(host.encode("utf-8", "surrogateescape")).digest()[:4], "big") % BUCKETS


def bucket_name(prefix: str, bucket: int) -> str:
    return f"{prefix}.bucket-{bucket:02d}"


def fd_budget() -> int:
    """Descriptors the host locks of one play may use: a quarter of the soft limit (the rest is Ansible's)."""
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]  # the controller is POSIX (ansible-core's rule)
    if soft == resource.RLIM_INFINITY:
        soft = 1 << 20
    return max(BUCKETS, soft // 4)


# A key orders every lock in one global order: a bucket's lock before the host locks inside it.
Key = t.Tuple[int, int, str]


def plan(hosts: t.Iterable[str], budget: int) -> dict[Key, str]:
    """The locks (key -> mode) that cover these hosts within budget descriptors."""
    by_bucket: dict[int, list[str]] = {}
    for host in set(hosts):
        by_bucket.setdefault(bucket_of(host), []).append(host)
    count = sum(len(v) for v in by_bucket.values())
    wanted: dict[Key, str] = {}
    if count + len(by_bucket) <= budget:
        for bucket, members in by_bucket.items():
            wanted[(bucket, 0, "")] = "shared"  # others' large plays take it exclusive
            wanted.update({(bucket, 1, h): "exclusive" for h in members})
    else:
        wanted.update({(bucket, 0, ""): "exclusive" for bucket in by_bucket})
    return wanted


def real_work_in_check_mode(play: t.Any) -> str | None:
    """Why a play run with --check may still change its hosts, or None: a task, block, role or handler
    with check_mode other than true (false, or a template that may say false), or a dynamic include (its
    tasks are known only when it runs)."""
    def forces(obj: t.Any) -> bool:
        value = getattr(obj, "check_mode", None)
        return not (value is None or value is True or isinstance(value, type) or value is Sentinel)

    def walk(items: t.Iterable[t.Any]) -> str | None:
        for item in items or ():
            if isinstance(item, Block):
                if forces(item):
                    return "has a block with check_mode: false"
                found = walk(item.block) or walk(item.rescue) or walk(item.always)
                if found:
                    return found
            elif isinstance(item, Task):
                if item.action in C._ACTION_INCLUDE_TASKS + C._ACTION_INCLUDE_ROLE:
                    return f"includes tasks known only when they run ({item.get_name()!r})"
                if forces(item):
                    return f"has a task with check_mode: false ({item.get_name()!r})"
        return None

    if forces(play):
        return "has check_mode: false"
    return walk(play.compile()) or walk(play.handlers) or walk(play.compile_roles_handlers())


# Every option of the callback (its DOCUMENTATION), for the settings given where it never reads them.
OPTIONS = ("fleet", "ttl", "directory", "timeout", "fail_fast", "scope", "wait_in_flight", "prefix", "recap")
FOREVER = "forever"  # how a wait without end is spelled (timeout); never a negative number
_BOOLEANS = "true/false, yes/no, on/off or 1/0"


def _where(name: str) -> str:
    return f"[hostlock_serialize] {name} in ansible.cfg or $HOSTLOCK_SERIALIZE_{name.upper()}"


def settings(get: t.Callable[[str], t.Any]) -> dict[str, t.Any]:
    """Every option as the callback uses it, checked once; ValueError naming the setting and what it takes.

    Types are checked here, not by ansible-core's config: its bool conversion reads any unknown word as
    false (wait_in_flight=maybe would turn the wait off), and an option that fails to convert makes it
    drop the whole callback with a warning, so the run would go on unserialized.
    """
    out: dict[str, t.Any] = {}

    def bad(name: str, value: t.Any, takes: str) -> ValueError:
        return ValueError(f"invalid setting {name} = {one_line(repr(value))} ({_where(name)}): use {takes}")

    for name in ("fail_fast", "wait_in_flight", "recap"):
        raw = get(name)
        word = str(raw).strip().lower() if raw is not None else ""
        if isinstance(raw, bool):
            out[name] = raw
        elif word in BOOLEANS_TRUE:
            out[name] = True
        elif word in BOOLEANS_FALSE:
            out[name] = False
        else:
            raise bad(name, raw, _BOOLEANS)
    raw = get("timeout")
    if raw is None or str(raw).strip().lower() == FOREVER:
        out["timeout"] = None
    else:
        try:
            out["timeout"] = parse_duration(str(raw), "timeout")
        except ValueError:
            raise bad("timeout", raw, f"a duration (90, 30s, 30m, 1h30m) or {FOREVER!r}") from None
    try:
        out["ttl"] = parse_duration(str(get("ttl")), "ttl", positive=True)
    except ValueError:
        raise bad("ttl", get("ttl"), "a duration greater than 0 (10, 30s, 2m)") from None
    out["scope"] = get("scope")
    if out["scope"] not in ("play", "playbook"):
        raise bad("scope", out["scope"], "'play' or 'playbook'")
    out["prefix"] = get("prefix")
    try:
        validate_name(lock_name(str(out["prefix"]), "host"))
        validate_name(bucket_name(str(out["prefix"]), 0))
    except ValueError as e:
        raise bad("prefix", out["prefix"], f"a prefix that makes valid lock names ({one_line(str(e))})") from None
    out["fleet"] = str(get("fleet") or "").strip() or None
    if out["fleet"]:
        from ansible_collections.hostlock.core.plugins.module_utils.hostlock.fleet.url import parse

        try:
            parse(out["fleet"])
        except ValueError as e:
            raise ValueError(f"invalid setting fleet ({_where('fleet')}): {one_line(str(e))}") from None
    raw = get("directory")
    out["directory"] = None
    if raw is not None:
        where = os.path.expanduser(str(raw).strip())
        if not os.path.isabs(where):
            raise bad("directory", raw, "an absolute path (unset it for the default): a relative or empty one "
                      "names another directory for each run started elsewhere")
        out["directory"] = where
    return out
