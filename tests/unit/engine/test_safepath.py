"""_safepath's walk reaches the inode the kernel's walk reaches whenever every symlink is trusted (ours, in
directories nobody else can change): `..` after links, chains, absolute and relative targets, loops."""

from __future__ import annotations

import errno
import itertools
import os

import pytest

from hostlock.host import safepath as _safepath


@pytest.fixture
def tree(tmp_path, monkeypatch):
    (tmp_path / "a" / "b" / "c").mkdir(parents=True)
    (tmp_path / "a" / "b" / "c" / "f").write_text("x")
    (tmp_path / "z").mkdir()
    os.symlink("a/b", tmp_path / "rel")              # relative, to a directory
    os.symlink(str(tmp_path / "a"), tmp_path / "abs")  # absolute
    os.symlink("../rel", tmp_path / "z" / "up")       # a chain through .. and another link
    os.symlink("c/f", tmp_path / "a" / "b" / "tof")    # to a file
    os.symlink("loop2", tmp_path / "loop1")
    os.symlink("loop1", tmp_path / "loop2")
    monkeypatch.chdir(tmp_path)
    return tmp_path


PARTS = ["a", "b", "c", "f", "..", ".", "rel", "abs", "z", "up", "tof"]


def _kernel(path):
    try:
        st = os.stat(path)
        return (st.st_dev, st.st_ino)
    except OSError as e:
        return e.errno


def _ours(path):
    try:
        st = _safepath.stat_path(path)
        return (st.st_dev, st.st_ino)
    except OSError as e:
        return e.errno


def test_the_walk_reaches_what_the_kernel_reaches(tree):
    for n in (1, 2, 3):
        for parts in itertools.product(PARTS, repeat=n):
            rel = "/".join(parts)
            for path in (rel, str(tree / rel)):
                assert _ours(path) == _kernel(path), path


def test_a_symlink_loop_is_eloop(tree):
    assert _ours("loop1/x") == errno.ELOOP and _ours("loop1") == errno.ELOOP


def test_follow_last_false_leaves_a_last_link_to_the_caller(tree):
    with pytest.raises(OSError) as e:
        _safepath.open_path("rel", os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, follow_last=False)
    assert e.value.errno in (errno.ELOOP, errno.ENOTDIR) and not isinstance(e.value, _safepath.UnsafePath)
