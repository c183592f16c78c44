"""plugins/filter/serving.py: the vLLM command line from the serving flags, and the requests
in flight from a server's /metrics. The serve unit renders through these (its ExecStart is
checked against vLLM's own parser in tests/artifacts/test_vllm_standin.py and against the
real engine in tests/real_engine). Whether a host needs a restart or can roll back, and the
bench results the capacity gate reads, pinned against the Jinja the serve role computed them
with before (rendered by Ansible's own templar)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kunlun_fleet.bundle import load_pins as stack_pins
from ansible.template import Templar, trust_as_template

from plugins.filter.serving import (
    IN_FLIGHT,
    serve_can_roll_back,
    serve_capacity_results_file,
    serve_needs_restart,
    vllm_argv,
    vllm_in_flight,
)

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "module_utils"))

import rollout_capacity  # noqa: E402

SERVING = stack_pins()["kunlun_stack_serving"]


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
    assert {
        "vllm_argv",
        "vllm_in_flight",
        "serve_needs_restart",
        "serve_can_roll_back",
        "serve_capacity_results_file",
        "acceptance_line",
        "acceptance_lines",
        "image_tag",
        "image_build_tag",
        "gateway_worker_urls",
        "bundle_paths",
        "storage_adopt",
        "packages_missing",
    } <= names
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


def jinja(expr, **variables):
    return Templar(variables=variables).template(trust_as_template(expr))


# roles/serve/tasks/configure.yml, rollback_host.yml and rollout_plan.yml, as they were.
NEEDS_RESTART_JINJA = """{{ serve_env_file is changed or serve_key_file is changed or serve_image_file is changed
   or serve_unit_file is changed or not serve_running or serve_restart_pending.stat.exists }}"""
CAN_ROLL_BACK_JINJA = """{{ serve_last_good.content is defined and (serve_env_file is changed
   or serve_key_file is changed or serve_image_file is changed or serve_unit_file is changed) }}"""
RESULTS_USED_JINJA = """{{ serve_capacity_results if serve_capacity_results else
   (serve_capacity_found.files | default([]) | map(attribute='path') | select('search', '/bench-[^/]+/results.json$')
    | sort | last | default('')) }}"""

FILES = ("serve_env_file", "serve_key_file", "serve_image_file", "serve_unit_file")
SAME = {"changed": False, "diff": {}}
CHANGED = {"changed": True}
LOOP_CHANGED = {"results": [{"changed": False}, {"changed": True}]}
LOOP_SAME = {"results": [{"changed": False}]}
SKIPPED = {"changed": False, "skipped": True, "skip_reason": "Conditional result was False"}
CONFIGS = [
    [SAME, SAME, SAME, SAME],
    [SAME, SAME, SAME, CHANGED],
    [CHANGED, SAME, SAME, SAME],
    [SAME, dict(CHANGED, diff={"before": "a", "after": "b"}), SAME, SAME],
    [SAME, SAME, LOOP_CHANGED, SAME],
    [SAME, LOOP_SAME, SAME, SKIPPED],
]


@pytest.mark.parametrize("configs", CONFIGS)
@pytest.mark.parametrize("running", [True, False])
@pytest.mark.parametrize("pending", [True, False])
def test_a_restart_when_a_file_would_change_the_service_is_down_or_one_is_pending(configs, running, pending):
    variables = dict(
        zip(FILES, configs, strict=True), serve_running=running, serve_restart_pending={"stat": {"exists": pending}}
    )
    expected = jinja(NEEDS_RESTART_JINJA, **variables)
    got = serve_needs_restart(configs, running, pending)
    assert got is expected  # a bool, as the Jinja gave: when: and selectattr read it


def test_a_running_host_with_its_configuration_and_nothing_pending_keeps_serving():
    assert serve_needs_restart([SAME] * 4, True, False) is False
    assert serve_needs_restart([SAME, SAME, SAME, CHANGED], True, False) is True
    assert serve_needs_restart([SAME] * 4, False, False) is True
    assert serve_needs_restart([SAME] * 4, True, True) is True


def test_not_a_registered_result_is_an_error_as_the_changed_test_is():
    with pytest.raises(TypeError, match="registered task result"):
        serve_needs_restart(["changed"], True, False)


LAST_GOOD = [
    {"content": "c2hhMjU2OmFiYwo=", "encoding": "base64", "source": "/etc/kunlun-serve/last-good/image"},
    {"failed": True, "msg": "file not found: /etc/kunlun-serve/last-good/image"},
    {"content": ""},
]


@pytest.mark.parametrize("configs", CONFIGS)
@pytest.mark.parametrize("last_good", LAST_GOOD)
def test_roll_back_only_to_a_last_good_configuration_and_only_when_this_run_changed_one(configs, last_good):
    variables = dict(zip(FILES, configs, strict=True), serve_last_good=last_good)
    expected = jinja(CAN_ROLL_BACK_JINJA, **variables)
    got = serve_can_roll_back(configs, last_good)
    assert got is expected


def test_roll_back_in_plain_words():
    assert serve_can_roll_back([SAME, SAME, CHANGED, SAME], LAST_GOOD[0]) is True
    assert serve_can_roll_back([SAME] * 4, LAST_GOOD[0]) is False
    assert serve_can_roll_back([CHANGED] * 4, LAST_GOOD[1]) is False


def found(*paths):
    return {"changed": False, "examined": 9, "matched": len(paths), "files": [{"path": p} for p in paths]}


FOUND = [
    {"changed": False, "skipped": True, "skip_reason": "Conditional result was False"},
    found(),
    found(
        "/r/reports/bench-20261202T101010Z/results.json",
        "/r/reports/bench-20261203T090000Z/results.json",
        "/r/reports/bench-20261201T235959Z/results.json",
    ),
    # not a bench run's results: left out
    found("/r/reports/bench-20261202T101010Z/results.json", "/r/reports/other/results.json"),
    found("/r/reports/bench-20261202T101010Z/sub/results.json"),
    # Jinja's sort is case-insensitive: "B" sorts with "b", after "a", not before it
    found("/r/reports/bench-b/results.json", "/r/reports/bench-A/results.json", "/r/reports/bench-C/results.json"),
]


@pytest.mark.parametrize("found_result", FOUND)
@pytest.mark.parametrize("given", ["", "/srv/bench/results.json"])
def test_the_results_given_else_the_latest_bench_run(found_result, given):
    expected = jinja(RESULTS_USED_JINJA, serve_capacity_results=given, serve_capacity_found=found_result)
    got = serve_capacity_results_file(given, found_result)
    assert got == expected and type(got) is type(expected)


def test_the_latest_bench_run_by_its_timestamp():
    assert serve_capacity_results_file("", FOUND[2]) == "/r/reports/bench-20261203T090000Z/results.json"
    assert serve_capacity_results_file("", FOUND[5]) == "/r/reports/bench-C/results.json"
    assert serve_capacity_results_file("", FOUND[0]) == ""
    assert serve_capacity_results_file("", FOUND[4]) == ""


def test_only_this_inventorys_bench_results(tmp_path):
    # reports/ is the checkout's: the demo's bench and a site's sit side by side. The gate
    # takes the latest this inventory measured, never another's (nor one that names none).
    site, demo = tmp_path / "inventories" / "site-a", tmp_path / "inventories" / "sim"
    site.mkdir(parents=True)
    demo.mkdir(parents=True)
    files = []
    for stamp, inventory in (
        ("20261201T000000Z", str(site)),
        ("20261202T000000Z", str(demo)),
        ("20261203T000000Z", None),
        ("20261204T000000Z", str(tmp_path / "inventories" / "." / "sim")),
    ):
        path = tmp_path / "reports" / ("bench-%s" % stamp) / "results.json"
        path.parent.mkdir(parents=True)
        path.write_text(json.dumps({"meta": {"inventory": inventory} if inventory else {}}))
        files.append({"path": str(path)})
    found_result = {"files": files}
    assert serve_capacity_results_file("", found_result, str(site)).endswith("bench-20261201T000000Z/results.json")
    assert serve_capacity_results_file("", found_result, str(demo)).endswith("bench-20261204T000000Z/results.json")
    assert serve_capacity_results_file("", found_result, str(tmp_path / "other")) == ""
    # Without an inventory (the filter's old form), the latest of any; a given file always wins.
    assert serve_capacity_results_file("", found_result).endswith("bench-20261204T000000Z/results.json")
    assert serve_capacity_results_file("/srv/r.json", found_result, str(site)) == "/srv/r.json"
