"""The keep-alive thread (fleet/session.py's Session, running fleet/keepalive.py) against a stand-in client: what it
must notice without a real etcd to make the timing happen."""

from __future__ import annotations

import base64
import json
import socket
import threading

from hostlock.core.clock import boottime
from hostlock.fleet import keepalive as _keepalive
from hostlock.fleet import session as _session
from hostlock.fleet.watch import Watch

GUARD = 30.0  # seconds: a hang guard, never a measured bound


def _chunk(message: dict) -> bytes:
    line = json.dumps(message).encode() + b"\n"
    return b"%x\r\n%s\r\n" % (len(line), line)


class _Client:
    """Answers keep-alives; its watches (open_watch, patched in fleet.keepalive to ask it) come with `leftover` already
    read (after their "created" answer) and a socket on which nothing more ever arrives."""

    answering = 0
    endpoints = [("127.0.0.1", 2379)]

    def __init__(self, leftover: bytes) -> None:
        self.leftover = leftover
        self.peers: list = []

    def call(self, path: str, body: dict, deadline: float, **kw: object) -> dict:
        return {"result": {"TTL": "10"}}

    def watch(self, key: bytes, range_end: bytes | None, start: int, deadline: float, **kw: object) -> Watch:
        w = Watch(self, 0, tuple(kw.get("wake") or ()))
        w.sock, peer = socket.socketpair()
        self.peers.append(peer)
        w._raw = self.leftover
        return w


def test_an_event_read_with_the_watchs_created_answer_is_not_left_unseen(monkeypatch):
    """etcd can send a watch's "created" answer and the key's DELETE in one segment (the key deleted before
    the watch opened): Watch.open() reads both and returns with the DELETE buffered. select() on the socket
    never wakes for it; the thread must see it in the buffer, or the holder would never learn its key is gone
    (seen under load: break --force on one of two locks sharing a lease went unnoticed)."""
    key = b"hostlock/a/7"
    leftover = _chunk({"result": {"header": {"revision": "9"},
                                  "events": [{"type": "DELETE", "kv": {"key": base64.b64encode(key).decode()}}]}})
    client = _Client(leftover)
    monkeypatch.setattr(_keepalive, "open_watch", lambda c, *a, **kw: c.watch(*a, **kw))
    claim = _session.Claim()
    lost = threading.Event()
    session = _session.Session(client, 7, 10.0, boottime(), claim, None)
    try:
        claim.on_lost = lost.set
        claim.watch_key(key, 5)
        assert lost.wait(GUARD), "the buffered DELETE was never seen"
        assert "deleted" in (claim.why or "")
    finally:
        claim.stop()
        for peer in client.peers:
            peer.close()
    assert session._stopped
