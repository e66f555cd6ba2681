"""Unit tests for serialize's handover entries: a host skips the in-flight wait only on proof of a clean end."""

from __future__ import annotations

import os

import pytest
from ansible_collections.hostlock.core.plugins.plugin_utils._serialize_handover import (
    CLEAN,
    Handover,
    HandoverError,
    entry_name,
)

LOCK, BUCKET = "ansible-host@web1", "ansible-host@.bucket-07"
RELATED = {LOCK: (BUCKET,)}


@pytest.fixture
def lockdir(tmp_path):
    d = tmp_path / "ctl"
    d.mkdir(mode=0o700)
    return d


def _after(d, ctime_ns: int) -> None:
    """Return once a file made now gets a ctime after `ctime_ns` (the kernel's clock ticks coarsely: two
    files made in one tick share a ctime, which the handover reads as "wait")."""
    probe = d.parent / "probe"
    while True:
        probe.write_bytes(b"")
        if os.stat(probe).st_ctime_ns > ctime_ns:
            return
        probe.unlink()


def _clean_run(d) -> None:
    h = Handover(str(d))
    h.taken([LOCK], "run1")
    h.ended_clean(LOCK, "run1")
    h.close()


def test_nothing_known_means_wait(lockdir):
    """A fresh directory (a reboot empties /run): no entry, no skip."""
    assert Handover(str(lockdir)).clean(RELATED) == set()


def test_a_clean_end_lets_the_next_run_skip_and_a_take_makes_it_dirty(lockdir):
    _clean_run(lockdir)
    h = Handover(str(lockdir))
    assert h.clean(RELATED) == {LOCK}
    h.taken([LOCK], "run2")  # run2 killed from here on: its entry says dirty
    assert Handover(str(lockdir)).clean(RELATED) == set()
    assert not [n for n in os.listdir(lockdir) if n.endswith("=run2")], "no temporary file left"


def test_a_newer_entry_of_another_uid_or_of_the_bucket_means_wait(lockdir):
    """Another user's run (or a large play's bucket lock) held the host after our clean end."""
    for other in (entry_name(os.geteuid() + 1, LOCK), entry_name(os.geteuid(), BUCKET)):
        _clean_run(lockdir)
        (lockdir / other).write_bytes(CLEAN)  # whatever it says: it is newer
        assert Handover(str(lockdir)).clean(RELATED) == set(), other
        (lockdir / other).unlink()
    assert Handover(str(lockdir)).clean(RELATED) == {LOCK}


def test_an_older_entry_of_another_uid_does_not_matter(lockdir):
    older = lockdir / entry_name(os.geteuid() + 1, LOCK)
    older.write_bytes(b"dirty\n")
    _after(lockdir, os.stat(older).st_ctime_ns)
    _clean_run(lockdir)  # our run waited, then ended cleanly: what came before it is cleared
    assert Handover(str(lockdir)).clean(RELATED) == {LOCK}


@pytest.mark.parametrize("plant", ["symlink", "fifo", "directory", "another owner", "other bytes"])
def test_anything_but_our_own_regular_file_saying_clean_means_wait(lockdir, tmp_path, plant):
    target = lockdir / entry_name(os.geteuid(), LOCK)
    if plant == "symlink":
        (tmp_path / "elsewhere").write_bytes(CLEAN)
        target.symlink_to(tmp_path / "elsewhere")
    elif plant == "fifo":
        os.mkfifo(target)
    elif plant == "directory":
        target.mkdir()
    elif plant == "another owner":
        if os.geteuid() != 0:
            pytest.skip("needs root to make a file of another owner")
        target.write_bytes(CLEAN)
        os.chown(target, 65534, 65534)
    else:
        target.write_bytes(b"clean\nand more")
    assert Handover(str(lockdir)).clean(RELATED) == set()


def test_a_clean_entry_that_cannot_be_replaced_ends_the_run(lockdir):
    """Taking the lock must make our clean entry stale; if it cannot, a later run would skip a needed wait."""
    _clean_run(lockdir)
    h = Handover(str(lockdir))
    h._fd()
    os.chmod(lockdir, 0o500)  # no writes (root ignores modes: then use a name that cannot be created)
    try:
        if os.geteuid() == 0:
            (lockdir / f"{entry_name(os.geteuid(), LOCK)}=run3").mkdir()
        with pytest.raises(HandoverError, match="a later run could skip waiting"):
            h.taken([LOCK], "run3")
    finally:
        os.chmod(lockdir, 0o700)
    assert Handover(str(lockdir)).clean(RELATED) == {LOCK}, "the clean entry is still there (the run ended)"
