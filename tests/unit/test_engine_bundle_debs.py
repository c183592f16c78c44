"""kunlun_fleet/sim/bundle.py, debs/: the engine's offline .debs, worked out against a minimal
Debian host's dpkg status, downloaded once into the sim cache and copied into the bundle."""

import os

import pytest
import yaml

from kunlun_fleet.sim import bundle

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture
def fake_download(tmp_path, monkeypatch):
    """The cache under tmp_path; download_debs writes the files it was asked for and counts."""
    monkeypatch.setattr(bundle, "CACHE_DIR", str(tmp_path / "cache"))
    calls = []

    def download(packages, dest, log=print):
        calls.append(list(packages))
        os.makedirs(dest, exist_ok=True)
        for name in packages + ["tini", "runc"]:
            with open(os.path.join(dest, "%s_1.0-1_amd64.deb" % name), "wb") as fh:
                fh.write(name.encode())
        return sorted(os.listdir(dest))

    monkeypatch.setattr(bundle, "download_debs", download)
    return calls


def test_the_packages_are_the_engine_roles(fake_download):
    roles = yaml.safe_load(open(os.path.join(ROOT, "roles/engine/defaults/main.yml")))
    assert bundle.engine_bundle_packages() == roles["engine_bundle_packages"] == ["docker.io"]


def test_a_rebuild_does_not_download_again(fake_download, tmp_path):
    out = tmp_path / "bundle"
    first = bundle.fetch_debs(str(out), log=lambda *_: None)
    assert first == ["debs/docker.io_1.0-1_amd64.deb", "debs/runc_1.0-1_amd64.deb", "debs/tini_1.0-1_amd64.deb"]
    assert (out / "debs" / "docker.io_1.0-1_amd64.deb").read_bytes() == b"docker.io"
    again = bundle.fetch_debs(str(tmp_path / "other"), log=lambda *_: None)
    assert again == first and fake_download == [["docker.io"]]
    # another package list is another closure, downloaded once
    bundle.fetch_debs(str(out), log=lambda *_: None, packages=["docker.io", "git"])
    bundle.fetch_debs(str(out), log=lambda *_: None, packages=["docker.io", "git"])
    assert fake_download == [["docker.io"], ["docker.io", "git"]]


def test_an_interrupted_download_is_not_taken_for_a_complete_one(fake_download, tmp_path, monkeypatch):
    def broken(packages, dest, log=print):
        os.makedirs(dest, exist_ok=True)
        open(os.path.join(dest, "docker.io_1.0-1_amd64.deb"), "wb").close()
        raise RuntimeError("mirror went away")

    good = bundle.download_debs
    monkeypatch.setattr(bundle, "download_debs", broken)
    with pytest.raises(RuntimeError, match="mirror went away"):
        bundle.fetch_debs(str(tmp_path / "b"), log=lambda *_: None)
    assert not os.path.exists(bundle.debs_cache())
    monkeypatch.setattr(bundle, "download_debs", good)
    assert len(bundle.fetch_debs(str(tmp_path / "b"), log=lambda *_: None)) == 3


def test_the_cache_key_follows_the_packages_and_the_sources(monkeypatch):
    key = bundle.debs_key(["docker.io"])
    assert bundle.debs_key(["docker.io"]) == key and bundle.debs_key(["docker.io", "git"]) != key
    monkeypatch.setattr(bundle, "debian_sources", lambda: [("http://mirror.example/debian", "bookworm")])
    assert bundle.debs_key(["docker.io"]) != key


def test_the_minbase_status_marks_every_package_installed():
    stanzas = (
        "Package: libc6\nVersion: 2.36-9+deb12u10\nArchitecture: amd64\nDepends: libgcc-s1\n\n"
        "Package: apt\nVersion: 2.6.1\nDescription: commandline package manager\n long text\n\n"
    )
    status = bundle.status_for(stanzas)
    assert status == (
        "Package: libc6\nStatus: install ok installed\nVersion: 2.36-9+deb12u10\nArchitecture: amd64\n"
        "Depends: libgcc-s1\n\nPackage: apt\nStatus: install ok installed\nVersion: 2.6.1\n"
        "Description: commandline package manager\n long text\n"
    )
    with pytest.raises(ValueError):
        bundle.status_for("Version: 1\n")


def test_the_bundle_sources_hash_covers_the_packages(monkeypatch):
    before = bundle.sources_hash()
    monkeypatch.setattr(bundle, "engine_bundle_packages", lambda path=None: ["docker.io", "git"])
    assert bundle.sources_hash() != before
