"""Paths users give (`flock FILE`, `run --path FILE`, `status --path FILE`, `run -d DIR`) follow no symlink
another user could have planted in ANY component (issue 22 item 5; hostlock/host/safepath.py).

The attacker is a real other user (uid 65534 through setpriv) planting links in a sticky world-writable
directory, as in /tmp; the victim is root. util-linux flock(1) follows every one of these links: the
test checks it does, so each refusal below is ours, not the kernel's (fs.protected_symlinks may be 0).
"""

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from engine_helpers import NOBODY, needs_users

FLOCK = shutil.which("flock")

pytestmark = needs_users


@pytest.fixture
def arena():
    """A world-reachable top with a sticky world-writable `sticky/` (like /tmp) and a root-only `secret/`."""
    top = Path(tempfile.mkdtemp(prefix="hostlock-safepath-", dir="/tmp"))
    try:
        top.chmod(0o755)
        (top / "sticky").mkdir()
        (top / "sticky").chmod(0o1777)
        (top / "secret").mkdir()
        (top / "secret").chmod(0o700)
        yield top
    finally:
        shutil.rmtree(top, ignore_errors=True)


def plant(target, link):
    """ln -s TARGET LINK as uid 65534: a real other user's symlink."""
    subprocess.run(["setpriv", "--reuid=%d" % NOBODY, "--regid=%d" % NOBODY, "--clear-groups",
                    "ln", "-s", str(target), str(link)], check=True, capture_output=True, timeout=30)
    assert os.lstat(link).st_uid == NOBODY


def hostlock(launcher, *args, cwd=None, env_dir=None):
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    env["HOSTLOCK_DIR"] = env_dir or str(Path(tempfile.gettempdir()))
    return subprocess.run([str(launcher), *map(str, args)], capture_output=True, text=True, timeout=60,
                          check=False, cwd=cwd, env=env)


def refused(r, component):
    """Exit 66 (cannot open the lock file/directory), one line naming the refused component."""
    assert r.returncode == 66, (r.returncode, r.stderr)
    assert r.stderr.count("\n") == 1 and "refusing %s:" % component in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


def test_flock1_follows_what_hostlock_refuses(arena):
    """The baseline: util-linux flock(1) creates a root file inside the root-only directory through the link."""
    if not FLOCK:
        pytest.skip("no flock(1)")
    plant(arena / "secret", arena / "sticky" / "x")
    subprocess.run([FLOCK, str(arena / "sticky/x/by-flock1"), "true"], check=True, timeout=30)
    assert (arena / "secret" / "by-flock1").exists()


@pytest.mark.parametrize("how", ["flock", "run --path", "status --path", "run -d"])
def test_planted_middle_component_is_refused(launcher, arena, how, tmp_path):
    """/tmp/x -> /root-only planted by another user: root's command refuses, nothing is created inside."""
    plant(arena / "secret", arena / "sticky" / "x")
    target = arena / "sticky" / "x" / "f"
    lockdir = tmp_path / "locks"
    if how == "flock":
        r = hostlock(launcher, "flock", target, "true")
    elif how == "run --path":
        r = hostlock(launcher, "run", "--path", target, "true")
    elif how == "status --path":
        (arena / "secret" / "f").touch()  # something to stat: the link must not lead status to it either
        r = hostlock(launcher, "status", "--path", target)
    else:
        r = hostlock(launcher, "run", "-d", target, "NAME", "true", env_dir=str(lockdir))
    refused(r, arena / "sticky" / "x")
    assert sorted(os.listdir(arena / "secret")) == (["f"] if how == "status --path" else [])


def test_symlink_chain_through_our_own_link_into_a_planted_one(launcher, arena, tmp_path):
    """Our own link (followed, as flock(1) users expect) leading to another user's link: refused at the second."""
    plant(arena / "secret", arena / "sticky" / "evil")
    own = tmp_path / "own"
    os.symlink(arena / "sticky" / "evil", own)
    r = hostlock(launcher, "flock", own / "f", "true")
    refused(r, arena / "sticky" / "evil")
    assert os.listdir(arena / "secret") == []
    # A relative chain: sticky/a -> b (planted) -> ../secret.
    plant("../secret", arena / "sticky" / "b")
    plant("b", arena / "sticky" / "a")
    refused(hostlock(launcher, "flock", arena / "sticky/a/f", "true"), arena / "sticky" / "a")
    assert os.listdir(arena / "secret") == []


def test_dotdot_after_a_planted_link_is_refused(launcher, arena):
    """`x/..` would lead to the link's target's parent: the link is refused before `..` is walked."""
    (arena / "secret" / "inner").mkdir()
    plant(arena / "secret" / "inner", arena / "sticky" / "x")
    refused(hostlock(launcher, "flock", "%s/sticky/x/../f" % arena, "true"), arena / "sticky" / "x")
    assert os.listdir(arena / "secret") == ["inner"]
    # `..` through real directories only is fine and goes where the kernel would.
    (arena / "plain").mkdir()
    assert hostlock(launcher, "flock", "%s/plain/../sticky/ok" % arena, "true").returncode == 0
    assert (arena / "sticky" / "ok").exists()


