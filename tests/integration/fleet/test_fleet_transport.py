"""The fleet transport on real etcd (issue 24, items 5, 6, 8): credentials, configuration mistakes, the lean
HTTP client, on every interpreter the library supports (3.8-3.13).

Members are started once per module: a plain one, a TLS one that wants a client certificate (a throwaway CA
made with openssl), one with authentication on, and a 3-member cluster. "Fails at once" is shown without a
clock: the command is given a long wait (-w 30s) and must end with the configuration exit code (78) and its
one line, where a retried mistake would end with 76 after the wait; the subprocess timeout only bounds a
hang. Nothing asserts a duration.
"""

from __future__ import annotations

import glob
import json
import os
import select
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import cli_install
import engine_helpers
import fleet_etcd
import pytest

from hostlock.fleet import etcd as _etcd
from hostlock.fleet import transport as _transport
from hostlock.fleet import url as _fleet

LIB = Path(engine_helpers.LIB)  # a copy every user can read: uid 65534 runs the launcher (private checkouts)
VERSIONS = ["3.8", "3.9", "3.10", "3.11", "3.12", "3.13"]
SECRET = "s3cret-Pa55/w@rd"  # '/' and '@' inside: the URL masking must not stop at either
GUARD = 120  # bounds a hang only


def interpreter(version: str) -> str | None:
    found = sorted(glob.glob(os.path.expanduser(f"~/.pyenv/versions/{version}.*/bin/python{version}")))
    found += [p for p in (f"/usr/bin/python{version}",) if os.path.exists(p)]
    return found[-1] if found else None


def launcher(directory: Path, python: str) -> str:
    """The cli role's launcher for `python` (tests/cli_install.py), on a copy of the package bundled for it
    (a copy every user can read: a bundle serves one interpreter)."""
    lib = engine_helpers.readable_copy(str(LIB))
    return str(cli_install.install(directory / ("hostlock-" + os.path.basename(python)), python, lib))


def make_pki(d: Path) -> dict:
    """A CA, a server certificate for 127.0.0.1 and a client certificate (Python 3.13's strict checks)."""
    def ssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=str(d), check=True, capture_output=True)

    ssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=hostlock transport CA",
        "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        "-keyout", "ca.key", "-out", "ca.pem")
    (d / "san.cnf").write_text("subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\n"
                               "keyUsage=critical,digitalSignature,keyEncipherment\n"
                               "authorityKeyIdentifier=keyid,issuer\nsubjectKeyIdentifier=hash\n")
    for who in ("server", "client"):
        ssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=%s" % who, "-keyout", who + ".key",
            "-out", who + ".csr")
        ssl("x509", "-req", "-in", who + ".csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
            "-days", "2", "-extfile", "san.cnf", "-out", who + ".pem")
    # Another CA, which signed nothing here: "the wrong CA".
    ssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=another CA",
        "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        "-keyout", "other.key", "-out", "other.pem")
    for name in os.listdir(str(d)):
        os.chmod(str(d / name), 0o644)  # readable by uid 65534 too, unless a test says otherwise
    return {k: str(d / k) for k in ("ca.pem", "server.pem", "server.key", "client.pem", "client.key",
                                    "other.pem")}


class Members:
    """The module's etcd members and the URLs that reach them."""

    plain: fleet_etcd.Etcd
    tls: fleet_etcd.Etcd
    auth: fleet_etcd.Etcd
    cluster: fleet_etcd.Cluster
    pki: dict
    tmp: Path

    @property
    def tls_url(self) -> str:
        p = self.pki
        return "etcds://%s?cacert=%s&cert=%s&key=%s" % (self.tls.endpoint, p["ca.pem"], p["client.pem"],
                                                        p["client.key"])


@pytest.fixture(scope="module")
def members():
    if not fleet_etcd.have_etcd() or not shutil.which("openssl"):
        pytest.skip("etcd/etcdctl or openssl not installed (make test-fleet installs etcd)")
    m = Members()
    # Not under pytest's 0700 base: uid 65534 runs the launcher and opens files here.
    m.tmp = Path(tempfile.mkdtemp(prefix="hostlock-transport-"))
    os.chmod(str(m.tmp), 0o755)
    pki_dir = m.tmp / "pki"
    pki_dir.mkdir(mode=0o755)
    m.pki = make_pki(pki_dir)
    started: list = []
    try:
        m.plain = fleet_etcd.start_etcd(str(m.tmp), "plain")
        started.append(m.plain)
        client, peer = fleet_etcd.free_port(), fleet_etcd.free_port()
        endpoint = "127.0.0.1:%d" % client
        m.tls = fleet_etcd.Etcd("tls", str(m.tmp / "tls.data"), client, peer, "tls=http://127.0.0.1:%d" % peer,
                                extra=["--listen-client-urls", "https://" + endpoint,
                                       "--advertise-client-urls", "https://" + endpoint,
                                       "--cert-file", m.pki["server.pem"], "--key-file", m.pki["server.key"],
                                       "--client-cert-auth", "--trusted-ca-file", m.pki["ca.pem"]])
        m.tls.start()
        started.append(m.tls)
        tls = ("--cacert", m.pki["ca.pem"], "--cert", m.pki["client.pem"], "--key", m.pki["client.key"])
        _until(lambda: m.tls.etcdctl(*tls, "endpoint", "health").returncode == 0, "the TLS member")
        m.auth = fleet_etcd.start_etcd(str(m.tmp), "auth")
        started.append(m.auth)
        for args in (("user", "add", "root:rootpw"), ("user", "add", "ops:" + SECRET), ("role", "add", "locks"),
                     ("role", "grant-permission", "locks", "--prefix=true", "readwrite", "hostlock/"),
                     ("user", "grant-role", "ops", "locks"), ("auth", "enable")):
            r = m.auth.etcdctl(*args)
            assert r.returncode == 0, r.stderr
        cdir = m.tmp / "cluster"
        cdir.mkdir()
        m.cluster = fleet_etcd.start_cluster(str(cdir), 3)
        started.append(m.cluster)
        yield m
    finally:
        for s in started:
            s.stop()
        shutil.rmtree(str(m.tmp), ignore_errors=True)


