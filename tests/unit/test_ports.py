"""tests/ports.py: the servers' ports are outside the range connections take their own end from."""

from __future__ import annotations

import socket

import ports


def test_a_port_is_below_the_ephemeral_range_and_free():
    low = ports._ephemeral_low()
    for _attempt in range(20):
        port = ports.free_port()
        assert ports._FLOOR <= port < low
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


def test_a_range_that_leaves_no_room_falls_back_to_the_kernels_choice(monkeypatch):
    monkeypatch.setattr(ports, "_ephemeral_low", lambda: ports._FLOOR + 10)
    assert ports.free_port() >= ports._FLOOR + 10
