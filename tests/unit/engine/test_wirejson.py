"""fleet/wirejson.py: the gateway's JSON in Python, checked against the `json` module: what it parses (random
documents, every escape, numbers at the grammar's edges), what it refuses (anything json refuses: a ValueError,
never a value made up), what it writes (byte for byte json.dumps's compact ASCII form), and long answers, which
go to `_json`."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hostlock.fleet import wirejson

_SCALARS = (st.none(), st.booleans(), st.integers(min_value=-(2 ** 70), max_value=2 ** 70), st.text())


def _trees(*scalars):
    """JSON values: lists and string-keyed dicts nested over `scalars`."""
    return st.recursive(st.one_of(*scalars), lambda inner: st.one_of(st.lists(inner, max_size=5),
                                                                     st.dictionaries(st.text(), inner, max_size=5)),
                        max_leaves=30)


documents = _trees(*_SCALARS, st.floats(allow_nan=False, allow_infinity=False))  # what etcd could send
bodies = _trees(*_SCALARS)  # what the client writes: no floats


@settings(max_examples=400, deadline=None)
@given(documents, st.booleans(), st.sampled_from([None, 1, "\t"]))
def test_parses_what_json_writes(value, ascii_only, indent):
    text = json.dumps(value, ensure_ascii=ascii_only, indent=indent)
    assert wirejson.loads(text) == json.loads(text)
    assert wirejson.loads(" \r\n" + text + "\n\t ") == json.loads(text)


@settings(max_examples=400, deadline=None)
@given(bodies)
def test_writes_what_json_writes(value):
    assert wirejson.dumps(value) == json.dumps(value, separators=(",", ":"))


@pytest.mark.parametrize("text", [
    '"\\u00e9\\ud83d\\ude00\\n\\t\\"\\\\\\/\\b\\f\\r"',  # every escape, and a surrogate pair
    '"\\ud83d"', '"\\ude00x"', '"\\ud83d\\u0041"',  # lone surrogates, kept as json keeps them
    '"\u2028\u00a0\U0001f600"',  # printable or not, only control characters must be escaped
    "0", "-0", "7", "-12", "1.5", "-0.25e-3", "1E+2", "1e5", "123456789012345678901234567890",
    '{"a":1,"a":2}',  # the last of two equal keys, as json
    '{"kvs":[{"key":"a2V5","create_revision":"5","lease":"7"}],"header":{"revision":"9"},"count":"1"}',
])
def test_agrees_with_json_on_the_edges(text):
    assert wirejson.loads(text) == json.loads(text)
    assert type(wirejson.loads(text)) is type(json.loads(text))


@pytest.mark.parametrize("text", [
    "", " ", "{", "}", "[", "[1,]", "[,1]", "{,}", '{"a"}', '{"a":}', '{"a" 1}', '{"a":1,}', "{1:2}", "{} x",
    "[] []", "nul", "tru", "fals", "+1", "01", "-01", "1.", ".5", "-", "1e", "1e+",
    "1-2", "0x10", '"abc', '"\\x41"', '"\\u12"', '"\\u12g4"', '"a\nb"', '"\x01"', "'a'", "<html>", "[1 2]",
])
def test_refuses_what_json_refuses(text):
    with pytest.raises(ValueError):
        json.loads(text)
    with pytest.raises(ValueError):
        wirejson.loads(text)


@pytest.mark.parametrize("text", ["NaN", "-Infinity", "[Infinity]", '{"a":NaN}'])
def test_refuses_the_constants_json_lets_through(text):
    """Not JSON (json.loads takes them by default); etcd never sends them: a ValueError, short answer or long."""
    with pytest.raises(ValueError):
        wirejson.loads(text)
    with pytest.raises(ValueError):
        wirejson.loads('{"pad":"%s","v":%s}' % ("x" * wirejson.LONG, text))


def test_a_hostile_nesting_is_a_value_error():
    for depth in (300, 100000):  # a short answer (parsed here), a long one (by _json)
        with pytest.raises(ValueError):
            wirejson.loads("[" * depth + "]" * depth)


def test_long_answers_go_to_json_with_the_same_result_and_rules():
    queue = {"kvs": [{"key": "a2V5%d" % i, "value": "SEwx" * 20, "create_revision": str(i), "lease": str(i)}
                     for i in range(60)], "header": {"revision": "99"}}
    text = json.dumps(queue)
    assert len(text) >= wirejson.LONG
    assert wirejson.loads(text) == queue
    assert wirejson._scan is not None  # parsed by _json
    for bad in (text + " x", text[:-1], text.replace('"99"', "NaN")):
        with pytest.raises(ValueError):
            wirejson.loads(bad)


def test_dumps_refuses_what_it_cannot_send():
    with pytest.raises(TypeError):
        wirejson.dumps({"a": 1.5})
    with pytest.raises(TypeError):
        wirejson.dumps({"a": object()})
