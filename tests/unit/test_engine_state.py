"""library/engine_state.py: daemon.json read (absent, unreadable, invalid, not an object told
apart), the merged file the engine role writes, the data-root in use and its storage drivers."""

import json
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "library"))

import engine_state  # noqa: E402

SETTINGS = {
    "storage-driver": "overlay2",
    "log-driver": "json-file",
    "log-opts": {"max-size": "100m", "max-file": "5"},
    "live-restore": True,
    "exec-opts": ["native.cgroupdriver=systemd"],
}


class FakeModule:
    """get_bin_path and run_command from tables; fail_json raises."""

    def __init__(self, bins=None, answers=None):
        self.bins, self.answers, self.calls = bins or {}, answers or {}, []

    def get_bin_path(self, name, required=False):
        return self.bins.get(name)

    def run_command(self, argv, environ_update=None):
        self.calls.append(argv)
        return self.answers.get(tuple(argv), (1, "", "not found"))

    def fail_json(self, **kw):
        raise Failed(kw["msg"])


class Failed(Exception):
    pass


def write(tmp_path, text, name="daemon.json"):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


# ---------------------------------------------------------------- reading the file
def test_absent_is_fine(tmp_path):
    found = engine_state.read_daemon_json(str(tmp_path / "daemon.json"))
    assert found == {"path": str(tmp_path / "daemon.json"), "state": "absent", "error": "", "content": {}}


def test_present(tmp_path):
    found = engine_state.read_daemon_json(write(tmp_path, '{"labels": ["site=lab-7"]}'))
    assert found["state"] == "present" and found["content"] == {"labels": ["site=lab-7"]}


def test_a_directory_is_unreadable_not_absent(tmp_path):
    (tmp_path / "daemon.json").mkdir()
    found = engine_state.read_daemon_json(str(tmp_path / "daemon.json"))
    assert found["state"] == "unreadable" and found["content"] == {}
    assert found["error"] == "unreadable (a directory)"


def test_a_dangling_link_is_unreadable_not_absent(tmp_path):
    os.symlink(str(tmp_path / "gone.json"), str(tmp_path / "daemon.json"))
    found = engine_state.read_daemon_json(str(tmp_path / "daemon.json"))
    assert found["state"] == "unreadable"
    assert "symbolic link to %s, which does not exist" % (tmp_path / "gone.json") in found["error"]


def test_an_io_error_is_unreadable(tmp_path, monkeypatch):
    path = write(tmp_path, "{}")

    def broken(*args, **kw):
        raise IOError(5, "Input/output error")

    monkeypatch.setattr(engine_state, "open", broken, raising=False)
    found = engine_state.read_daemon_json(path)
    assert found["state"] == "unreadable" and found["error"] == "unreadable (Input/output error)"


def test_invalid_json(tmp_path):
    found = engine_state.read_daemon_json(write(tmp_path, '{\n  "debug": true,\n'))
    assert found["state"] == "invalid" and found["error"].startswith("not valid JSON: ")
    (tmp_path / "latin1.json").write_bytes(b'{"labels": ["caf\xe9"]}')
    found = engine_state.read_daemon_json(str(tmp_path / "latin1.json"))
    assert found["state"] == "invalid" and "not UTF-8" in found["error"]


def test_not_an_object(tmp_path):
    found = engine_state.read_daemon_json(write(tmp_path, "[1, 2]"))
    assert found == {
        "path": found["path"],
        "state": "not_object",
        "content": {},
        "error": "valid JSON but not an object (a mapping of keys)",
    }


# ---------------------------------------------------------------- the merge
def test_merge_keeps_the_operators_keys():
    current = {
        "labels": ["site=lab-7"],
        "max-concurrent-downloads": 7,
        "log-opts": {"labels": "site"},
        "exec-opts": ["native.cgroupdriver=cgroupfs", "native.umask=normal"],
        "graph": "/srv/docker",
        "storage-driver": "vfs",
    }
    merged = engine_state.merge(current, SETTINGS, {"registry-mirrors": ["https://mirror.example"]}, "/home/docker")
    assert merged == {
        "labels": ["site=lab-7"],
        "max-concurrent-downloads": 7,
        # mappings merged key by key: the operator's log-opts key stays beside the project's
        "log-opts": {"labels": "site", "max-size": "100m", "max-file": "5"},
        # the operator's other exec-opts stay; the cgroup driver is the project's
        "exec-opts": ["native.umask=normal", "native.cgroupdriver=systemd"],
        "storage-driver": "overlay2",
        "log-driver": "json-file",
        "live-restore": True,
        "registry-mirrors": ["https://mirror.example"],
        # graph is the old name of data-root: dropped, data-root set
        "data-root": "/home/docker",
    }


def test_extra_wins_over_the_file_and_the_settings():
    merged = engine_state.merge(
        {"storage-driver": "vfs", "log-opts": {"max-size": "1g", "mode": "non-blocking"}},
        SETTINGS,
        {"storage-driver": "vfs", "log-opts": {"max-file": "9"}},
        "/home/docker",
    )
    assert merged["storage-driver"] == "vfs"
    assert merged["log-opts"] == {"max-size": "100m", "mode": "non-blocking", "max-file": "9"}


def test_exec_opts_and_data_root_are_the_projects_even_against_extra():
    merged = engine_state.merge({}, SETTINGS, {"exec-opts": ["x"], "data-root": "/elsewhere"}, "/home/docker")
    assert merged["exec-opts"] == ["native.cgroupdriver=systemd"] and merged["data-root"] == "/home/docker"


