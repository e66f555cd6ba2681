"""Property-based tests over the owner-record parser and Holder construction: a record is text anyone in a
shared directory may have written, so no bytes may make status, list or break raise (issue 8)."""

from __future__ import annotations

import json
import os

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from hostlock.core import holder as _holder  # noqa: E402
from hostlock.core import owner as _owner  # noqa: E402

KEYS = ["pid", "start", "boot", "host", "pidns", "uid", "cmd", "mode", "slot", "at", "lease", "label", "jpid",
        "jcmd", "tid", "q"]
NUMBERS = st.one_of(
    st.integers(min_value=-(2 ** 70), max_value=2 ** 70).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.sampled_from(["", "1e400", "-0", "nan", "inf", "٣", "0x10", " 5", str(os.getpid()), "1", "0", "-1"]),
)
VALUES = st.one_of(NUMBERS, st.text(max_size=40))
FIELDS = st.dictionaries(st.sampled_from(KEYS), VALUES, max_size=len(KEYS))
FILES = st.one_of(st.none(), st.tuples(st.integers(0, 2 ** 64), st.integers(0, 2 ** 64),
                                       st.one_of(st.none(), st.integers(-(2 ** 40), 2 ** 40))))


def _encode(fields: dict) -> bytes:
    return (_owner.MAGIC + _owner.encode_fields(fields) + "\n").encode("utf-8")


def _check(h: _holder.Holder) -> None:
    """Everything status, list and break do with a holder: describe it, serialize it, judge it."""
    assert isinstance(h.describe(), str) and repr(h)
    json.dumps(h.to_json())
    h.as_dict()
    assert h.verified in (True, False, None) and h.alive in (True, False, None)
    assert h.prove() in (True, False, None)
    assert h.lease_expired in (True, False)


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=600))
def test_parse_record_never_raises_on_any_bytes(data):
    fields = _owner.parse_record(data)
    assert fields is None or (isinstance(fields, dict) and "pid" in fields
                              and all(isinstance(k, str) and isinstance(v, str) for k, v in fields.items()))
    _check(_holder.Holder(fields))


@settings(max_examples=400, deadline=None)
@given(FIELDS, FILES, st.sampled_from([None, "exclusive", "shared"]), st.one_of(st.none(), st.integers(0, 2000)))
def test_holder_from_any_well_formed_record_never_raises(fields, file, mode, slot):
    fields.setdefault("pid", str(os.getpid()))
    parsed = _owner.parse_record(_encode(fields))
    assert parsed == fields  # escaping round-trips every value
    _check(_holder.Holder(parsed, mode, slot, file))


@settings(max_examples=200, deadline=None)
@given(FIELDS, st.integers(-(2 ** 40), 2 ** 40))
def test_a_record_claiming_another_uid_than_its_file_owner_is_always_forged(fields, file_uid):
    fields.setdefault("pid", "1")
    h = _holder.Holder(_owner.parse_record(_encode(fields)), file=(0, 0, file_uid))
    if h.uid != file_uid:
        assert h.forged and h.verified is False and h.prove() is False and "forged" in h.problem


def test_one_serializer_as_dict_is_a_superset_of_the_documented_json(lockdir):
    """The CLI prints to_json(); the Ansible modules return as_dict(): the same keys and values, plus extras."""
    import hostlock

    with hostlock.Lock("ser", directory=lockdir, label="x"):
        st = hostlock.status("ser", lockdir)
        doc, full = st.to_json(), st.as_dict()
        assert {k: v for k, v in full.items() if k in doc and k != "holders"} == {
            k: v for k, v in doc.items() if k != "holders"}
        (h,) = doc["holders"]
        assert {k: full["holders"][0][k] for k in h} == h and h["verified"] is True and h["label"] == "x"
        json.dumps(full)
