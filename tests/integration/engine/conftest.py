"""Fixtures for the engine tests; they live in tests/engine_helpers.py, shared with the integration tests."""

from __future__ import annotations

import engine_helpers  # tests/ is on the import path (pytest.ini)

lockdir = engine_helpers.lockdir
mechdir = engine_helpers.mechdir
shared_group = engine_helpers.shared_group
