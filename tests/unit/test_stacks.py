"""The named stacks (roles/kunlun_stack/defaults/main.yml): the catalog's own rules, the
judgement of a chosen stack (module_utils/kunlun_stack.py check_stack, as preflight and the
image stage run it through library/stack_rules.py), and the chosen stack's parts worked out
the same way by the roles (plugins/filter/stacks.py) and the controller (resolve_pins)."""

import copy
import sys
from pathlib import Path

import pytest
import yaml

from kunlun_fleet.bundle import load_pins, module_utils

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "library"))
sys.path.insert(0, str(ROOT))
module_utils()

import stack_rules  # noqa: E402
from ansible.module_utils.kunlun_stack import (  # noqa: E402
    REQUIRED_PARTS,
    STACK_PARTS,
    check_known_bad,
    check_stack,
    component_versions,
    resolve_pins,
)

from plugins.filter.stacks import fleet_stack_part  # noqa: E402

RAW = yaml.safe_load((ROOT / "roles/kunlun_stack/defaults/main.yml").read_text())
STACKS = RAW["kunlun_stack_stacks"]
VALIDATED = "0.15.1-4885de2"
BAD = "0.25.1-2fda97b"


def test_the_default_stack_is_the_validated_one_and_every_stack_is_complete():
    assert RAW["kunlun_stack_stack"] == VALIDATED and STACKS[VALIDATED]["status"] == "validated"
    for name, entry in STACKS.items():
        assert set(REQUIRED_PARTS) <= set(entry), name
        assert check_stack(name, STACKS)[0] == [] or entry["status"] == "known-bad", name
        # The name is <vllm-kunlun release line>-<commit>.
        assert name.endswith("-" + entry["components"]["vllm_kunlun"]["commit"]), name


def test_a_known_bad_stack_is_also_caught_by_the_combination_rules():
    """Both layers agree: the stack's status and the known-bad rules over its components."""
    for name, entry in STACKS.items():
        hits = check_known_bad(component_versions(entry["components"]), RAW["kunlun_stack_known_bad"])
        assert bool(hits) == (entry["status"] == "known-bad"), name


def test_check_stack_by_name():
    problems, warnings = check_stack(BAD, STACKS)
    assert [str(p) for p in problems] == [
        "stack %s: known-bad: %s. Fix: serve a validated stack (%s)"
        % (BAD, " ".join(STACKS[BAD]["reason"].split()), VALIDATED)
    ]
    assert "causal_conv1d" in str(problems[0]) and warnings == []
    problems, _ = check_stack("0.16.0-abcdef1", STACKS)
    assert str(problems[0]).startswith("stack 0.16.0-abcdef1: no such stack (known: %s, %s)" % (VALIDATED, BAD))
    site = {"0.15.1-7c1e0a2": dict(copy.deepcopy(STACKS[VALIDATED]), status="candidate")}
    problems, warnings = check_stack("0.15.1-7c1e0a2", STACKS, site)
    assert problems == [] and "is a candidate" in warnings[0] and "upgrade --to 0.15.1-7c1e0a2" in warnings[0]
    problems, _ = check_stack("0.15.1-7c1e0a2", STACKS, {"0.15.1-7c1e0a2": {"status": "tested"}})
    assert "it has no base_image, components" in str(problems[0]) and "status 'tested'" in str(problems[1])
    problems, _ = check_stack(VALIDATED, STACKS, {VALIDATED: {"status": "candidate"}})
    assert "reuses the name of a shipped stack" in str(problems[0]) and len(problems) == 1


@pytest.mark.parametrize("name", sorted(STACKS))
def test_roles_and_controller_work_out_the_same_parts(name):
    pins = resolve_pins(RAW, name)
    for variable, part in STACK_PARTS.items():
        assert RAW[variable].startswith("{{ kunlun_stack_stacks | fleet_stack_part("), variable
        assert pins[variable] == fleet_stack_part(STACKS, {}, name, part) == STACKS[name][part]


def test_resolve_keeps_an_inventory_departure_and_takes_site_stacks():
    site = {"0.15.1-7c1e0a2": dict(copy.deepcopy(STACKS[VALIDATED]), status="candidate", base_image="reg/b:1")}
    pins = resolve_pins(dict(RAW, kunlun_stack_site_stacks=site, kunlun_stack_stack="0.15.1-7c1e0a2"))
    assert pins["kunlun_stack_base_image"] == "reg/b:1"
    pins = resolve_pins(dict(RAW, kunlun_stack_driver={"version": "5.0.21.30"}))
    assert pins["kunlun_stack_driver"] == {"version": "5.0.21.30"}
    # An unknown stack: empty parts of each part's type (preflight names the stack first).
    pins = resolve_pins(RAW, "nope")
    assert pins["kunlun_stack_base_image"] == "" and pins["kunlun_stack_components"] == {}
    assert load_pins(stack=BAD)["kunlun_stack_components"]["vllm_kunlun"]["commit"] == "2fda97b"


