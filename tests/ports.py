"""Loopback ports for the tests' real servers (etcd, sshd, node_exporter), in one place.

bind(0) hands out a port of the kernel's ephemeral range, the range every outgoing connection also takes its own
end from: between the choice and the server's bind (or a member's restart on its port after a kill) a test's
connection could hold it, and the server fails with "address already in use". These ports are below that range,
where no connection's own end lands, chosen at random and checked free when chosen.
"""

from __future__ import annotations

import random
import socket

_FLOOR = 10000  # below: ports that services of this machine may use by default


def _ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def free_port() -> int:
    """A loopback port free now, outside the ephemeral range (bind(0)'s when that range leaves no room)."""
    low = _ephemeral_low()
    pick = random.SystemRandom()
    for _attempt in range(200 if low - _FLOOR >= 1000 else 0):
        port = pick.randrange(_FLOOR, low)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