def _until(cond, what: str) -> None:
    import time

    deadline = time.monotonic() + 60
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting for " + what)
        time.sleep(0.05)


@pytest.fixture(scope="module")
def hl(members):
    """The command on this interpreter, the role's way."""
    return launcher(members.tmp, os.path.realpath(sys.executable))


def run(hl: str, *args: str, env: dict | None = None, user: int | None = None) -> subprocess.CompletedProcess:
    base = {"PATH": "/usr/bin:/bin", "HOME": "/nonexistent"}
    argv = [hl, *args]
    if user is not None:
        argv = ["setpriv", "--reuid=%d" % user, "--regid=%d" % user, "--clear-groups", *argv]
    return subprocess.run(argv, env=dict(base, **(env or {})), capture_output=True, text=True, timeout=GUARD,
                          check=False)


def one_line(r: subprocess.CompletedProcess) -> str:
    lines = r.stderr.splitlines()
    assert len(lines) == 1, r.stderr
    return lines[0]


def password_file(members: Members, name: str, mode: int = 0o600, text: str = SECRET + "\n") -> str:
    path = members.tmp / name
    fd = os.open(str(path), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.write(fd, text.encode())
    os.close(fd)
    os.chmod(str(path), mode)
    return str(path)


# -- the lean client on every interpreter ------------------------------------------------------------------
@pytest.mark.parametrize("version", VERSIONS)
def test_the_transport_on(version, members):
    """Plain, TLS with client certificates, authentication, a cluster; the scheme and file mistakes: all on
    each interpreter (the lean HTTP client's framing, ssl's errors and probes differ between versions)."""
    python = interpreter(version)
    if python is None:
        pytest.skip("no Python %s on this machine" % version)
    hl = launcher(members.tmp, python)
    job = 'echo "fence=$HOSTLOCK_FENCE pw=${HOSTLOCK_FLEET_PASSWORD-unset}"'
    for url in (members.plain.url, members.tls_url, members.cluster.url):
        r = run(hl, "run", "--fleet", url, "-w", "30s", "t-" + version, "-c", job)
        assert r.returncode == 0 and r.stdout.startswith("fence=") and r.stderr == "", (url, r)
    pw = password_file(members, "pw-" + version)
    r = run(hl, "run", "--fleet", "etcd://ops@" + members.auth.endpoint, "--fleet-password-file", pw,
            "t-" + version, "-c", job)
    assert (r.returncode, r.stderr) == (0, "") and r.stdout.endswith(" pw=unset\n"), r
    r = run(hl, "run", "--fleet", "etcd://ops@" + members.auth.endpoint, "t-" + version, "-c", job,
            env={"HOSTLOCK_FLEET_PASSWORD": SECRET})
    assert (r.returncode, r.stderr) == (0, "") and r.stdout.endswith(" pw=unset\n"), r
    # Mistakes: one line naming the scheme or the file, exit 78, although the wait was long.
    r = run(hl, "run", "--fleet", "etcd://" + members.tls.endpoint, "-w", "30s", "t", "true")
    assert r.returncode == 78 and "speaks TLS: use etcds://" in one_line(r), r
    r = run(hl, "run", "--fleet", "etcds://%s?cacert=%s" % (members.plain.endpoint, members.pki["ca.pem"]),
            "-w", "30s", "t", "true")
    assert r.returncode == 78 and "speaks plain HTTP, not TLS: use etcd://" in one_line(r), r
    missing = str(members.tmp / "no-such-ca.pem")
    r = run(hl, "run", "--fleet", "etcds://%s?cacert=%s" % (members.tls.endpoint, missing), "-w", "30s", "t",
            "true")
    assert r.returncode == 78 and "cacert file %s" % missing in one_line(r), r


# -- configuration mistakes fail at once -------------------------------------------------------------------
@pytest.mark.parametrize("which", ["cacert", "cert", "key"])
def test_a_missing_tls_file_is_78_naming_it(which, members, hl):
    files = {"cacert": members.pki["ca.pem"], "cert": members.pki["client.pem"], "key": members.pki["client.key"]}
    files[which] = str(members.tmp / ("missing-" + which))
    url = "etcds://%s?%s" % (members.tls.endpoint, "&".join("%s=%s" % kv for kv in files.items()))
    r = run(hl, "run", "--fleet", url, "-w", "30s", "t", "true")
    assert r.returncode == 78, r
    assert "cannot read %s file %s: No such file or directory" % (which, files[which]) in one_line(r)


@pytest.mark.parametrize("which", ["cacert", "cert", "key"])
def test_a_fifo_as_a_tls_file_is_78_at_once(which, members, hl):
    """A FIFO (or a device) where a TLS file should be: an open() that blocks would hang every command for
    good, whatever -n or -w say; it is opened without blocking and refused as not a regular file."""
    files = {"cacert": members.pki["ca.pem"], "cert": members.pki["client.pem"], "key": members.pki["client.key"]}
    files[which] = str(members.tmp / ("fifo-" + which))
    os.mkfifo(files[which], 0o600)
    url = "etcds://%s?%s" % (members.tls.endpoint, "&".join("%s=%s" % kv for kv in files.items()))
    for args in (("run", "--fleet", url, "-n", "t", "true"), ("run", "--fleet", url, "-w", "30s", "t", "true"),
                 ("status", "--fleet", url, "t"), ("hold", "--fleet", url, "--lease", "1m", "t")):
        r = run(hl, *args)
        assert r.returncode == 78, (args, r)
        assert "%s file %s is not a regular file" % (which, files[which]) in one_line(r), (args, r)


def test_an_unreadable_key_and_a_file_that_is_not_pem_are_78_naming_them(members, hl):
    key = members.tmp / "private.key"
    shutil.copy(members.pki["client.key"], str(key))
    os.chmod(str(key), 0o600)  # root's; uid 65534 cannot read it
    url = "etcds://%s?cacert=%s&cert=%s&key=%s" % (members.tls.endpoint, members.pki["ca.pem"],
                                                   members.pki["client.pem"], key)
    r = run(hl, "run", "--fleet", url, "-w", "30s", "t", "true", user=65534)
    assert r.returncode == 78 and "cannot read key file %s: Permission denied" % key in one_line(r), r
    not_pem = members.tmp / "not.pem"
    not_pem.write_text("hello\n")
    os.chmod(str(not_pem), 0o644)
    r = run(hl, "run", "--fleet", "etcds://%s?cacert=%s" % (members.tls.endpoint, not_pem), "-w", "30s", "t",
            "true")
    assert r.returncode == 78 and "cacert file %s holds no usable CA certificate" % not_pem in one_line(r), r
    r = run(hl, "run", "--fleet", "etcds://%s?cacert=%s&cert=%s&key=%s" % (
        members.tls.endpoint, members.pki["ca.pem"], members.pki["client.pem"], members.pki["server.key"]),
        "-w", "30s", "t", "true")
    assert r.returncode == 78 and "are not a certificate and its private key" in one_line(r), r


def test_the_wrong_scheme_on_a_cluster_is_78(members, hl):
    cluster = members.cluster
    url = "etcds://%s?cacert=%s" % (cluster.endpoints, members.pki["ca.pem"])
    r = run(hl, "run", "--fleet", url, "-w", "30s", "t", "true")
    assert r.returncode == 78 and "speaks plain HTTP, not TLS: use etcd://" in one_line(r), r
    r = run(hl, "status", "--fleet", "etcd://%s" % members.tls.endpoint, "t")
    assert r.returncode == 78 and "speaks TLS: use etcds://" in one_line(r), r


def test_the_wrong_ca_and_the_wrong_password_are_76_at_once(members, hl):
    url = "etcds://%s?cacert=%s&cert=%s&key=%s" % (members.tls.endpoint, members.pki["other.pem"],
                                                   members.pki["client.pem"], members.pki["client.key"])
    r = run(hl, "run", "--fleet", url, "-w", "30s", "t", "true")
    assert r.returncode == 76 and "certificate does not verify against cacert file %s: unable to get local " \
        "issuer certificate" % members.pki["other.pem"] in one_line(r), r
    assert "_ssl.c" not in r.stderr, r
    wrong = password_file(members, "wrong-pw", text="not-the-password\n")
    r = run(hl, "run", "--fleet", "etcd://ops@" + members.auth.endpoint, "--fleet-password-file", wrong,
            "-w", "30s", "t", "true")
    assert r.returncode == 76 and "refused user 'ops'" in one_line(r), r
    assert "not-the-password" not in r.stderr + r.stdout


def test_a_transient_failure_is_still_retried_within_the_wait(members, hl, proxy_to):
    """A member that accepts and says nothing (a black hole), healed while the command waits: it gets
    the lock, never a configuration error."""
    proxy = proxy_to(members.plain.endpoint)
    proxy.cut()
    p = subprocess.Popen([hl, "run", "--fleet", proxy.url, "-w", "60s", "t", "-c", "echo got it"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={"PATH": "/usr/bin:/bin"})
    _until(lambda: len(proxy._conns) > 0, "the command to reach the black hole")
    proxy.heal()
    out, err = p.communicate(timeout=GUARD)
    assert (p.returncode, out, err) == (0, "got it\n", ""), err


# -- credentials -------------------------------------------------------------------------------------------
def test_the_password_never_reaches_the_job(members, hl):
    """$HOSTLOCK_FLEET_PASSWORD leaves the environment of run and cron (fleet or host lock): the job and
    its children cannot read it, in their environment or in /proc/PID/environ."""
    url = "etcd://ops@" + members.auth.endpoint
    env = {"HOSTLOCK_FLEET_PASSWORD": SECRET, "HOSTLOCK_DIR": str(members.tmp)}
    # The job's own environment, and the block the kernel keeps of hostlock's (its parent's) and the watcher's.
    job = "env; cat /proc/$$/environ /proc/$PPID/environ | tr '\\0' '\\n'; " \
          "for p in $(pgrep -P $PPID); do tr '\\0' '\\n' < /proc/$p/environ; done"
    for args in (("run", "--fleet", url, "j", "-c", job), ("cron", "--fleet", url, "--name", "j", "-v", "-c",
                                                           job + "; exit 3"), ("run", "j", "-c", job)):
        r = run(hl, *args, env=env)
        assert r.returncode in (0, 3) and "HOSTLOCK_FLEET_PASSWORD" not in r.stdout + r.stderr, (args, r)
        assert SECRET not in r.stdout + r.stderr, (args, r)
    assert "HOSTLOCK_FENCE=" in run(hl, "run", "--fleet", url, "j", "-c", "env", env=env).stdout
    # hostlock flock, too, keeps hostlock's credential from its command.
    r = run(hl, "flock", str(members.tmp / "flock-pw"), "-c", job, env=env)
    assert r.returncode == 0 and "HOSTLOCK_FLEET_PASSWORD" not in r.stdout and SECRET not in r.stdout, r
    # The same user as the job cannot find it in hostlock's environment block either (uid 65534's run).
    nobody = "etcd://ops@" + members.auth.endpoint
    r = run(hl, "run", "--fleet", nobody, "j", "-c", "cat /proc/$PPID/environ", env=env, user=65534)
    assert r.returncode == 0 and SECRET not in r.stdout and "HOSTLOCK_FLEET_PASSWORD" not in r.stdout, r


def test_a_password_file_without_a_user_in_the_url_is_78(members, hl):
    """--fleet-password-file beside a URL that names nobody to log in as: a contradiction, never ignored."""
    pw = password_file(members, "pw-no-user")
    r = run(hl, "run", "--fleet", "etcd://" + members.plain.endpoint, "--fleet-password-file", pw, "t", "true")
    assert r.returncode == 78 and "names no user to log in as" in one_line(r) and SECRET not in r.stderr, r


def test_a_password_file_is_used_and_its_path_may_be_inherited(members, hl):
    pw = password_file(members, "pw-env")
    url = "etcd://ops@" + members.auth.endpoint
    r = run(hl, "run", "--fleet", url, "j", "-c", "env", env={"HOSTLOCK_FLEET_PASSWORD_FILE": pw})
    assert r.returncode == 0 and "HOSTLOCK_FLEET_PASSWORD_FILE=%s\n" % pw in r.stdout and SECRET not in r.stdout
    r = run(hl, "status", "--fleet", url, "j", env={"HOSTLOCK_FLEET_PASSWORD_FILE": pw})
    assert r.returncode == 0, r
    both = {"HOSTLOCK_FLEET_PASSWORD_FILE": pw, "HOSTLOCK_FLEET_PASSWORD": SECRET}
    r = run(hl, "run", "--fleet", url, "j", "true", env=both)
    assert r.returncode == 78 and "unset one" in one_line(r) and SECRET not in r.stderr, r
    r = run(hl, "run", "--fleet", url, "--fleet-password-file", pw, "j", "true", env=both)  # the option wins
    assert r.returncode == 0, r


@pytest.mark.parametrize("case", ["group-readable", "other-readable", "group-writable", "symlink", "fifo",
                                  "directory", "another-owner", "empty", "missing", "read-error",
                                  "in-a-writable-directory", "in-another-users-directory"])
def test_a_password_file_others_could_read_or_replace_is_refused(case, members, hl):
    name = "bad-" + case
    path = str(members.tmp / name)
    if case in ("group-readable", "other-readable", "group-writable"):
        password_file(members, name, {"group-readable": 0o640, "other-readable": 0o604,
                                      "group-writable": 0o620}[case])
        why = "may be read or written by other users"
    elif case == "symlink":
        os.symlink(password_file(members, name + ".target"), path)
        why = "is a symbolic link"
    elif case == "fifo":
        os.mkfifo(path, 0o600)  # an open() without O_NONBLOCK would hang here until a writer came
        why = "is not a regular file"
    elif case == "directory":
        os.mkdir(path, 0o700)
        why = "is not a regular file"
    elif case == "another-owner":
        password_file(members, name)
        os.chown(path, 65534, 65534)
        why = "belongs to uid 65534"
    elif case == "empty":
        password_file(members, name, text="\n")
        why = "holds no password"
    elif case == "read-error":
        path = "/proc/self/mem"  # a regular file of ours, mode 0600, whose read() fails (EIO at offset 0)
        why = "cannot be read: Input/output error"
    elif case in ("in-a-writable-directory", "in-another-users-directory"):
        # A 0600 file of ours, in a directory someone else may write to: they could put their own file there.
        d = members.tmp / name
        d.mkdir(mode=0o700)
        path = password_file(members, name + "/pw")
        if case == "in-a-writable-directory":
            os.chmod(str(d), 0o777)
            why = "is in %s, a directory other users may write (mode 0777)" % d
        else:
            os.chown(str(d), 65534, 65534)
            why = "is in %s, a directory of uid 65534" % d
    else:
        why = "cannot be opened: No such file or directory"
    r = run(hl, "run", "--fleet", "etcd://ops@" + members.auth.endpoint, "--fleet-password-file", path,
            "-w", "30s", "t", "true")
    line = one_line(r)
    assert r.returncode == 78 and "fleet password file %s (--fleet-password-file) %s" % (path, why) in line, r
    assert SECRET not in r.stderr + r.stdout
    r = run(hl, "status", "--fleet", "etcd://ops@" + members.auth.endpoint, "t",
            env={"HOSTLOCK_FLEET_PASSWORD_FILE": path})
    assert r.returncode == 78 and "($HOSTLOCK_FLEET_PASSWORD_FILE) " + why in one_line(r), r


def test_a_password_file_of_another_user_that_is_root_is_accepted_for_them(members, hl):
    """uid 65534 with its own 0600 file logs in; a 0600 file of root's it cannot even open: refused, named."""
    mine = members.tmp / "nobody-pw"
    password_file(members, "nobody-pw")
    os.chown(str(mine), 65534, 65534)
    url = "etcd://ops@" + members.auth.endpoint
    r = run(hl, "run", "--fleet", url, "--fleet-password-file", str(mine), "n", "true", user=65534)
    assert (r.returncode, r.stderr) == (0, ""), r
    roots = password_file(members, "root-pw")
    r = run(hl, "run", "--fleet", url, "--fleet-password-file", roots, "n", "true", user=65534)
    assert r.returncode == 78 and "cannot be opened: Permission denied" in one_line(r), r


@pytest.mark.parametrize("url", ["etcd://ops:{pw}@{ep}", "etcd://ops:{pw}@{ep}/team", "etcx://ops:{pw}@{ep}",
                                 "etcd://ops:{pw}@{ep}?cacert=/x", "etcd://ops:{pw}@{ep} x",
                                 "etcd://ops:{pw}?x@{ep}", "etcd://ops:?{pw}@{ep}", "etcd://ops:Pa55@w@rd?{pw}@{ep}",
                                 "etcds://ops:{pw}#?@{ep}", "etcd://ops%3A{pw}@{ep}", "etcd://{ep},ops:{pw}@{ep}"])
def test_a_password_in_the_url_is_refused_and_never_repeated(url, members, hl):
    url = url.format(pw=SECRET, ep=members.auth.endpoint)
    for args in (("run", "--fleet", url, "t", "true"), ("run", "--fleet", url, "--dir", "/tmp", "t", "true"),
                 ("status", "--fleet", url, "t"), ("cron", "--fleet", url, "--", "true")):
        r = run(hl, *args)
        line = one_line(r)
        assert r.returncode == 64 and "***@" in line, (args, r)
        for part in (SECRET, "s3cret", "Pa55", "w@rd"):
            assert part not in r.stderr + r.stdout, (args, part, r)


def test_mask():
    # The last '@' of the whole URL: a password may hold '?', '/', '#' or '@' (a path after it is hidden too).
    assert _fleet.mask("etcd://ops:%s@h:1,h:2/p?cacert=/a@b" % SECRET) == "etcd://ops:***@b"
    assert _fleet.mask("etcd://ops:%s@h:1,h:2/p?cacert=/a" % SECRET) == "etcd://ops:***@h:1,h:2/p?cacert=/a"
    assert _fleet.mask("etcd://ops:Se?cr@h:1") == "etcd://ops:***@h:1"
    assert _fleet.mask("etcd://ops:?Secr@h:1") == "etcd://ops:***@h:1"
    assert _fleet.mask("etcd://ops:pa@ss?wo#rd@h:1") == "etcd://ops:***@h:1"
    assert _fleet.mask("etcds://ops%3aSecr@h:1") == "etcds://ops%3A***@h:1"
    assert _fleet.mask("h:1,ops:pw@h:2") == "h:***@h:2"
    assert _fleet.mask("etcd://ops@h:1") == "etcd://ops@h:1"
    # A prefix with '@' after a port could be a password with '/' in it: hidden too (messages only).
    assert _fleet.mask("etcd://h:1/p@x") == "etcd://h:***@x"
    assert _fleet.mask("etcd://h:1/p") == "etcd://h:1/p"


# -- the lean HTTP/1.1 client's framing --------------------------------------------------------------------
def _serve(answer: bytes) -> socket.socket:
    """A socket whose peer reads one request and sends `answer` (then closes)."""
    a, b = socket.socketpair()

    def peer() -> None:
        with b:
            data = b""
            while b"\r\n\r\n" not in data:
                data += b.recv(4096)
            b.sendall(answer)

    threading.Thread(target=peer, daemon=True).start()
    return a


@pytest.mark.parametrize("answer, status, body, close", [
    (b"HTTP/1.1 200 OK\r\nContent-Length: 7\r\n\r\n{\"a\":1}", 200, b'{"a":1}', False),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3;ext=1\r\n{\"a\r\n4\r\n\":1}\r\n0\r\nX-T: 1\r\n\r\n",
     200, b'{"a":1}', False),
    (b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 503 Service Unavailable\r\nContent-Length: 2\r\n\r\n{}", 503, b"{}",
     False),
    (b"HTTP/1.0 200 OK\r\n\r\n{\"to\":\"close\"}", 200, b'{"to":"close"}', True),
    (b"HTTP/1.1 200 OK\r\nConnection: close\r\ncontent-length: 2\r\n\r\n{}", 200, b"{}", True),
])
def test_the_client_reads_every_framing_the_gateway_may_use(answer, status, body, close):
    conn = _transport._Conn(_serve(answer))
    try:
        assert conn.exchange(b"POST / HTTP/1.1\r\nContent-Length: 0\r\n\r\n", 10) == (status, body, close)
    finally:
        conn.close()


@pytest.mark.parametrize("answer, error", [
    (b"", _transport._Silent),  # closed before a word: the case the scheme probe looks at
    (b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\n{}", ConnectionResetError),  # cut in the middle
    (b"\x15\x03\x03\x00\x02\x02\x46", _transport._NotHTTP),  # a TLS alert is not HTTP: a URL mistake
    (b"SSH-2.0-OpenSSH_9.2\r\n", _transport._NotHTTP),
])
def test_the_client_refuses_what_is_not_a_whole_answer(answer, error):
    """Never a half answer taken for a whole one: the caller retries or diagnoses instead."""
    conn = _transport._Conn(_serve(answer))
    try:
        with pytest.raises(error):
            conn.exchange(b"POST / HTTP/1.1\r\nContent-Length: 0\r\n\r\n", 10)
    finally:
        conn.close()


def test_an_answer_that_came_in_time_is_read_though_we_look_after_the_end():
    """`hostlock run --fleet` loads its modules while the early grant's answer comes (grant.send_early): on a
    busy machine it looked after the attempt's end, and the answer waiting in the socket was taken for a member
    that did not answer (the grant asked again, of the next member). Nothing there and the end passed: a
    timeout, at once."""
    conn = _transport._Conn(_serve(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}"))
    try:
        conn.send(b"POST / HTTP/1.1\r\nContent-Length: 0\r\n\r\n", 10)
        assert select.select([conn.sock], [], [], GUARD)[0]  # the answer is in the socket
        assert conn.answer(time.monotonic() - 1) == (200, b"{}", False)
    finally:
        conn.close()
    a, b = socket.socketpair()
    with b:
        conn = _transport._Conn(a)
        try:
            with pytest.raises(socket.timeout):
                conn.answer(time.monotonic() - 1)
        finally:
            conn.close()


def test_the_command_path_imports_only_what_it_needs(members, hl):
    """What made `hostlock run --fleet` slow: http.client pulled in `email`, json and base64 `re`, socket
    `enum`, str hosts the idna codec. None of them is on the command's path (ssl only for etcds://)."""
    code = ("import sys; sys.path.append(%r); from hostlock.cli import main; rc = main(%r); "
            "bad = [m for m in ('http.client', 'email', 'encodings.idna', 'ssl', 'urllib.parse', 'argparse', "
            "'re', 'json', 'base64', 'socket', 'enum') if m in sys.modules]; print(bad); sys.exit(rc)"
            % (str(LIB), ["run", "--fleet", members.plain.url, "imports", "true"]))
    r = subprocess.run([os.path.realpath(sys.executable), "-I", "-S", "-c", code], capture_output=True, text=True,
                       timeout=GUARD, check=False)
    assert (r.returncode, r.stdout) == (0, "[]\n"), r


@pytest.mark.parametrize("value", [{"key": "a2V5", "range_end": "AA==", "limit": 0, "keys_only": True},
                                   {"compare": [{"target": "CREATE", "result": "EQUAL", "create_revision": "0"}],
                                    "success": [{"request_put": {"key": "eA==", "lease": "7"}}], "x": None},
                                   ["\u00e9\n\"\\", -1, False], {}, []])
def test_the_json_codec_agrees_with_the_json_package(value):

    assert json.loads(_etcd.dumps(value)) == value
    assert _etcd.loads(" " + json.dumps(value) + "\r\n") == value
    for bad in ("", "{", "{} x", "nul", "[1,]"):
        with pytest.raises(ValueError):
            _etcd.loads(bad)


def _request(conn: socket.socket) -> tuple[bytes, bytes]:
    """One HTTP request read from `conn`: (its head, its body); what came when the peer closes early."""
    data = b""
    while b"\r\n\r\n" not in data:
        more = conn.recv(65536)
        if not more:
            break
        data += more
    head, _sep, body = data.partition(b"\r\n\r\n")
    length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                   if line.lower().startswith(b"content-length:")), 0)
    while len(body) < length:
        more = conn.recv(65536)
        if not more:
            break
        body += more
    return head, body


class _Service:
    """A TCP service on a free port that is not etcd: `answer(conn)` serves each connection, then it closes."""

    def __init__(self) -> None:
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(16)
        self.endpoint = "127.0.0.1:%d" % self.listener.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _peer = self.listener.accept()
            except OSError:
                return
            with conn:
                self.answer(conn)

    def answer(self, conn: socket.socket) -> None:
        raise NotImplementedError

    def close(self) -> None:
        self.listener.close()


class _Banner(_Service):
    """A service that sends a banner (SSH's) on every connection, then closes."""

    def __init__(self, banner: bytes) -> None:
        self.banner = banner
        super().__init__()

    def answer(self, conn: socket.socket) -> None:
        conn.sendall(self.banner)


class _Echo(_Service):
    """An HTTP service that is not etcd and repeats each request it gets (its head, with the Authorization
    token, and its body, with a password) in its error page, as debugging proxies do: HTTP `status`."""

    def __init__(self, status: int, body: bytes | None = None, in_json: bool = False) -> None:
        self.body = body  # sent instead of the echo, when given
        self.status = status
        self.in_json = in_json  # the echo inside etcd-like JSON ({"error", "code", "message"})
        super().__init__()

    def answer(self, conn: socket.socket) -> None:
        head, body = _request(conn)
        page = b"could not handle request: " + head + b" " + body if self.body is None else self.body
        if self.in_json:
            text = page.decode("latin-1")
            page = json.dumps({"error": text, "code": 3, "message": text}).encode()
        conn.sendall(b"HTTP/1.1 %d Oops\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n"
                     b"Connection: close\r\n\r\n%s" % (self.status, len(page), page))


class _Late(_Service):
    """A member that answers a lease grant as etcd does, but only once LATE seconds have passed since the request
    came: slower than the millisecond a past deadline left the grant's first attempt."""

    LATE = 0.05

    def answer(self, conn: socket.socket) -> None:
        _request(conn)
        until = time.monotonic() + self.LATE
        while time.monotonic() < until:  # waits for the clock to pass a point, not for another party
            time.sleep(0.005)
        body = b'{"header":{"cluster_id":"1","member_id":"2","revision":"3"},"ID":"7","TTL":"30"}'
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body))


