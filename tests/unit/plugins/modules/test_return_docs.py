"""RETURN of hostlock.core.lock and lock_info lists exactly what the modules and the engine really return.

The holder and lock fields come from the engine's as_dict() (Holder, LockStatus); when a key is added there,
or documented but gone, these tests fail until RETURN says the same.
"""

from __future__ import annotations

import json

import pytest
import yaml
from ansible.module_utils.testing import patch_module_args
from ansible_collections.hostlock.core.plugins.module_utils import hostlock
from ansible_collections.hostlock.core.plugins.modules import lock, lock_host, lock_info

# Keys every module result may carry, documented by Ansible itself rather than by each module's RETURN.
COMMON = {"changed", "msg", "failed", "skipped", "invocation", "warnings", "deprecations", "_rc"}


def run(module, capsys, **args) -> dict:
    with patch_module_args(args), pytest.raises(SystemExit) as exit_info:
        module.main()
    out = json.loads(capsys.readouterr().out)
    out["_rc"] = exit_info.value.code
    return out


def documented(module) -> dict:
    return yaml.safe_load(module.RETURN)


def keys(node: dict) -> set:
    return set((node.get("contains") or {}).keys())


@pytest.fixture
def lockdir(tmp_path):
    d = tmp_path / "locks"
    d.mkdir(mode=0o700)
    return str(d)


@pytest.fixture
def held(lockdir):
    """A real lease on lock 'docs', so status has a holder with every field the engine fills in."""
    token = hostlock.hold("docs", lease=60, directory=lockdir, label="return docs")
    yield token
    hostlock.release("docs", token, directory=lockdir)


def test_holder_and_lock_fields_match_the_engine(lockdir, held):
    st = hostlock.status("docs", directory=lockdir)
    lock_fields = set(st.as_dict())
    (holder,) = st.holders
    holder_fields = set(holder.as_dict())
    assert set(holder.to_json()) <= holder_fields and set(st.to_json()) <= lock_fields

    info_locks = documented(lock_info)["locks"]
    # lock_info adds each lock's figures (core.metrics.lock_figures) to the engine's fields
    assert keys(info_locks) == lock_fields | {"figures"}, "lock_info RETURN locks[] drifted from LockStatus.as_dict()"
    assert keys(info_locks["contains"]["holders"]) == holder_fields, "lock_info RETURN holders drifted"
    # lock's holders are the same records: its RETURN points at lock_info's list of their fields
    assert "contains" not in documented(lock)["holders"] and "lock_info" in str(documented(lock)["holders"])


def test_lock_info_results_are_documented(capsys, lockdir, held):
    out = run(lock_info, capsys, name="docs", directory=lockdir)
    doc = documented(lock_info)
    assert set(out) - COMMON <= set(doc), sorted(set(out) - COMMON - set(doc))
    (entry,) = out["locks"]
    assert set(entry) == keys(doc["locks"])
    assert set(entry["holders"][0]) == keys(doc["locks"]["contains"]["holders"])


def test_lock_results_are_documented(capsys, lockdir):
    doc = documented(lock)
    seen: dict = {}

    def check(result: dict) -> None:
        assert set(result) - COMMON <= set(doc), sorted(set(result) - COMMON - set(doc))
        for key in result:
            seen[key] = True
        assert set(result["hostlock"]) <= keys(doc["hostlock"]), sorted(set(result["hostlock"]) - keys(doc["hostlock"]))
        holder_doc = keys(documented(lock_info)["locks"]["contains"]["holders"])
        for holder in result["holders"] + result.get("released", []):
            assert set(holder) == holder_doc

    predicted = run(lock_host, capsys, name="ret", lease=30, directory=lockdir, _ansible_check_mode=True)
    check(predicted)
    taken = run(lock_host, capsys, name="ret", lease=30, directory=lockdir, label="docs")
    check(taken)
    renewed = run(lock_host, capsys, name="ret", lease=40, token=taken["token"], directory=lockdir)
    check(renewed)
    released = run(lock_host, capsys, name="ret", state="released", token=taken["token"], directory=lockdir)
    check(released)
    # every documented host-side key shows up in one of these runs (fleet keys and the action's heartbeat
    # come from the controller; conflicts add nothing new)
    controller_side = {"fleet", "path", "fence", "heartbeat"}
    assert set(doc) - controller_side <= set(seen), sorted(set(doc) - controller_side - set(seen))
