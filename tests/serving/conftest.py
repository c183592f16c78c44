"""Fixtures for the serving tests (defined in serving_helpers.py, shared with the tests)."""

from serving_helpers import model_dir, pins, standin  # noqa: F401 (pytest fixtures)