def test_a_deadline_already_past_still_gives_the_first_member_its_attempt():
    """-n (a deadline already past) gave the grant's first attempt (send_first, two_in_turn) a millisecond where
    call() gives two seconds: a member slower than that was skipped, and etcd://TLS,PLAIN took the lock from the
    plain one on a busy machine (hold, cron: 78 in call(), 0 here). The attempt has MIN_TRY, as in call()."""
    late = _Late()
    try:
        client = _etcd.Client(_fleet.parse("etcd://" + late.endpoint))
        try:
            first, second = client.two_in_turn("lease/grant", {"TTL": "30", "ID": "7"}, lambda: ("kv/txn", {}),
                                               time.monotonic() - 1, [])
        finally:
            client.close()
        assert first is not None and first["ID"] == "7" and second is None, first
    finally:
        late.close()


@pytest.mark.parametrize("status", [400, 401, 502])
def test_a_service_that_echoes_the_request_never_gets_the_password_repeated(status, members, hl):
    """A member that answers HTTP with something other than etcd's JSON, repeating our request in it: its page
    is never repeated (the password of the login, the token of the header). A 4xx is a mistake in the URL
    (78 at once, naming the member, even with a healthy member after it); a 5xx a proxy's passing trouble:
    the next member is asked, and when none answers the wait ends with 76."""
    pw = password_file(members, "pw-echo-%d" % status)
    echo = _Echo(status)
    try:
        url = "etcd://ops@%s,%s" % (echo.endpoint, members.auth.endpoint)
        r = run(hl, "run", "--fleet", url, "--fleet-password-file", pw, "-w", "30s", "t", "true")
        if status < 500:
            line = one_line(r)
            assert r.returncode == 78, r
            want = "member %s has no etcd v3 gateway (HTTP %d for /v3/auth/authenticate" % (echo.endpoint, status)
            assert want in line, r
        else:
            assert r.returncode == 0, r  # the second member served it
            r = run(hl, "run", "--fleet", "etcd://ops@" + echo.endpoint, "--fleet-password-file", pw, "-w", "1s",
                    "t", "true")
            assert r.returncode == 76 and "HTTP 502, not etcd's JSON" in one_line(r), r
        assert SECRET not in r.stderr + r.stdout and "password" not in r.stderr.replace("--fleet-password", ""), r
    finally:
        echo.close()


