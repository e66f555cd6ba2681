"""Fixtures for the engine tests; they live in tests/engine_helpers.py, shared with the integration tests."""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))
from engine_helpers import lockdir, mechdir  # noqa: E402,F401 - fixtures (and lib/ on sys.path)
