"""Fixtures of the image stage's tests (helpers in image_helpers.py)."""

import pytest

from image_helpers import Site


@pytest.fixture
def site(tmp_path):
    return Site(tmp_path)