@pytest.mark.parametrize("command", ["run", "status", "list", "break"])
def test_json_that_is_not_etcds_is_78_and_a_refusal_is_76_for_every_command(command, hl):
    """A service answering HTTP 200 with JSON that is not etcd's (no header) is not a fleet: 78, naming the
    member, never `no locks` (a false success) nor a KeyError's text. etcd's own refusal of a request
    (HTTP 400, {"code": 3}) is 76 for every command, as docs/cli.md says, not 65."""
    args = {"run": ("run", "--fleet", "{url}", "-w", "10s", "t", "true"), "status": ("status", "--fleet", "{url}"),
            "list": ("list", "--fleet", "{url}"), "break": ("break", "--fleet", "{url}", "--force", "t")}[command]
    for status, body, code in ((200, b'{"ID": "1", "TTL": "10"}', 78),
                               (400, b'{"error": "bad request", "code": 3, "message": "bad request"}', 76)):
        fake = _Echo(status, body)
        try:
            r = run(hl, *(a.format(url="etcd://" + fake.endpoint) for a in args))
            assert r.returncode == code, (status, r)
            line = one_line(r)
            if code == 78:
                assert "member %s has no etcd v3 gateway (HTTP 200" % fake.endpoint in line, r
            assert "Traceback" not in r.stderr and "no locks" not in r.stdout, r
        finally:
            fake.close()


