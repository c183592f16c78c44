"""library/model_verify.py on a real (small) model directory."""

import json
from unittest import mock

import pytest

from ansible.module_utils import basic
from ansible.module_utils.testing import patch_module_args

import model_verify
from kunlun_fleet.sim.artifacts.model import build_model_dir, sha256_manifest

DIR = "Qwen3.8-27B-W8A8-INT8-Dynamic"


@pytest.fixture()
def model(tmp_path, stack_defaults):
    d = tmp_path / "models" / DIR
    build_model_dir(str(d), stack_defaults)
    return d, sha256_manifest(str(d))


def params(path, manifest=None, expected=None, **over):
    p = {
        "path": str(path),
        "directory": DIR,
        "manifest": manifest,
        "expected": expected,
        "cache_file": str(path.parent / (".%s.sums.json" % path.name)),
        "full": False,
        "fail_on_problems": True,
    }
    p.update(over)
    return p


def test_sound_model_then_cache(model, stack_defaults):
    d, manifest = model
    expected = stack_defaults["kunlun_stack_model"]
    first = model_verify.verify(params(d, manifest, expected))
    assert first["ok"], first["problems"]
    assert first["files"] == 7 and first["hashed"] == 7 and first["to_copy"] == [] and first["extra"] == []
    again = model_verify.verify(params(d, manifest, expected))
    assert again["ok"] and again["hashed"] == 0  # sizes and times unchanged: from the cache
    full = model_verify.verify(params(d, manifest, expected, full=True))
    assert full["ok"] and full["hashed"] == 7


def test_damaged_missing_and_stray_files(model, stack_defaults):
    d, manifest = model
    model_verify.verify(params(d, manifest))  # fills the cache
    shard = d / "model-00002-of-00002.safetensors"
    shard.write_bytes(shard.read_bytes()[:-1] + b"X")  # same size; new mtime
    (d / "tokenizer.json").unlink()
    (d / "model-00003-of-00003.safetensors").write_bytes(b"old shard")
    (d / "README.md").write_text("notes")
    r = model_verify.verify(params(d, manifest, stack_defaults["kunlun_stack_model"]))
    assert not r["ok"]
    assert r["missing"] == ["tokenizer.json"]
    assert [m["path"] for m in r["mismatched"]] == ["model-00002-of-00002.safetensors"]
    assert r["to_copy"] == ["model-00002-of-00002.safetensors", "tokenizer.json"]
    assert r["extra"] == ["README.md", "model-00003-of-00003.safetensors"]
    items = [p["item"] for p in r["problems"]]
    assert "model file model-00003-of-00003.safetensors" in items  # vllm would load it
    assert "model file README.md" not in items


def test_config_checked_only_when_listed_file_is_right(model, stack_defaults):
    d, manifest = model
    cfg = json.loads((d / "config.json").read_text())
    cfg["rope_scaling"] = {"rope_type": "yarn", "factor": 4.0}
    (d / "config.json").write_text(json.dumps(cfg))
    r = model_verify.verify(params(d, manifest, stack_defaults["kunlun_stack_model"]))
    assert r["to_copy"] == ["config.json"]  # copying the listed file fixes it
    assert [p["item"] for p in r["problems"]] == ["model file config.json"]
    # without a manifest (a config-only check, as on the controller's bundle copy) the content is judged
    r = model_verify.verify(params(d, None, stack_defaults["kunlun_stack_model"]))
    assert [p["item"] for p in r["problems"]] == ["config.json rope_scaling"]


def test_empty_directory_lists_everything_to_copy(tmp_path, model):
    _, manifest = model
    r = model_verify.verify(params(tmp_path / "models2" / DIR, manifest))
    assert len(r["to_copy"]) == 7 and r["bytes"] == 0


def test_manifest_paths_must_stay_inside(tmp_path):
    bad = "%s  ../../etc/passwd\n%s  config.json\n" % ("a" * 64, "b" * 64)
    r = model_verify.verify(params(tmp_path / DIR, bad))
    assert "leaves the model directory" in r["problems"][0]["found"]
    assert r["to_copy"] == ["config.json"]


class Done(Exception):
    pass


def run_main(args, check_mode=False):
    if check_mode:
        args = dict(args, _ansible_check_mode=True)

    def out(self, **kw):
        raise Done(kw)

    with (
        patch_module_args(args),
        mock.patch.multiple(basic.AnsibleModule, exit_json=out, fail_json=lambda s, **kw: out(s, failed=True, **kw)),
    ):
        with pytest.raises(Done) as exc:
            model_verify.main()
    return exc.value.args[0]


def test_wrong_directory_name_is_refused_before_reading(tmp_path, stack_defaults):
    wrong = tmp_path / "Qwen3.8-27B-INT8-W8A8-Dynamic"
    r = run_main(
        {
            "path": str(wrong),
            "directory": DIR,
            "manifest": "not even a manifest",
            "fail_on_problems": False,
            "expected": stack_defaults["kunlun_stack_model"],
        }
    )
    assert r["failed"] is True  # refused even with fail_on_problems false
    assert "right words in the wrong order" in r["msg"]
    assert "Fix: use the directory name Qwen3.8-27B-W8A8-INT8-Dynamic exactly" in r["msg"]
    assert r["files"] == 0 and not wrong.exists()


def test_check_mode_does_not_write_the_cache(model):
    d, manifest = model
    r = run_main(
        {"path": str(d), "directory": DIR, "manifest": manifest, "cache_file": str(d.parent / "sums.json")},
        check_mode=True,
    )
    assert r["ok"] and r["changed"] is False
    assert not (d.parent / "sums.json").exists()
    r = run_main({"path": str(d), "directory": DIR, "manifest": manifest, "cache_file": str(d.parent / "sums.json")})
    assert (d.parent / "sums.json").exists()


def test_failure_message_names_the_files(model):
    d, manifest = model
    (d / "tokenizer.json").unlink()
    r = run_main({"path": str(d), "directory": DIR, "manifest": manifest})
    assert r["failed"] is True
    assert "model file tokenizer.json: missing from %s. Fix: copy it from the model source" % d in r["msg"]
