"""The base image's archive read as the image role needs it (module_utils/artifact_identity.py,
read_image): each image's ID next to its tags, in both layouts of `docker save` (Docker before
25: `<id>.json`; 25 and later, OCI: `blobs/sha256/<id>`), and the role's pick of the base
image's ID (roles/image/tasks/validate.yml), which decides whether the builder loads the
archive over an older image of the same name (roles/image/tasks/build.yml)."""

import io
import json
import tarfile
from pathlib import Path

import pytest
import yaml
from ansible.module_utils import artifact_identity
from ansible.template import Templar, trust_as_template

ROOT = Path(__file__).resolve().parents[2]

BASE = "docker.int.aoripus.com/vllm-kunlun-exp:base"
OLD, NEW = "a" * 64, "b" * 64


def docker_save(path, entries):
    raw = json.dumps(entries).encode()
    with tarfile.open(path, "w") as tar:
        for name, data in (("blobs/sha256/" + NEW, b"{}"), (OLD + ".json", b"{}"), ("manifest.json", raw)):
            info = tarfile.TarInfo(name)
            info.size, info.mtime = len(data), 0
            tar.addfile(info, io.BytesIO(data))


@pytest.mark.parametrize(
    "config, expected", [(OLD + ".json", "sha256:" + OLD), ("blobs/sha256/" + NEW, "sha256:" + NEW)]
)
def test_each_image_s_id_from_either_layout(tmp_path, config, expected):
    path = tmp_path / "base.tar"
    docker_save(path, [{"Config": config, "RepoTags": [BASE], "Layers": []}, {"Config": "x", "RepoTags": None}])
    found = artifact_identity.read_image(str(path))
    assert found["repo_tags"] == [BASE]
    assert found["images"] == [{"id": expected, "repo_tags": [BASE]}, {"id": None, "repo_tags": []}]


def test_the_role_picks_the_id_of_the_archive_s_base_image():
    tasks = yaml.safe_load((ROOT / "roles/image/tasks/validate.yml").read_text())
    (task,) = [t for t in tasks if "image_base_archive_id" in t.get("ansible.builtin.set_fact", {})]
    expr = task["ansible.builtin.set_fact"]["image_base_archive_id"]
    images = [{"id": "sha256:" + OLD, "repo_tags": ["other:tag"]}, {"id": "sha256:" + NEW, "repo_tags": [BASE]}]
    for identities, expected in (
        ({"base_image": {"repo_tags": [BASE], "images": images}}, "sha256:" + NEW),
        ({"base_image": {"repo_tags": [BASE]}}, ""),  # read by an older reader: no IDs, the tag alone decides
        ({}, ""),  # the base image from a registry: no archive
    ):
        templar = Templar(variables={"image_bundle": {"identities": identities}, "kunlun_stack_base_image": BASE})
        assert templar.template(trust_as_template(expr)).strip() == expected