def test_too_many_requests_is_asked_again_within_the_wait(members, hl):
    """etcd sheds load with HTTP 429 {"code": 8, "too many requests"}: asked again (the next member, within the
    wait) as a member without a leader is, never a refusal that ends the wait at once."""
    busy = _Echo(429, b'{"error": "etcdserver: too many requests", "code": 8, "message": "etcdserver: too many '
                      b'requests"}')
    try:
        r = run(hl, "run", "--fleet", "etcd://%s,%s" % (busy.endpoint, members.plain.endpoint), "-w", "10s", "t",
                "true")
        assert r.returncode == 0, r
        began = time.monotonic()
        r = run(hl, "run", "--fleet", "etcd://" + busy.endpoint, "-w", "2s", "t", "true")
        assert r.returncode == 76 and "too many requests" in one_line(r), r
        assert time.monotonic() - began >= 2.0, "gave up before its wait: %r" % r.stderr
    finally:
        busy.close()


def test_nothing_listening_gives_up_within_the_wait(hl):
    """Every member refuses connections: the wait is tried out, then no cleanup waits on etcd (a revoke of a
    lease that no member could have granted): 76 as the wait ends, not seconds after it."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = "127.0.0.1:%d" % s.getsockname()[1]
    for wait, bound in (("-n", 2.0), ("3s", 3.0)):
        began = time.monotonic()
        r = run(hl, "run", "--fleet", "etcd://" + closed, *(["-n"] if wait == "-n" else ["-w", wait]), "t", "true")
        took = time.monotonic() - began
        assert r.returncode == 76 and "Connection refused" in one_line(r), r
        # The wait (MIN_TRY: 2 s for -n), plus a start-up's slack for a loaded machine; the cleanup added 5 s.
        assert took < bound + 2.5, "gave up %.1f s after its start, with %s" % (took, wait)


def test_a_port_that_is_not_etcds_client_port_is_78_naming_it(members, hl):
    """etcd's peer port (HTTP, but no /v3 gateway) and a service that does not speak HTTP at all: a
    mistake in the URL, said at once, never waited out as if a member were down."""
    peer = "127.0.0.1:%d" % members.plain.peer_port
    r = run(hl, "run", "--fleet", "etcd://" + peer, "-w", "30s", "t", "true")
    assert r.returncode == 78 and "member %s has no etcd v3 gateway (HTTP 404" % peer in one_line(r), r
    ssh = _Banner(b"SSH-2.0-OpenSSH_9.2p1 Debian-2\r\n")
    try:
        r = run(hl, "run", "--fleet", "etcd://" + ssh.endpoint, "-w", "30s", "t", "true")
        assert r.returncode == 78, r
        assert "member %s does not answer HTTP (it sent b'SSH-2.0-" % ssh.endpoint in one_line(r), r
    finally:
        ssh.close()


def test_a_member_that_echoes_the_request_inside_json_never_gets_the_password_repeated(members, hl):
    """The same echo inside etcd-like JSON ({"error", "code", "message"}): its message was repeated, with
    the login's password in it, for every command."""
    pw = password_file(members, "pw-echo-json")
    echo = _Echo(400, in_json=True)
    try:
        for args in (("run", "--fleet", "etcd://ops@" + echo.endpoint, "-n", "t", "true"),
                     ("status", "--fleet", "etcd://ops@" + echo.endpoint, "t")):
            r = run(hl, *args, env={"HOSTLOCK_FLEET_PASSWORD_FILE": pw})
            assert r.returncode == 76 and "its answer repeats our request, not shown" in one_line(r), r
            assert SECRET not in r.stderr + r.stdout, r
    finally:
        echo.close()


