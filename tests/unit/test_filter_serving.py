"""plugins/filter/serving.py: the vLLM command line from the serving flags, and the requests
in flight from a server's /metrics. The serve unit renders through these (its ExecStart is
checked against vLLM's own parser in tests/artifacts/test_vllm_standin.py and against the
real engine in tests/real_engine)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from plugins.filter.serving import IN_FLIGHT, vllm_argv, vllm_in_flight

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "module_utils"))

import rollout_capacity  # noqa: E402

SERVING = yaml.safe_load((ROOT / "roles/kunlun_stack/defaults/main.yml").read_text())["kunlun_stack_serving"]


def test_the_validated_flags_become_vllms_command_line_in_sorted_order():
    argv = vllm_argv(SERVING)
    # true: the bare flag; null (rope_scaling): left out; underscores become dashes.
    assert argv[:2] == ["--dtype", "float16"]
    assert "--enable-prefix-caching" in argv and "--enable-auto-tool-choice" in argv
    assert not any(a.startswith("--rope-scaling") for a in argv)
    assert argv[argv.index("--max-num-seqs") + 1] == str(SERVING["max_num_seqs"])
    assert argv[argv.index("--gpu-memory-utilization") + 1] == "0.75"
    flags = [a for a in argv if a.startswith("--")]
    assert flags == sorted(flags)


def test_false_and_null_leave_a_flag_out_and_zero_is_a_value():
    assert vllm_argv({"enable_prefix_caching": False, "rope_scaling": None, "seed": 0}) == ["--seed", "0"]


def test_lines_give_one_string_per_flag_for_the_unit():
    assert vllm_argv({"max_num_seqs": 128, "trust_remote_code": True, "x": False}, lines=True) == [
        "--max-num-seqs 128",
        "--trust-remote-code",
    ]


def test_not_a_dict_is_an_error_that_names_the_filter():
    with pytest.raises(TypeError, match="vllm_argv expects a dict"):
        vllm_argv(["--max-num-seqs", "1"])


def test_in_flight_sums_running_and_waiting_with_or_without_labels():
    text = "\n".join(
        [
            "# HELP vllm:num_requests_running Number of requests in model execution batches.",
            'vllm:num_requests_running{engine="0",model_name="m"} 3.0',
            'vllm:num_requests_waiting{engine="0",model_name="m"} 2.0',
            "vllm:num_requests_waiting 1e1",
            'vllm:num_requests_swapped{model_name="m"} 7.0',
            'vllm:generation_tokens_total{model_name="m"} 99.0',
        ]
    )
    assert vllm_in_flight(text) == 15
    assert vllm_in_flight("") == 0 and vllm_in_flight(None) == 0


def test_the_filter_and_the_rollout_module_read_in_flight_alike():
    assert IN_FLIGHT.pattern == rollout_capacity.IN_FLIGHT.pattern


def test_ansible_finds_every_filter_and_its_documentation_through_the_projects_config():
    """Every filter of plugins/filter is documented in its NAME.yml beside it (ansible-doc)."""
    import importlib

    names = set()
    for path in sorted((ROOT / "plugins/filter").glob("*.py")):
        names |= set(importlib.import_module("plugins.filter." + path.stem).FilterModule().filters())
    assert {"vllm_argv", "vllm_in_flight", "acceptance_line", "image_tag"} <= names
    proc = subprocess.run(
        [str(ROOT / ".venv/bin/ansible-doc"), "-j", "-t", "filter", *sorted(names)],
        cwd=ROOT,
        env={"ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "PATH": "/usr/bin:/bin", "HOME": str(Path.home())},
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    docs = json.loads(proc.stdout)
    for name in names:
        assert docs[name]["doc"]["filename"] == str(ROOT / "plugins/filter" / (name + ".yml")), name
        assert docs[name]["doc"]["short_description"], name
    assert docs["vllm_argv"]["doc"]["short_description"].startswith("vLLM command-line arguments")