def test_root_owned_symlink_in_a_directory_another_user_can_write_is_refused(launcher, arena):
    """A root link in a user's directory could be renamed away and replaced by that user: not followed."""
    users = arena / "users-dir"
    users.mkdir()
    os.chown(users, NOBODY, NOBODY)
    users.chmod(0o755)
    os.symlink(arena / "secret", users / "link")  # root's own link...
    refused(hostlock(launcher, "flock", users / "link" / "f", "true"), users / "link")
    group = arena / "group-writable"
    group.mkdir()
    group.chmod(0o775)  # root's, but its group can write it
    os.symlink(arena / "secret", group / "link")
    refused(hostlock(launcher, "flock", group / "link" / "f", "true"), group / "link")
    assert os.listdir(arena / "secret") == []


def test_relative_paths_walk_from_the_current_directory(launcher, arena):
    """A relative path starts at the current directory and meets the same rules."""
    plant(arena / "secret", arena / "sticky" / "x")
    refused(hostlock(launcher, "flock", "x/f", "true", cwd=arena / "sticky"), "x")
    refused(hostlock(launcher, "run", "--path", "sticky/x/g", "true", cwd=arena), "sticky/x")
    assert os.listdir(arena / "secret") == []
    assert hostlock(launcher, "flock", "sticky/rel", "true", cwd=arena).returncode == 0
    assert (arena / "sticky" / "rel").exists()


def test_trusted_symlinks_are_followed(launcher, arena, tmp_path):
    """Links nobody else could have planted are followed: root's in a root-only-writable directory (like
    /var/run -> /run), our own in a sticky directory, and a system one (/var/run, /bin where a link)."""
    safe = arena / "safe"
    safe.mkdir()
    (arena / "real").mkdir()
    os.symlink("../real", safe / "link")
    assert hostlock(launcher, "flock", safe / "link" / "f", "true").returncode == 0
    assert (arena / "real" / "f").exists()
    os.symlink(arena / "real", arena / "sticky" / "mine")
    assert hostlock(launcher, "run", "--path", arena / "sticky/mine/g", "true").returncode == 0
    assert (arena / "real" / "g").exists()
    r = hostlock(launcher, "status", "--path", "/var/run/../etc/hostname")
    assert r.returncode in (0, 66) and "refusing" not in r.stderr


def test_a_component_swapped_for_a_link_after_a_first_open_is_refused(arena):
    """In one process, a lock directory opened once (the walk's result remembered) and then redirected by
    another user swapping a middle component for a symlink: the next open walks again and refuses."""
    import hostlock

    theirs = arena / "sticky" / "d"
    subprocess.run(["setpriv", "--reuid=%d" % NOBODY, "--regid=%d" % NOBODY, "--clear-groups", "mkdir", "-m",
                    "0777", str(theirs)], check=True, timeout=30)
    (theirs / "locks").mkdir(mode=0o700)
    # A directory of another user's on the way is refused from the first open (its owner could rename the
    # lock directory away while a lock is held in it: issue 39 item 3) ...
    with pytest.raises(hostlock.LockDirectoryError, match="refusing %s: it belongs to uid %d" % (theirs, NOBODY)):
        hostlock.Lock("a", directory=str(theirs / "locks")).acquire(timeout=0)
    # ... so the swap is made here by root itself, on a path of root's: what is checked is that a path whose
    # walk was remembered is walked again when it leads elsewhere.
    mine = arena / "sticky" / "r"
    (mine / "locks").mkdir(parents=True, mode=0o700)
    (arena / "secret" / "locks").mkdir(mode=0o700)  # root's, as trusted as the first one
    hostlock.Lock("a", directory=str(mine / "locks")).acquire(timeout=0).release()
    os.rename(mine, arena / "sticky" / "r.old")
    theirs = mine
    plant(arena / "secret", theirs)
    with pytest.raises(hostlock.LockDirectoryError, match="refusing %s: a symlink owned by uid" % theirs):
        hostlock.Lock("a", directory=str(theirs / "locks")).acquire(timeout=0)
    assert os.listdir(arena / "secret" / "locks") == []


def test_release_through_a_planted_link_is_refused_and_the_lease_lives(launcher, arena):
    """`release -d DIR` walks DIR like any other path: through another user's link it refuses (66), naming
    the link, and does not reach (or report gone) the lease that lives behind it."""
    real = arena / "secret" / "locks"
    real.mkdir(mode=0o700)
    r = hostlock(launcher, "hold", "-d", real, "leased", "--lease", "10m")
    assert r.returncode == 0, r.stderr
    token = r.stdout.strip()
    plant(arena / "secret", arena / "sticky" / "x")
    refused(hostlock(launcher, "release", "-d", arena / "sticky/x/locks", "leased", token), arena / "sticky" / "x")
    assert hostlock(launcher, "run", "-n", "-d", real, "leased", "true").returncode == 75  # still held
    assert hostlock(launcher, "release", "-d", real, "leased", token).returncode == 0