def test_a_key_with_a_passphrase_is_78_at_once_and_never_asks_for_it(members, hl):
    """OpenSSL asked for the passphrase: on a terminal the command waited for ever (-n too); without one it
    printed the prompt at every retry and ended 76 "Invalid argument" once the wait ran out."""
    enc = members.tmp / "encrypted.key"
    subprocess.run(["openssl", "pkey", "-in", members.pki["client.key"], "-aes256", "-passout", "pass:s3cret",
                    "-out", str(enc)], check=True, capture_output=True)
    url = "etcds://%s?cacert=%s&cert=%s&key=%s" % (members.tls.endpoint, members.pki["ca.pem"],
                                                   members.pki["client.pem"], enc)
    start = time.monotonic()
    r = run(hl, "run", "--fleet", url, "-w", "30s", "t", "true")
    assert r.returncode == 78 and "key file %s is encrypted" % enc in one_line(r), r
    assert "pass phrase" not in r.stderr and time.monotonic() - start < 20, r
    if shutil.which("script"):  # with a terminal, where OpenSSL would read the passphrase from
        p = subprocess.run(["script", "-qec", "%s run --fleet '%s' -n t true; echo rc=$?" % (hl, url), "/dev/null"],
                           capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL, check=False)
        assert "rc=78" in p.stdout and "pass phrase" not in p.stdout, p


