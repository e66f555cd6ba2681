"""The lease holder's request parser, in-process on a real lock: no bytes make it raise or act (hypothesis).

The integration tests (tests/integration/engine/test_lease_channel.py) attack a real holder; this drives
its one parsing function with every kind of line, fast enough to try thousands.
"""

from __future__ import annotations

import os
import socket

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import hostlock
from hostlock import lease as _lease
from hostlock.host import channel as _channel

SECRET = "0123456789abcdef" * 2


@pytest.fixture
def channel(lockdir):
    lock = hostlock.Lock("victim", directory=lockdir).acquire()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    ch = _lease._Channel(sock, lock, "victim", SECRET, 60.0)
    yield ch
    sock.close()
    lock.release()


def _request(verb: str, arg: str = "-", name: str = "victim", secret: str = SECRET) -> tuple[bytes, str]:
    nonce = os.urandom(16).hex()
    text = "%s %s %s %s %s" % (_channel.PROTOCOL, verb, name, nonce, arg)
    return ("%s %s" % (text, _channel.proof(secret, "request", text))).encode(), nonce


# One channel for every input on purpose: the test asserts that no input changes its state.
@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(line=st.one_of(
    st.binary(max_size=600),
    st.lists(st.text(max_size=70), max_size=8).map(lambda w: " ".join(w).encode("utf-8", "surrogatepass")),
    st.tuples(st.sampled_from(["release", "renew", "x"]), st.text(max_size=40)).map(
        lambda t: ("HL2 %s victim %s - %s" % (t[0], "a" * 32, t[1])).encode("utf-8", "surrogatepass")),
))
def test_no_line_without_the_secret_makes_the_holder_raise_or_act(channel, line):
    before = channel.deadline
    answer = channel._answer(line.split(b"\n", 1)[0])
    assert answer.startswith(b"ERR ") and answer.endswith(b"\n") and answer.count(b"\n") == 1
    assert not channel.done and channel.deadline == before and channel.lock.locked


def test_a_proven_request_acts_and_its_answer_is_proven(channel):
    line, nonce = _request("renew", "120")
    answer = channel._answer(line).decode().strip()
    body, _sep, proof = answer.rpartition(" ")
    assert body.startswith("OK ") and proof == _channel.proof(SECRET, "answer", nonce + " " + body)
    for bad in (_request("renew", "120", secret="f" * 32)[0], _request("renew", "120", name="other")[0],
                _request("renew", "1e10")[0], _request("renew", "nan")[0], _request("stop")[0]):
        assert channel._answer(bad).startswith(b"ERR ")
    assert not channel.done and channel.lock.locked
    assert channel._answer(_request("release")[0]).startswith(b"OK ")
    assert channel.done and not channel.lock.locked
