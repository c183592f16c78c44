"""Which Python the stand-in base image gets (kunlun_fleet/sim/base_python.py): the vendor's
CPython 3.10 where this machine has one, else Debian's python3.11, with what differs."""

import os

import pytest

from kunlun_fleet.sim import base_python
from kunlun_fleet.sim.config import SimError


@pytest.fixture
def no_pyenv(monkeypatch, tmp_path):
    """A machine without pyenv's 3.10 and without KUNLUN_SIM_PYTHON310_PREFIX."""
    monkeypatch.setattr(base_python, "PYENV_GLOB", str(tmp_path / "none" / "3.10*"))
    monkeypatch.delenv("KUNLUN_SIM_PYTHON310_PREFIX", raising=False)
    monkeypatch.delenv("KUNLUN_SIM_BASE_PYTHON", raising=False)


def fake_prefix(tmp_path):
    prefix = tmp_path / "py310"
    (prefix / "bin").mkdir(parents=True)
    (prefix / "bin" / "python3.10").write_text("#!/bin/sh\n")
    os.chmod(prefix / "bin" / "python3.10", 0o755)
    return prefix


def test_no_cpython310_falls_back_to_debian_and_says_what_differs(no_pyenv):
    profile = base_python.resolve()
    assert (profile["kind"], profile["minor"], profile["prefix"]) == ("debian", "3.11", None)
    assert base_python.differences(profile) == {
        "minor": ("3.10", "3.11"),
        "wheel_tag": ("cp310-cp310-linux_x86_64", "cp311-cp311-linux_x86_64"),
        "proof_python_version": ("", "3.11"),
    }


def test_a_cpython310_prefix_is_preferred_and_differs_in_nothing(no_pyenv, monkeypatch, tmp_path):
    monkeypatch.setenv("KUNLUN_SIM_PYTHON310_PREFIX", str(fake_prefix(tmp_path)))
    profile = base_python.resolve()
    assert (profile["kind"], profile["prefix"]) == ("cpython310", str(tmp_path / "py310"))
    assert base_python.differences(profile) == {}


def test_debian_forced_over_a_cpython310(no_pyenv, monkeypatch, tmp_path):
    monkeypatch.setenv("KUNLUN_SIM_PYTHON310_PREFIX", str(fake_prefix(tmp_path)))
    monkeypatch.setenv("KUNLUN_SIM_BASE_PYTHON", "debian")
    assert base_python.resolve()["kind"] == "debian"


def test_cpython310_forced_without_one_names_the_fix(no_pyenv, monkeypatch):
    monkeypatch.setenv("KUNLUN_SIM_BASE_PYTHON", "cpython310")
    with pytest.raises(SimError, match="pyenv install 3.10"):
        base_python.resolve()


def test_an_unknown_choice_names_the_known_ones(no_pyenv, monkeypatch):
    monkeypatch.setenv("KUNLUN_SIM_BASE_PYTHON", "ubuntu")
    with pytest.raises(SimError, match="KUNLUN_SIM_BASE_PYTHON=ubuntu is not known. Fix: cpython310, debian"):
        base_python.resolve()
