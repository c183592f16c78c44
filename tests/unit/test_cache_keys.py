"""The test fleet's cache (docs/testing.md, "Caches"): each artifact is kept under a key that
hashes its inputs, so an unchanged input keeps the key (a fresh clone reuses the artifact)
and a changed one makes a new key (the artifact is rebuilt). The bundle's own keys (its
sources hash, the .debs' closure) are tested in test_engine_bundle_debs.py."""

import os
import shutil
import subprocess
import sys

import pytest

from kunlun_fleet import ee
from kunlun_fleet.sim import config, image

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_the_cache_directory_is_kunlun_fleet_cache_else_the_sims(tmp_path):
    def cache_dir(**env):
        code = "from kunlun_fleet.sim import bundle, config; print(config.CACHE_DIR, bundle.CACHE_DIR)"
        clean = {k: v for k, v in os.environ.items() if k not in ("KUNLUN_FLEET_CACHE", "KUNLUN_SIM_HOME")}
        out = subprocess.run([sys.executable, "-c", code], env=dict(clean, **env), capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        return out.stdout.split()

    assert cache_dir(KUNLUN_FLEET_CACHE=str(tmp_path / "c")) == [str(tmp_path / "c")] * 2
    assert cache_dir(KUNLUN_SIM_HOME=str(tmp_path / "home")) == [str(tmp_path / "home" / "cache")] * 2


# --------------------------------------------------------------------------- the sim-host image
def test_rootfs_key_follows_the_package_list_only(monkeypatch):
    key = image.rootfs_key()
    assert image.rootfs_key() == key
    monkeypatch.setattr(image, "PACKAGES", image.PACKAGES + ["jq"])
    assert image.rootfs_key() != key
    monkeypatch.setattr(image, "PACKAGES", list(reversed(image.PACKAGES)))
    assert image.rootfs_key() == image.rootfs_key()


@pytest.fixture
def kit(tmp_path, monkeypatch):
    """A kit tree of its own under tmp_path, which image_key hashes."""
    root = tmp_path / "kit"
    shutil.copytree(config.KIT_ROOTFS, root, symlinks=True, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    monkeypatch.setattr(image, "KIT_ROOTFS", str(root))
    return root


def test_image_key_follows_the_kit_the_kernel_and_the_rootfs(kit, monkeypatch):
    key = image.image_key()
    assert image.image_key() == key, "an unchanged input changed the key"
    # A kit file's content (not its time stamp) is an input.
    some = next(p for p in sorted(kit.rglob("*")) if p.is_file() and not p.is_symlink())
    os.utime(some, (1, 1))
    assert image.image_key() == key
    data = some.read_bytes()
    some.write_bytes(data + b"\n")
    assert image.image_key() != key
    some.write_bytes(data)
    assert image.image_key() == key
    monkeypatch.setattr(image, "kernel_release", lambda: "6.1.0-99-amd64")
    assert image.image_key() != key
    monkeypatch.undo()
    monkeypatch.setattr(image, "KIT_ROOTFS", str(kit))
    monkeypatch.setattr(image, "rootfs_key", lambda: "0" * 16)
    assert image.image_key() != key


@pytest.fixture
def fake_debootstrap(tmp_path, monkeypatch):
    """The cache and the scratch under tmp_path; `run` makes the root debootstrap would and
    writes the tarball tar would, and counts the debootstraps."""
    monkeypatch.setattr(image, "CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(image, "BUILD_DIR", str(tmp_path / "build"))
    calls = []

    def run(cmd, **_):
        if cmd[0] == "debootstrap":
            calls.append(cmd)
            os.makedirs(os.path.join(cmd[-2], "var/log"))
        elif cmd[0] == "tar":
            with open(cmd[cmd.index("-cf") + 1], "w") as fh:
                fh.write("root")

    monkeypatch.setattr(image, "run", run)
    monkeypatch.setattr(image, "log", lambda *_: None)
    return calls


def test_the_debootstrap_root_is_made_once_per_key_in_the_cache(fake_debootstrap, tmp_path, monkeypatch):
    first = image._debootstrap_tarball()
    assert first == str(tmp_path / "cache" / "debootstrap" / ("debootstrap-bookworm-%s.tar" % image.rootfs_key()))
    assert os.path.exists(first) and len(fake_debootstrap) == 1
    assert image._debootstrap_tarball() == first and len(fake_debootstrap) == 1, "a warm cache debootstrapped again"
    monkeypatch.setattr(image, "PACKAGES", image.PACKAGES + ["jq"])
    assert image._debootstrap_tarball() != first and len(fake_debootstrap) == 2
    assert not os.listdir(tmp_path / "build"), "the debootstrap root was left behind"


# --------------------------------------------------------------------------- the EE's wheelhouse
LINES = ["ansible-core==2.19.4", "mitogen==0.3.31"]


def test_wheelhouse_key_follows_the_pins_and_the_interpreter():
    key = ee.wheelhouse_key(LINES, "3.11", "x86_64")
    assert ee.wheelhouse_key(list(reversed(LINES)), "3.11", "x86_64") == key
    assert ee.wheelhouse_key(LINES[:1] + ["mitogen==0.3.32"], "3.11", "x86_64") != key
    assert ee.wheelhouse_key(LINES, "3.12", "x86_64") != key
    assert ee.wheelhouse_key(LINES, "3.11", "aarch64") != key
    assert ee.wheelhouse_key() == ee.wheelhouse_key(), "the EE's own inputs gave two keys"


@pytest.fixture
def fake_pip(tmp_path, monkeypatch):
    """The cache and the checkout's wheelhouse under tmp_path; `pip download` writes one wheel
    per requirement line and counts the downloads."""
    (tmp_path / "cache").mkdir()
    monkeypatch.setattr(config, "CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(ee, "CACHE", str(tmp_path / "clone"))
    monkeypatch.setattr(ee, "WHEELS", str(tmp_path / "clone" / "wheels"))
    monkeypatch.setattr(ee, "requirement_lines", lambda: list(LINES))
    calls = []

    def run(cmd, env, what, timeout=1800):
        calls.append(cmd)
        dest = cmd[cmd.index("-d") + 1]
        for line in open(cmd[cmd.index("-r") + 1]).read().split():
            name, version = line.split("==")
            open(os.path.join(dest, "%s-%s-py3-none-any.whl" % (name.replace("-", "_"), version)), "w").close()
        return ""

    monkeypatch.setattr(ee, "_run", run)
    return calls


def test_the_wheelhouse_is_downloaded_once_per_key_and_linked_into_the_checkout(fake_pip, tmp_path, monkeypatch):
    wheels = ee.wheelhouse()
    assert sorted(os.listdir(wheels)) == ["ansible_core-2.19.4-py3-none-any.whl", "mitogen-0.3.31-py3-none-any.whl"]
    cached = tmp_path / "cache" / "ee-wheels" / ee.wheelhouse_key(LINES)
    assert os.path.samefile(
        os.path.join(wheels, "mitogen-0.3.31-py3-none-any.whl"), cached / "mitogen-0.3.31-py3-none-any.whl"
    )
    # A fresh checkout: the same pins take the cached set, without pip.
    shutil.rmtree(wheels)
    assert sorted(os.listdir(ee.wheelhouse())) == sorted(os.listdir(wheels)) and len(fake_pip) == 1
    # A changed pin: a new download, and the checkout's wheelhouse holds the new set only.
    monkeypatch.setattr(ee, "requirement_lines", lambda: LINES[:1] + ["mitogen==0.3.32"])
    assert sorted(os.listdir(ee.wheelhouse())) == [
        "ansible_core-2.19.4-py3-none-any.whl",
        "mitogen-0.3.32-py3-none-any.whl",
    ]
    assert len(fake_pip) == 2


def test_without_the_shared_cache_the_wheelhouse_is_kept_in_the_checkout(fake_pip, tmp_path, monkeypatch):
    monkeypatch.setattr(config, "CACHE_DIR", str(tmp_path / "no-such-cache"))
    assert ee.wheel_cache() == str(tmp_path / "clone" / "ee-wheels")
    ee.wheelhouse()
    assert os.listdir(tmp_path / "clone" / "ee-wheels") and not (tmp_path / "no-such-cache").exists()


def test_an_ee_image_of_the_same_inputs_needs_no_wheelhouse(monkeypatch):
    """The image's tag is its key: when the engine has it, nothing is downloaded or built."""
    ran = []
    monkeypatch.setattr(ee, "docker_env", lambda: {})
    monkeypatch.setattr(ee, "base_image", lambda rootfs, env: "kunlun-fleet/ee-base:x")
    monkeypatch.setattr(ee, "_image_id", lambda ref, env: "sha256:" + ref)
    monkeypatch.setattr(ee, "_image_exists", lambda ref, env: True)
    monkeypatch.setattr(ee, "wheelhouse", lambda: ran.append("wheelhouse"))
    monkeypatch.setattr(ee, "_run", lambda cmd, env, what, timeout=1800: ran.append(cmd[:2]))
    monkeypatch.setattr(ee, "_locked", __import__("contextlib").nullcontext)
    tag = ee.build(log=lambda *_: None)
    assert tag == "kunlun-fleet/ee:" + ee.image_key("sha256:kunlun-fleet/ee-base:x")
    assert ran == [["docker", "tag"]]


# --------------------------------------------------------------------------- the Makefile's venvs
def make_keys(tmp_path, **files):
    """(bench key, engine key) the Makefile gives in a checkout of these requirement files."""
    for name in ("Makefile", "requirements-bench.txt", "requirements-engine.txt"):
        target = tmp_path / name
        if not target.exists():
            shutil.copy(os.path.join(ROOT, name), target)
    for name, text in files.items():
        (tmp_path / name.replace("_", "-").replace("-txt", ".txt")).write_text(text)
    env = dict(os.environ, KUNLUN_FLEET_CACHE=str(tmp_path / "cache"))
    out = subprocess.run(
        ["make", "-s", "--no-print-directory", "-C", str(tmp_path), "-p", "-n", "-q", "--", "no-such-target"],
        env=env,
        capture_output=True,
        text=True,
    ).stdout
    keys = dict(
        line.split(" := ", 1) for line in out.splitlines() if line.startswith(("BENCH_VENV_KEY", "ENGINE_VENV_KEY"))
    )
    return keys["BENCH_VENV_KEY"], keys["ENGINE_VENV_KEY"]


def test_a_venvs_key_follows_its_requirements_file(tmp_path):
    bench, engine = make_keys(tmp_path)
    assert bench.startswith("bench-") and engine.startswith("real-engine-") and len(bench) == len("bench-") + 16
    assert make_keys(tmp_path) == (bench, engine), "an unchanged checkout gave new keys"
    with open(tmp_path / "requirements-bench.txt", "a") as fh:
        fh.write("# a comment is an input too\n")
    changed = make_keys(tmp_path)
    assert changed[0] != bench and changed[1] == engine
