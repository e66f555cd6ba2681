"""Inventory hosts of one run on one machine: when a task may wait for another host's lease (module_utils/_turns),
and what the controller says the strategy allows (plugin_utils/_controller.turns)."""

from __future__ import annotations

import pytest
from ansible_collections.hostlock.core.plugins.module_utils import _turns


def lease(host: str | None) -> dict:
    label = "ansible root@ctl: play 'p', task 't' [run abc123]" + (f" {_turns.host_marker(host)}" if host else "")
    return dict(label=label, stale=False, mode="exclusive")


def turns(me: str, batch: list, wait: bool) -> dict:
    return dict(host=_turns.host_tag(me), batch={_turns.host_tag(h): h for h in batch}, wait=wait, why="", works=[])


def test_the_host_tag_is_the_name_or_a_hash():
    assert _turns.host_tag("web1.example.com") == "web1.example.com"
    odd = _turns.host_tag("a host [with] brackets")
    assert odd.startswith("h-") and _turns.HOST_MARKER.search(f"[host {odd}]")


@pytest.mark.parametrize(
    ("holder", "given", "verdict"),
    [
        ("loc2", turns("loc", ["loc", "loc2"], True), (True, "")),  # free: the holder runs on to its release
        ("loc2", turns("loc", ["loc", "loc2"], False), (False, "strategy")),  # linear: it never could
        ("loc", turns("loc", ["loc", "loc2"], True), (False, "again")),  # our own host's lease: nested
        ("old", turns("loc", ["loc", "loc2"], True), (False, "earlier")),  # not in this batch: nobody releases it
        (None, turns("loc", ["loc", "loc2"], True), (False, "again")),  # a lease that names no host
        ("loc2", None, (False, "again")),  # no word from the controller: as before, never wait for the run
    ],
)
def test_judge(holder, given, verdict):
    got = _turns.judge([lease(holder)], given)
    assert (got.wait, got.kind) == verdict
