"""module_utils/model_config.py: a model directory's name and config.json against kunlun_stack_model."""

import copy
import json

import pytest

from ansible.module_utils.kunlun_stack import Problem
from ansible.module_utils.model_config import check_config, check_directory_name, check_model_dir

from kunlun_fleet.sim.artifacts.model import config as standin_config


@pytest.fixture()
def expected(stack_defaults):
    return stack_defaults["kunlun_stack_model"]


@pytest.fixture()
def good(stack_defaults):
    """The stand-in model's config.json: the real fields of the released model."""
    return standin_config(stack_defaults)


def items(problems):
    assert all(isinstance(p, Problem) for p in problems)
    return [p.item for p in problems]


def write(tmp_path, config, name="Qwen3.8-27B-W8A8-INT8-Dynamic"):
    d = tmp_path / name
    d.mkdir()
    (d / "config.json").write_text(json.dumps(config) if not isinstance(config, str) else config)
    return d


def test_released_config_passes(good, expected, tmp_path):
    assert check_config(good, expected) == []
    assert check_model_dir(str(write(tmp_path, good)), expected) == []


def test_yarn_rope_scaling_is_refused(good, expected):
    good["rope_scaling"] = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 262144}
    problems = check_config(good, expected, "/m/config.json")
    assert items(problems) == ["config.json rope_scaling"]
    assert "rope scaling yarn" in problems[0].found
    assert "YaRN to 1M contexts must stay off" in problems[0].found
    assert "no rope_scaling" in problems[0].fix


def test_yarn_in_text_config_rope_parameters_is_refused(good, expected):
    good["text_config"] = {"rope_parameters": {"rope_type": "yarn", "factor": 4.0}}
    assert items(check_config(good, expected)) == ["config.json text_config.rope_parameters"]
    good["text_config"] = {"rope_parameters": {"rope_type": "default", "rope_theta": 10000000}}
    assert check_config(good, expected) == []


def test_null_rope_scaling_is_fine(good, expected):
    good["rope_scaling"] = None
    assert check_config(good, expected) == []


def test_different_max_position_embeddings(good, expected):
    good["max_position_embeddings"] = 1048576
    problems = check_config(good, expected, "/m/config.json")
    assert items(problems) == ["config.json max_position_embeddings"]
    assert "/m/config.json says 1048576 where 262144 is expected" in problems[0].found


def test_fields_under_text_config(good, expected):
    nested = {k: v for k, v in good.items() if k not in ("max_position_embeddings", "dtype")}
    nested["text_config"] = {"max_position_embeddings": 131072, "dtype": "float16"}
    problems = check_config(nested, expected)
    assert items(problems) == ["config.json text_config.max_position_embeddings"]


def test_wrong_model_type(good, expected):
    good["model_type"] = "qwen3_moe"
    problems = check_config(good, expected)
    assert items(problems) == ["config.json model_type"]
    assert "'qwen3_moe' where 'qwen3_5'" in problems[0].found


def test_dtype_from_torch_dtype_or_dtype(good, expected):
    old = copy.deepcopy(good)
    del old["dtype"]
    old["torch_dtype"] = "float16"
    assert check_config(old, expected) == []
    old["torch_dtype"] = "bfloat16"
    problems = check_config(old, expected)
    assert items(problems) == ["config.json torch_dtype"]
    assert "'bfloat16' where 'float16'" in problems[0].found
    del old["torch_dtype"]
    assert items(check_config(old, expected)) == ["config.json dtype"]


def test_both_dtype_fields_must_agree(good, expected):
    good["torch_dtype"] = "bfloat16"
    assert items(check_config(good, expected)) == ["config.json torch_dtype"]


def test_quantization(good, expected):
    good["quantization_config"]["quant_method"] = "kl3-compressed-xline"
    problems = check_config(good, expected)
    assert items(problems) == ["config.json quantization_config.quant_method"]
    assert "'kl3-compressed-xline' where 'compressed-tensors'" in problems[0].found
    del good["quantization_config"]
    assert items(check_config(good, expected)) == ["config.json quantization_config"]


def test_every_problem_is_reported_at_once(good, expected):
    good.update(
        model_type="llama", max_position_embeddings=32768, dtype="bfloat16", rope_scaling={"type": "yarn", "factor": 4}
    )
    assert sorted(items(check_config(good, expected))) == sorted(
        [
            "config.json model_type",
            "config.json max_position_embeddings",
            "config.json rope_scaling",
            "config.json dtype",
        ]
    )


def test_missing_and_broken_files(tmp_path, expected):
    problems = check_model_dir(str(tmp_path / "nope"), expected)
    assert items(problems) == ["model directory"] and "does not exist" in problems[0].found
    d = tmp_path / "m"
    d.mkdir()
    problems = check_model_dir(str(d), expected)
    assert items(problems) == ["config.json"] and problems[0].found == "%s/config.json is missing" % d
    problems = check_model_dir(str(write(tmp_path, "{not json")), expected)
    assert "is not JSON" in problems[0].found
    assert "is not a JSON object" in check_model_dir(str(write(tmp_path, "[1, 2]", "x")), expected)[0].found


def test_directory_names(expected):
    assert check_directory_name("Qwen3.8-27B-W8A8-INT8-Dynamic", expected) == []
    swapped = check_directory_name("Qwen3.8-27B-INT8-W8A8-Dynamic", expected)
    assert items(swapped) == ["model directory"]
    assert "right words in the wrong order" in swapped[0].found
    assert "HFValidationError" in swapped[0].found
    assert "use the directory name Qwen3.8-27B-W8A8-INT8-Dynamic exactly" in swapped[0].fix
    short = check_directory_name("Qwen3.8-27B", expected)
    assert "shortened form" in short[0].found
    other = check_directory_name("Qwen3-32B", expected)
    assert "is not the model directory" in other[0].found
