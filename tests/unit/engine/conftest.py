"""Fixtures for the engine tests: a private lock directory, one per mechanism where it matters."""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))
import engine_helpers  # noqa: E402,F401 - puts lib/ on sys.path

MECHANISMS = ["ofd", "flock", "record"]


@pytest.fixture
def lockdir(tmp_path):
    d = tmp_path / "locks"
    d.mkdir(mode=0o700)
    return str(d)


@pytest.fixture(params=MECHANISMS)
def mechdir(request, tmp_path):
    """A lock directory bound to one mechanism (the directory's marker fixes it for every process)."""
    import hostlock

    d = tmp_path / request.param
    d.mkdir(mode=0o700)
    hostlock.Lock("init", directory=str(d), mechanism=request.param).close()
    return str(d)
