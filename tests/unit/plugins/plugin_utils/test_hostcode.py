"""plugin_utils/_hostcode.py: a host's compiled engine, kept for the rest of the run, only where it came from."""

from __future__ import annotations

import os
import stat
from types import SimpleNamespace

import pytest
from ansible import constants as C
from ansible_collections.hostlock.core.plugins.plugin_utils import _hostcode

RESULT_KEY = "hostlock"


def action(**over: object) -> SimpleNamespace:
    pc = dict(remote_addr="web1.example", port=22, remote_user="deploy", become=False, become_user="root",
              become_method="sudo")
    pc.update(over)
    return SimpleNamespace(_play_context=SimpleNamespace(**pc), _connection=SimpleNamespace(transport="ssh"))


@pytest.fixture
def local_tmp(tmp_path, monkeypatch):
    where = tmp_path / "ansible-local-1234abcd"
    where.mkdir(mode=0o700)
    monkeypatch.setattr(C, "DEFAULT_LOCAL_TMP", str(where), raising=False)
    return where


def test_code_is_kept_apart_per_host_user_become_and_interpreter():
    base = _hostcode.key(action(), "#!/usr/bin/python3", {"inventory_hostname": "web1"})
    assert base == _hostcode.key(action(), "#!/usr/bin/python3", {"inventory_hostname": "web1"})
    others = [
        _hostcode.key(action(remote_addr="web2.example"), "#!/usr/bin/python3", {"inventory_hostname": "web1"}),
        _hostcode.key(action(), "#!/usr/bin/python3", {"inventory_hostname": "web2"}),
        _hostcode.key(action(port=2222), "#!/usr/bin/python3", {"inventory_hostname": "web1"}),
        _hostcode.key(action(remote_user="other"), "#!/usr/bin/python3", {"inventory_hostname": "web1"}),
        _hostcode.key(action(become=True), "#!/usr/bin/python3", {"inventory_hostname": "web1"}),
        _hostcode.key(action(become=True, become_user="app"), "#!/usr/bin/python3", {"inventory_hostname": "web1"}),
        _hostcode.key(action(become=True, become_method="su"), "#!/usr/bin/python3", {"inventory_hostname": "web1"}),
        _hostcode.key(action(), "#!/usr/bin/python3.11", {"inventory_hostname": "web1"}),
    ]
    assert base not in others and len(set(others)) == len(others)
    assert _hostcode.key(action(), None, {}) is None  # no interpreter known: nothing is kept


def test_the_first_run_asks_later_runs_get_it_and_it_never_reaches_the_result(local_tmp):
    name = _hostcode.key(action(), "#!/usr/bin/python3", {"inventory_hostname": "web1"})
    sent = []

    def execute(args: dict) -> dict:
        sent.append(args["compiled"])
        return {"ok": True, RESULT_KEY: {"event": "locked", "compiled": "Y29kZQ=="}}

    first = _hostcode.run_with(execute, {"name": "x"}, name, RESULT_KEY)
    second = _hostcode.run_with(execute, {"name": "x"}, name, RESULT_KEY)
    assert sent == ["", "Y29kZQ=="]  # "" asks the host for its own
    assert "compiled" not in first[RESULT_KEY] and "compiled" not in second[RESULT_KEY]
    assert _hostcode.compiled(name) == b"code"
    where = local_tmp / _hostcode.DIRECTORY
    assert stat.S_IMODE(where.stat().st_mode) == 0o700 and os.listdir(where) == [name]


def test_nothing_is_sent_or_kept_without_a_key_or_a_run_directory(local_tmp, monkeypatch):
    def execute(args: dict) -> dict:
        assert "compiled" not in args
        return {RESULT_KEY: {"compiled": "Y29kZQ=="}}

    result = _hostcode.run_with(execute, {"name": "x"}, None, RESULT_KEY)
    assert "compiled" not in result[RESULT_KEY]
    monkeypatch.setattr(C, "DEFAULT_LOCAL_TMP", str(local_tmp / "gone"), raising=False)
    name = _hostcode.key(action(), "#!/usr/bin/python3", {})
    _hostcode.store(name, "Y29kZQ==")
    assert _hostcode.load(name) == "" and _hostcode.compiled(name) == b""


def test_a_failed_or_odd_answer_keeps_nothing(local_tmp):
    name = _hostcode.key(action(), "#!/usr/bin/python3", {})
    for answer in ({"failed": True, "msg": "x"}, {RESULT_KEY: "not a dict"}, {RESULT_KEY: {"compiled": 5}}, "junk"):
        _hostcode.run_with(lambda _a, answer=answer: answer, {}, name, RESULT_KEY)
    assert _hostcode.load(name) == ""
    (local_tmp / _hostcode.DIRECTORY).mkdir(mode=0o700, exist_ok=True)
    (local_tmp / _hostcode.DIRECTORY / name).write_text("%%% not base64")
    assert _hostcode.compiled(name) == b""
