"""Real etcd for the fleet tests: `etcd` (one member) and `etcd_cluster` (three), each stopped afterwards.

Without the etcd binaries (make test-fleet installs them) these tests skip with a reason, never fail.
"""

from __future__ import annotations

import fleet_etcd  # tests/ is on the import path (pytest.ini)
import pytest


@pytest.fixture
def etcd(tmp_path):
    if not fleet_etcd.have_etcd():
        pytest.skip("etcd/etcdctl not installed (make test-fleet installs etcd-server and etcd-client)")
    member = fleet_etcd.start_etcd(str(tmp_path))
    try:
        yield member
    finally:
        member.stop()


@pytest.fixture
def etcd_cluster(tmp_path):
    if not fleet_etcd.have_etcd():
        pytest.skip("etcd/etcdctl not installed (make test-fleet installs etcd-server and etcd-client)")
    cluster = fleet_etcd.start_cluster(str(tmp_path), 3)
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def proxy_to(request):
    """proxy_to(endpoint) -> a TcpProxy in front of it, closed afterwards."""
    made = []

    def make(endpoint: str) -> fleet_etcd.TcpProxy:
        p = fleet_etcd.TcpProxy(endpoint)
        made.append(p)
        return p

    yield make
    for p in made:
        p.close()