def test_stack_rules_refuses_a_known_bad_stack_even_when_unvalidated_pins_are_allowed():
    pins = load_pins()
    params = dict(
        stack=BAD,
        stacks=STACKS,
        site_stacks={},
        components=pins["kunlun_stack_components"],
        validated_components=None,
        known_bad=[],
        allow_unvalidated=True,
        serving=None,
    )
    problems, departures, _ = stack_rules.run(params)
    # The fleet's pins are the validated stack's: departures from the named (bad) stack.
    assert problems[0]["item"] == "stack %s" % BAD and "known-bad" in problems[0]["found"]
    assert [d["item"] for d in departures] == ["pin vllm_kunlun", "pin vllm_kunlun commit"]
    problems, departures, warnings = stack_rules.run(dict(params, stack=VALIDATED, allow_unvalidated=False))
    assert problems == [] and departures == [] and warnings == []


def test_a_site_stack_based_on_another_is_complete_and_both_implementations_agree():
    from plugins.filter.stacks import fleet_stack_catalog

    from ansible.module_utils.kunlun_stack import stack_catalog

    site = {
        "0.15.1-7c1e0a2": {
            "based_on": VALIDATED,
            "status": "candidate",
            "components": {"vllm_kunlun": {"version": "0.15.1.dev0", "commit": "7c1e0a2", "source": "vllm-kunlun"}},
        },
        "0.15.1-b3f9d41": {
            "based_on": "0.15.1-7c1e0a2",
            "status": "candidate",
            "serving_env": {"A": "1"},
            "components": {"vllm_kunlun": {"version": "0.15.1.dev0", "commit": "b3f9d41", "source": "vllm-kunlun"}},
        },
    }
    catalog = stack_catalog(STACKS, site)
    assert catalog == fleet_stack_catalog(STACKS, site)
    one, two = catalog["0.15.1-7c1e0a2"], catalog["0.15.1-b3f9d41"]
    assert one["status"] == "candidate" and "summary" not in one and one["driver"] == STACKS[VALIDATED]["driver"]
    assert list(one["components"]) == list(STACKS[VALIDATED]["components"])
    assert one["components"]["vllm_kunlun"]["commit"] == "7c1e0a2" and one["components"]["torch"]["version"] == "2.5.1"
    assert two["components"]["vllm_kunlun"]["commit"] == "b3f9d41" and two["serving_env"] == {"A": "1"}
    problems, warnings = check_stack("0.15.1-b3f9d41", STACKS, site)
    assert problems == [] and len(warnings) == 1 and "0.15.1-b3f9d41 is a candidate" in warnings[0]
    pins = resolve_pins(dict(RAW, kunlun_stack_site_stacks=site), "0.15.1-b3f9d41")
    assert pins["kunlun_stack_components"]["vllm_kunlun"]["commit"] == "b3f9d41"
    assert pins["kunlun_stack_serving"] == STACKS[VALIDATED]["serving"]
    # A base that is no stack is named.
    problems, _ = check_stack("x", STACKS, {"x": {"based_on": "nope", "status": "candidate"}})
    assert "based_on nope is no other stack" in str(problems[0])


def test_the_run_report_names_the_stack_the_run_deploys(tmp_path):
    from kunlun_fleet.runner.report import stack_info
    from kunlun_fleet.runner.run import Run

    inv = tmp_path / "inv"
    (inv / "group_vars" / "all").mkdir(parents=True)
    (inv / "group_vars" / "all" / "stack.yml").write_text('kunlun_stack_stack: "%s"\n' % BAD)
    info = stack_info(ROOT, None, str(inv))
    assert info["name"] == BAD and info["versions"]["vllm_kunlun"] == "0.25.1.dev0"
    assert stack_info(ROOT, None, str(inv), VALIDATED)["versions"]["vllm_kunlun"] == "0.15.1.dev0"
    run = Run.__new__(Run)
    run.args = ["-e", '{"kunlun_stack_stack": "%s", "image_promote": false}' % VALIDATED, "--check"]
    assert run.extra_stack() == VALIDATED
    run.args = ["-e", "kunlun_stack_stack=%s" % BAD]
    assert run.extra_stack() == BAD
    run.args = ["-e", '{"serve_image_tag": "x"}']
    assert run.extra_stack() is None
