"""plugins/filter/inventory.py: the variables preflight's inventory check refuses."""

import importlib.util
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("filter_inventory", ROOT / "plugins/filter/inventory.py")
mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)


def test_every_role_vars_name_is_fixed_with_its_role_named():
    files = sorted(ROOT.glob("roles/*/vars/main.yml"))
    assert files, "no role derives anything"
    role_vars = {str(p): yaml.safe_load(p.read_text()) for p in files}
    fixed = mod.fixed_variables(role_vars, {"serve_args": "set kunlun_stack_serving_overrides"})
    assert "roles/serve/vars/main.yml" in fixed["serve_image_ref"]
    assert "the kunlun_stack role" in fixed["kunlun_stack_serving_effective"]
    assert fixed["serve_args"] == "set kunlun_stack_serving_overrides"
    # Inputs stay settable.
    assert "serve_image_tag" not in fixed and "kunlun_stack_serving_overrides" not in fixed


def test_replaced_names_win_over_a_role_vars_entry():
    fixed = mod.fixed_variables({"/x/roles/r/vars/main.yml": {"a": 1}}, {"a": "set b"})
    assert fixed == {"a": "set b"}