def test_a_tls_member_reached_with_etcd_is_78_for_every_command_even_before_a_plain_one(members, hl):
    """etcd://TLS,PLAIN: run, cron and hold skipped the TLS member (the early grant asked it and went on) and
    got the lock, which status and release refused with 78: one URL, one answer for every command."""
    url = "etcd://%s,%s" % (members.tls.endpoint, members.plain.endpoint)
    name = "tls-first"  # its own: a hold that got a lock here would keep it from the other tests for 30 s
    for args in (("run", "--fleet", url, "-n", name, "true"), ("cron", "--fleet", url, "-n", name, "true"),
                 ("hold", "--fleet", url, "--lease", "30s", "-n", name), ("status", "--fleet", url, name)):
        r = run(hl, *args)
        assert r.returncode == 78 and "member %s speaks TLS: use etcds://" % members.tls.endpoint in one_line(r), r


@pytest.mark.parametrize("status", [302, 404, 500])
def test_an_answer_without_a_body_is_judged_as_one_that_is_not_etcds(status, members, hl):
    """An answer with an empty body (etcd's gateway answers every error with JSON) was read as {}: 76 "etcd
    refused lease/grant: HTTP 404" at once, even with a healthy member after it. Below 500 it is a mistake
    in the URL (78, naming the member); a 5xx a proxy's passing trouble (the next member is asked)."""
    fake = _Echo(status, b"")
    try:
        url = "etcd://%s,%s" % (fake.endpoint, members.plain.endpoint)
        name = "empty-%d" % status
        for args in (("run", "--fleet", url, "-n", name, "true"), ("status", "--fleet", url, name)):
            r = run(hl, *args)
            if status < 500:
                assert r.returncode == 78, r
                assert "member %s has no etcd v3 gateway (HTTP %d" % (fake.endpoint, status) in one_line(r), r
            else:
                assert r.returncode == 0, r
    finally:
        fake.close()


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"),
                    reason="needs root and unshare (a mount namespace)")
