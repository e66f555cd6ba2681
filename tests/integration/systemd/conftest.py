"""Fixtures for the tests against a real systemd (helpers in systemd_support.py)."""

from __future__ import annotations

import pytest
from systemd_support import collections_dir


@pytest.fixture(scope="module")
def ansible_dirs(tmp_path_factory):
    """A directory for ansible-playbook runs whose collections path has this checkout as hostlock.core."""
    return collections_dir(tmp_path_factory.mktemp("ansible"))
