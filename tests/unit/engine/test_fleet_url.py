"""Fleet URLs (hostlock/fleet/url.py): what parses, what is refused with one clear ValueError, and that a
fleet Lock never touches a lock directory or loads the etcd client before it is used."""

from __future__ import annotations

import subprocess
import sys

import pytest

import hostlock
from hostlock.fleet import url as _fleet


@pytest.mark.parametrize("url,endpoints,prefix", [
    ("etcd://127.0.0.1:2379", [("127.0.0.1", 2379)], "hostlock/"),
    ("etcd://h1", [("h1", 2379)], "hostlock/"),
    ("etcd://h1:1,h2:2,h3", [("h1", 1), ("h2", 2), ("h3", 2379)], "hostlock/"),
    ("etcd://h1:2379/team-a", [("h1", 2379)], "team-a/"),
    ("etcd://h1:2379/team-a/", [("h1", 2379)], "team-a/"),
    ("etcd://h1:2379/", [("h1", 2379)], "hostlock/"),
    ("etcd://h1/a/b", [("h1", 2379)], "a/b/"),
    ("etcd://[::1]:2400", [("::1", 2400)], "hostlock/"),
    ("etcd://[fe80::1]", [("fe80::1", 2379)], "hostlock/"),
    ("etcd://[fe80::1%eth0]:2379", [("fe80::1%eth0", 2379)], "hostlock/"),
    ("etcd://etcd-1.example.com.:2379", [("etcd-1.example.com.", 2379)], "hostlock/"),
])
def test_members_and_prefix(url, endpoints, prefix):
    u = _fleet.parse(url, environ={})
    assert u.endpoints == endpoints
    assert u.prefix == prefix
    assert not u.tls and u.user is None and u.password is None


def test_display_names_every_member_and_the_key_prefix():
    u = _fleet.parse("etcd://h1:2379,[::1]:2380/team", environ={})
    assert u.display() == "etcd://h1:2379,[::1]:2380/team/"
    assert u.display("db") == "etcd://h1:2379,[::1]:2380/team/db/"
    assert u.members == "h1:2379,[::1]:2380"


def test_tls_options_and_user_password_from_the_environment_only():
    u = _fleet.parse("etcds://ops@h1:2379?cacert=/etc/ca.pem&cert=/c%20d.pem&key=/k.pem",
                     environ={"HOSTLOCK_FLEET_PASSWORD": "s3cret"})
    assert u.tls and u.cacert == "/etc/ca.pem" and u.cert == "/c d.pem" and u.key == "/k.pem"
    assert u.user == "ops" and u.password == "s3cret"
    assert "s3cret" not in u.display() and "s3cret" not in repr(u)
    assert _fleet.parse("etcd://h1", environ={"HOSTLOCK_FLEET_PASSWORD": "x"}).password is None  # no user: unused


@pytest.mark.parametrize("url,why", [
    ("http://h1:2379", "scheme"),
    ("etcd:/h1", "scheme"),
    ("h1:2379", "scheme"),
    ("etcd://", "empty member"),
    ("etcd://h1,,h2", "empty member"),
    ("etcd://h1:0", "port"),
    ("etcd://h1:65536", "port"),
    ("etcd://h1:x", "port"),
    ("etcd://h1:1:2", "malformed"),
    ("etcd://[::1", "IPv6"),
    ("etcd://[\u00e9]:2379", "not an IPv6 address"),
    ("etcd://[zz]:2379", "not an IPv6 address"),
    ("etcd://h1:", "port ''"),
    ("etcds://a..b:2379", "empty or over-long label"),
    ("etcd://.a:2379", "empty or over-long label"),
    ("etcd://%s:2379" % ("a" * 64), "empty or over-long label"),
    ("etcd://%s:2379" % ".".join(["a" * 60] * 5), "empty or over-long label"),
    ("etcds://h1?cacert=%00", "NUL byte"),
    ("etcd://h1,etcds://h2", "one scheme for the whole URL"),
    ("etcd://ops%3Apw@h1", "password"),
    ("etcd://h 1", "spaces"),
    ("etcd://h1\n", "control"),
    ("etcd://ops:pw@h1", "password"),
    ("etcd://@h1", "user"),
    ("etcd://h1/../x", "prefix"),
    ("etcd://h1/a//b", "prefix"),
    ("etcd://h1/a~b", "prefix"),
    ("etcd://h1?cacert=/ca.pem", "TLS"),
    ("etcds://h1?ca=/x", "option"),
    ("etcds://h1?cacert=", "option"),
    ("etcds://h1?cert=/c.pem", "both"),
    ("etcds://h1?cacert=/a&cacert=/b", "twice"),
    (None, "string"),
    (2379, "string"),
])
def test_bad_urls_are_one_clear_value_error(url, why):
    with pytest.raises(hostlock.InvalidFleetURL) as e:
        _fleet.parse(url, environ={})
    assert isinstance(e.value, ValueError) and isinstance(e.value, hostlock.HostlockError)
    assert why in str(e.value)
    assert "\n" not in str(e.value)


def test_fleet_lock_refuses_a_directory_or_mechanism(tmp_path):
    for kw in ({"directory": str(tmp_path)}, {"mechanism": "ofd"}):
        with pytest.raises(ValueError, match="fleet"):
            hostlock.Lock("x", fleet="etcd://127.0.0.1:1", **kw)
    assert list(tmp_path.iterdir()) == []


def test_fleet_lock_object_is_made_without_io(tmp_path):
    """Making a fleet Lock contacts nobody (port 1 is closed) and touches no directory."""
    lock = hostlock.Lock("db", fleet="etcd://127.0.0.1:1/team", slots=3)
    assert lock.mechanism == "etcd"
    assert lock.path == "etcd://127.0.0.1:1/team/db/"
    assert not lock.locked and lock.fence is None and not lock.lost
    lock.check()  # not held: nothing lost


def test_fleet_tokens():
    assert hostlock.token_id("hostlock-etcd.694d8a1f2b3c4d5e.42") == "etcd-694d8a1f2b3c4d5e"
    for bad in ("hostlock-etcd.", "hostlock-etcd.xyz.1", "hostlock-etcd.abc.", "hostlock-etcd.abc.-1",
                "hostlock-etcd.ABC.1", "hostlock-etcd.%s.1" % ("a" * 17)):
        with pytest.raises(hostlock.TokenError) as e:
            hostlock.token_id(bad)
        assert e.value.reason == "malformed"


def test_host_locks_never_load_the_fleet_code():
    """`import hostlock.cli` and a host lock's cycle import nothing of hostlock.fleet (start-up cost)."""
    code = ("import sys, tempfile, hostlock.cli, hostlock\n"
            "d = tempfile.mkdtemp()\n"
            "with hostlock.Lock('x', directory=d):\n"
            "    pass\n"
            "hostlock.status('x', d)\n"
            "bad = [m for m in sys.modules if m.startswith('hostlock.fleet')"
            " or m in ('http.client', 'ssl', 'json')]\n"
            "print(bad)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
