"""Fixtures for the engine tests; they live in tests/engine_helpers.py, shared with the integration tests."""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))
import engine_helpers  # noqa: E402 - also puts lib/ on sys.path

lockdir = engine_helpers.lockdir
mechdir = engine_helpers.mechdir