def test_merge_of_nothing_is_the_settings():
    merged = engine_state.merge({}, SETTINGS, {}, "/home/docker")
    assert merged == dict(SETTINGS, **{"data-root": "/home/docker"})


def test_merge_does_not_change_its_inputs():
    current = {"log-opts": {"labels": "site"}}
    settings = json.loads(json.dumps(SETTINGS))
    engine_state.merge(current, settings, {}, "/home/docker")
    assert current == {"log-opts": {"labels": "site"}} and settings == SETTINGS


@pytest.mark.parametrize(
    "current, root",
    [
        ({}, "/var/lib/docker"),
        ({"graph": "/srv/docker"}, "/srv/docker"),
        ({"data-root": "/data/docker", "graph": "/srv/docker"}, "/data/docker"),
    ],
)
def test_old_root(current, root):
    assert engine_state.old_root_of(current) == root


# ---------------------------------------------------------------- the data-root in use
def seed_driver(root, driver, sub="imagedb/content/sha256"):
    path = root / "image" / driver / sub
    path.mkdir(parents=True)
    (path / "abc").write_text("x")


def test_drivers_on_disk(tmp_path):
    seed_driver(tmp_path, "vfs")
    seed_driver(tmp_path, "overlay2", "layerdb/mounts")
    (tmp_path / "image" / "btrfs" / "imagedb" / "content" / "sha256").mkdir(parents=True)  # empty: unused
    assert engine_state.drivers_on_disk(str(tmp_path)) == ["overlay2", "vfs"]
    assert engine_state.drivers_on_disk(str(tmp_path / "absent")) == []


def info_module(info, rc=0):
    argv = ("/usr/bin/timeout", "30", "/usr/bin/docker", "info", "--format", "{{json .}}")
    return FakeModule({"docker": "/usr/bin/docker", "timeout": "/usr/bin/timeout"}, {argv: (rc, json.dumps(info), "")})


def test_read_sees_the_running_engine_on_the_old_root(tmp_path):
    old = tmp_path / "var-lib-docker"
    seed_driver(old, "vfs")
    path = write(tmp_path, json.dumps({"data-root": str(old)}))
    module = info_module({"Driver": "vfs", "DockerRootDir": str(old), "Images": 1, "Containers": 0})
    found = engine_state.read(module, path, "/home/docker", SETTINGS, {})
    assert found["old_root"] == str(old) and found["old_root_content"] is True
    assert found["drivers"] == {
        "read": True,
        "on_disk": ["vfs"],
        "running": "vfs",
        "running_root": str(old),
        "running_images": 1,
        "running_containers": 0,
    }
    assert found["old_root_drivers"] == ["vfs"]
    assert found["merged"]["data-root"] == "/home/docker"


def test_a_running_engine_elsewhere_or_empty_does_not_count(tmp_path):
    old = tmp_path / "old"
    old.mkdir()
    path = write(tmp_path, json.dumps({"data-root": str(old)}))
    for info in (
        {"Driver": "vfs", "DockerRootDir": "/other", "Images": 3, "Containers": 0},
        {"Driver": "vfs", "DockerRootDir": str(old), "Images": 0, "Containers": 0},
    ):
        found = engine_state.read(info_module(info), path, "/home/docker", SETTINGS, {})
        assert found["drivers"]["running"] == "vfs" and found["old_root_drivers"] == []
        assert found["old_root_content"] is False


def test_no_docker_no_engine(tmp_path):
    found = engine_state.read(FakeModule(), str(tmp_path / "daemon.json"), "/home/docker", SETTINGS, {})
    assert found["drivers"]["read"] and found["drivers"]["running"] == "" and found["old_root_drivers"] == []
    assert found["old_root"] == "/var/lib/docker"


def test_an_engine_that_does_not_answer(tmp_path):
    found = engine_state.read(info_module({}, rc=1), str(tmp_path / "d.json"), "/home/docker", SETTINGS, {})
    assert found["drivers"]["running"] == ""


def test_no_storage_driver_no_driver_reading(tmp_path):
    settings = dict((k, v) for k, v in SETTINGS.items() if k != "storage-driver")
    module = info_module({"Driver": "vfs"})
    found = engine_state.read(module, str(tmp_path / "d.json"), "/home/docker", settings, {})
    assert found["drivers"]["read"] is False and module.calls == []


def test_the_same_root_is_no_carry_over(tmp_path):
    root = tmp_path / "docker"
    seed_driver(root, "overlay2")
    path = write(tmp_path, json.dumps({"data-root": str(root) + "/"}))
    found = engine_state.read(FakeModule(), path, str(root), SETTINGS, {})
    assert found["old_root_content"] is False


def test_an_unusable_file_merges_nothing(tmp_path):
    (tmp_path / "daemon.json").mkdir()
    found = engine_state.read(FakeModule(), str(tmp_path / "daemon.json"), "/home/docker", SETTINGS, {})
    assert found["daemon_json"]["state"] == "unreadable" and found["merged"] == {}
    assert found["old_root_content"] is False and found["drivers"]["read"] is False


def test_an_old_root_that_cannot_be_listed_is_an_error(tmp_path):
    old = tmp_path / "old"
    old.write_text("a file, not a directory")
    path = write(tmp_path, json.dumps({"data-root": str(old)}))
    with pytest.raises(Failed, match="data-root in use %s cannot be read" % old):
        engine_state.read(FakeModule(), path, "/home/docker", SETTINGS, {})