def test_a_name_service_that_never_answers_costs_no_more_than_the_wait(members, hl):
    """glibc gives a resolver that does not answer 10 s a lookup, and a command made four: `-n` took 40 s and
    `-w 5s` too. A lookup now has the attempt's time, and its answer serves the whole command."""
    sink = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)  # a resolver that reads every query, answers none
    sink.bind(("127.0.0.9", 53))
    resolv = members.tmp / "resolv.black"
    resolv.write_text("nameserver 127.0.0.9\n")
    try:
        for wait in (["-n"], ["-w", "3s"]):
            start = time.monotonic()
            argv = ["unshare", "-m", "sh", "-c", 'mount --bind "$1" /etc/resolv.conf && shift && exec "$@"', "sh",
                    str(resolv), hl, "run", "--fleet", "etcd://etcd1.hostlock-test.invalid:2379", *wait, "t", "true"]
            r = subprocess.run(argv, capture_output=True, text=True, timeout=GUARD, check=False,
                               env={"PATH": "/usr/bin:/bin", "HOME": "/nonexistent"})
            took = time.monotonic() - start
            assert r.returncode == 76 and "etcd unreachable" in one_line(r), r
            assert took < 15, (wait, took, r)  # the documented bound: the wait, plus ~7 s of cleanup at most
    finally:
        sink.close()


@pytest.mark.parametrize("body", [b'{"header": {}}', b'{"header": {"revision": "x"}, "ID": "notanumber", "kvs": "str"}',
                                  b'{"header": null, "ID": null}'])
def test_json_shaped_almost_like_etcds_is_78_for_every_command(body, hl):
    """JSON with etcd's keys but not its shapes: run exited 65 with a KeyError's text ('ID'), status 0 with
    "no locks" or 65 with an AttributeError's."""
    fake = _Echo(200, body)
    try:
        url = "etcd://" + fake.endpoint
        for args in (("run", "--fleet", url, "-n", "t", "true"), ("status", "--fleet", url, "t"),
                     ("list", "--fleet", url)):
            r = run(hl, *args)
            assert r.returncode == 78 and "member %s has no etcd v3 gateway" % fake.endpoint in one_line(r), (args, r)
    finally:
        fake.close()


class _Endless(_Service):
    """An HTTP service whose answer never ends: a head announcing 100 GB (or, `head`=True, a head that never
    ends), then bytes for as long as the client reads them."""

    def __init__(self, head: bool) -> None:
        self.head = head
        super().__init__()

    def answer(self, conn: socket.socket) -> None:
        conn.recv(65536)
        chunk = b"x" * 65536
        try:
            conn.sendall(b"HTTP/1.1 200 OK\r\nX-Filler: " if self.head else
                         b"HTTP/1.1 200 OK\r\nContent-Length: 100000000000\r\n\r\n")
            while True:
                conn.sendall(chunk)
        except OSError:
            return


@pytest.mark.skipif(not os.path.exists("/usr/bin/time"), reason="needs /usr/bin/time for the peak memory")
@pytest.mark.parametrize("head", [False, True], ids=["endless-body", "endless-head"])
def test_an_endless_answer_is_not_read_into_memory_without_end(head, hl):
    """A member whose answer never ends made hostlock buffer ~150 MB an attempt (and 66-86 MB of head)."""
    fake = _Endless(head)
    try:
        r = subprocess.run(["/usr/bin/time", "-f", "maxrss=%M", hl, "run", "--fleet", "etcd://" + fake.endpoint,
                            "-n", "t", "true"], capture_output=True, text=True, timeout=GUARD, check=False,
                           env={"PATH": "/usr/bin:/bin", "HOME": "/nonexistent"})
        peak_kib = int(r.stderr.rsplit("maxrss=", 1)[1].split()[0])
        # A head that never ends is not HTTP as etcd speaks it (78, at once); a body, one member's trouble (76).
        assert r.returncode == (78 if head else 76), r
        assert peak_kib < 64 * 1024, (peak_kib, r.stderr[-300:])
    finally:
        fake.close()
