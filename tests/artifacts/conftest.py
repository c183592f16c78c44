"""Fixtures for the stand-in artifact tests."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from standin_helpers import load_pins  # noqa: E402


@pytest.fixture(scope="session")
def pins():
    return load_pins()
