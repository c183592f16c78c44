"""The shared checker applies the validated combination's rules (module_utils/kunlun_stack.py)."""

import copy

import pytest

from ansible.module_utils.kunlun_stack import (
    check_departures,
    check_known_bad,
    check_pins,
    check_serving,
    component_versions,
    version_at_least,
)


def items(problems):
    return [p.item for p in problems]


def test_validated_combination_has_no_problem(stack_defaults):
    comps = stack_defaults["kunlun_stack_components"]
    assert check_pins(comps, comps, stack_defaults["kunlun_stack_known_bad"]) == []
    assert check_serving(stack_defaults["kunlun_stack_serving"], stack_defaults["kunlun_stack_serving_rules"], 8) == []


def test_every_table_row_is_pinned(stack_defaults):
    versions = component_versions(stack_defaults["kunlun_stack_components"])
    assert versions == {
        "python": "3.10.19",
        "torch": "2.5.1",
        "kunlun_ops": "0.1.58+ee39020a",
        "triton": "3.0.0+b2cde523",
        "xspeedgate_ops": "0.0.0+torch25",
        "cocopod": "0.0.0+torch25",
        "vllm": "0.15.1",
        "vllm_kunlun": "0.15.1.dev0",
        "vllm_kunlun_commit": "4885de2",
        "transformers": "5.2.0",
    }


@pytest.mark.parametrize(
    "override, needle",
    [
        ({"vllm_kunlun": {"version": "0.25.1.dev0", "commit": "2fda97b"}}, "causal_conv1d"),
        ({"transformers": {"version": "5.5.3"}}, "max_pixels"),
        ({"vllm": {"version": "0.16.0"}}, "works only with vllm 0.15.1"),
    ],
)
def test_known_bad_combinations_are_refused(stack_defaults, override, needle):
    comps = copy.deepcopy(stack_defaults["kunlun_stack_components"])
    for name, entry in override.items():
        comps[name].update(entry)
    bad = check_known_bad(component_versions(comps), stack_defaults["kunlun_stack_known_bad"])
    assert bad, "the override must be refused"
    assert any(needle in p.found for p in bad)
    assert all("roles/kunlun_stack/defaults/main.yml" in p.fix for p in bad)


def test_departure_that_is_not_known_bad_is_reported(stack_defaults):
    comps = copy.deepcopy(stack_defaults["kunlun_stack_components"])
    comps["triton"]["version"] = "3.0.1"
    assert check_known_bad(component_versions(comps), stack_defaults["kunlun_stack_known_bad"]) == []
    departures = check_departures(comps, stack_defaults["kunlun_stack_components"])
    assert items(departures) == ["pin triton"]
    assert "3.0.0+b2cde523" in departures[0].fix


@pytest.mark.parametrize(
    "change, device_count, item",
    [
        ({"gpu_memory_utilization": 0.9}, 8, "gpu_memory_utilization"),
        ({"max_model_len": 1048576}, 8, "max_model_len"),
        ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, 8, "rope_scaling"),
        ({"tensor_parallel_size": 16}, 8, "tensor_parallel_size"),
        ({"tensor_parallel_size": 3}, 8, "tensor_parallel_size"),
        ({"dtype": "bfloat16"}, 8, "dtype"),
        ({"mamba_ssm_cache_dtype": "auto"}, 8, "mamba_ssm_cache_dtype"),
        ({"max_num_seqs": 2048, "gpu_memory_utilization": 0.7}, 8, "max_num_seqs"),
    ],
)
def test_serving_rules(stack_defaults, change, device_count, item):
    args = dict(stack_defaults["kunlun_stack_serving"], **change)
    problems = check_serving(args, stack_defaults["kunlun_stack_serving_rules"], device_count)
    assert item in items(problems)
    assert all(p.fix for p in problems)


def test_memory_rule_only_applies_from_256_sequences(stack_defaults):
    rules = stack_defaults["kunlun_stack_serving_rules"]
    args = dict(stack_defaults["kunlun_stack_serving"], gpu_memory_utilization=0.9, max_num_seqs=128)
    assert check_serving(args, rules, 8) == []
    args["max_num_seqs"] = 256
    assert items(check_serving(args, rules, 8)) == ["gpu_memory_utilization"]


def test_smaller_tensor_parallel_that_divides_is_accepted(stack_defaults):
    args = dict(stack_defaults["kunlun_stack_serving"], tensor_parallel_size=4)
    assert check_serving(args, stack_defaults["kunlun_stack_serving_rules"], 8) == []


@pytest.mark.parametrize(
    "version, floor, expected",
    [
        ("5.0.21.26", "5.0.21.26", True),
        ("5.0.21.100", "5.0.21.26", True),
        ("5.0.20.99", "5.0.21.26", False),
        ("515.58", "5.0.21.26", True),
        ("", "1.0", False),
    ],
)
def test_version_at_least(version, floor, expected):
    assert version_at_least(version, floor) is expected


@pytest.mark.parametrize(
    "quantization, found, fix",
    [
        # the notes' docs give it; vllm 0.15.1 (argument choices) and vllm-kunlun register no such method
        (
            "kl3-compressed-xline",
            "'kl3-compressed-xline' is not a method the pinned stack provides",
            "did you mean compressed-tensors?",
        ),
        ("fbgemm_fp8", "'fbgemm_fp8' is deprecated in the pinned vllm", "allow_deprecated_quantization: true"),
    ],
)
def test_quantization_must_be_a_method_of_the_pinned_stack(stack_defaults, quantization, found, fix):
    args = dict(stack_defaults["kunlun_stack_serving"], quantization=quantization)
    problems = check_serving(args, stack_defaults["kunlun_stack_serving_rules"], 8)
    assert items(problems) == ["quantization"]
    assert found in problems[0].found and fix in problems[0].fix


def test_quantization_methods_are_vllm_0_15_1_s(stack_defaults):
    rules = stack_defaults["kunlun_stack_serving_rules"]
    assert len(rules["quantization_methods"]) == 25 and "compressed-tensors" in rules["quantization_methods"]
    for method in (None, "compressed-tensors", "awq"):
        assert check_serving(dict(stack_defaults["kunlun_stack_serving"], quantization=method), rules, 8) == []
    assert (
        check_serving(
            dict(stack_defaults["kunlun_stack_serving"], quantization="fbgemm_fp8", allow_deprecated_quantization=True),
            rules,
            8,
        )
        == []
    )


def test_preflight_s_stack_rules_refuse_the_docs_quantization(stack_defaults):
    """library/stack_rules.py, as preflight and serve call it: kl3-compressed-xline passed
    and vllm failed at start."""
    import stack_rules

    comps = stack_defaults["kunlun_stack_components"]
    problems, _, _ = stack_rules.run(
        {
            "components": comps,
            "validated_components": comps,
            "known_bad": stack_defaults["kunlun_stack_known_bad"],
            "allow_unvalidated": False,
            "device_count": 8,
            "serving_rules": stack_defaults["kunlun_stack_serving_rules"],
            "serving": dict(stack_defaults["kunlun_stack_serving"], quantization="kl3-compressed-xline"),
        }
    )
    assert [p["item"] for p in problems] == ["quantization"]
