"""library/inventory_check.py: the inventory's shape, judged from its groups and host variables."""

import inventory_check

SPECS = [
    {
        "argument_specs": {
            "main": {
                "options": {
                    "kunlun_stack_device_count": {"type": "int"},
                    "kunlun_stack_allow_unvalidated": {"type": "bool"},
                    "storage_data_disks": {"type": "list"},
                }
            }
        }
    }
]


def params(**over):
    base = dict(
        groups={"all": ["a", "b"], "xpu_servers": ["a", "b"], "gateways": ["a"]},
        hosts={
            "a": {"ansible_host": "10.0.0.1", "storage_data_disks": ["/dev/vdb"]},
            "b": {"ansible_host": "10.0.0.2", "storage_data_disks": ["/dev/vdb"]},
        },
        required_groups=["xpu_servers", "gateways"],
        required_host_vars={"xpu_servers": ["storage_data_disks"]},
        argument_specs=SPECS,
        extra_known=[],
        similarity=0.8,
    )
    base.update(over)
    return base


def test_sound_inventory_passes():
    assert inventory_check.check(params()) == ([], [])


def test_empty_group():
    p = params(groups={"all": ["a"], "xpu_servers": [], "gateways": ["a"]})
    problems, _ = inventory_check.check(p)
    assert problems == ["group xpu_servers has no hosts: add at least one host under xpu_servers in hosts.yml"]


def test_missing_group_is_empty_too():
    p = params(groups={"all": ["a"], "xpu_servers": ["a", "b"]})
    assert any("group gateways has no hosts" in m for m in inventory_check.check(p)[0])


def test_required_host_var():
    p = params()
    p["hosts"]["b"] = {"ansible_host": "10.0.0.2"}
    problems, _ = inventory_check.check(p)
    assert problems == ["host b (group xpu_servers) does not define storage_data_disks: set it in host_vars/b.yml"]
    # An explicit empty list is a value (the storage stage then adopts the mounted volume).
    p["hosts"]["b"]["storage_data_disks"] = []
    assert inventory_check.check(p)[0] == []


def test_duplicate_address_including_implicit_name():
    p = params()
    p["hosts"]["b"]["ansible_host"] = "10.0.0.1"
    problems, _ = inventory_check.check(p)
    assert problems == ["hosts a and b share the address 10.0.0.1: give each host its own ansible_host"]
    p = params()
    p["hosts"]["a"].pop("ansible_host")
    p["hosts"]["b"]["ansible_host"] = "a"
    assert "share the address a" in inventory_check.check(p)[0][0]


def test_boolean_as_string():
    p = params()
    p["hosts"]["a"]["kunlun_stack_allow_unvalidated"] = "False"
    problems, _ = inventory_check.check(p)
    assert len(problems) == 1
    assert "kunlun_stack_allow_unvalidated is the string 'False' on host a" in problems[0]
    assert "write false without quotes" in problems[0]


def test_real_boolean_is_fine():
    p = params()
    p["hosts"]["a"]["kunlun_stack_allow_unvalidated"] = False
    assert inventory_check.check(p) == ([], [])


def test_misspelling_is_an_error_and_unrelated_name_a_warning():
    p = params()
    p["hosts"]["a"]["kunlun_stack_devce_count"] = 8
    p["hosts"]["b"]["kunlun_stack_devce_count"] = 8
    p["hosts"]["a"]["site_owner"] = "ops"
    problems, unknown = inventory_check.check(p)
    assert problems == [
        "unknown variable kunlun_stack_devce_count (on a, b): did you mean "
        "kunlun_stack_device_count? Rename it in your inventory"
    ]
    assert unknown == ["site_owner"]


def test_magic_and_connection_variables_are_known():
    p = params()
    p["hosts"]["a"].update(
        inventory_hostname="a", group_names=["xpu_servers"], ansible_user="root", ansible_facts={}, playbook_dir="/x"
    )
    assert inventory_check.check(p) == ([], [])


def test_extra_known_names_are_accepted():
    p = params(extra_known=["site_owner"])
    p["hosts"]["a"]["site_owner"] = "ops"
    assert inventory_check.check(p) == ([], [])


def test_every_setting_the_docs_give_is_known_to_the_real_roles():
    # docs/bench.md and site.yml: `bench_enabled: true` in the inventory (or -e) runs the
    # bench at the end of site.yml; preflight once refused it as a misspelling of
    # bench_long_enabled, because no role declared it.
    import glob

    import yaml

    specs = [yaml.safe_load(open(path)) for path in sorted(glob.glob("roles/*/meta/argument_specs.yml"))]
    p = params(argument_specs=specs)
    p["hosts"]["a"] = dict(p["hosts"]["a"], bench_enabled=True)
    problems, unknown = inventory_check.check(p)
    assert not [m for m in problems if "bench_enabled" in m] and "bench_enabled" not in unknown, (problems, unknown)
