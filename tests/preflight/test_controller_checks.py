"""Bad input refused by preflight's controller checks, before any host is contacted.

Each case breaks one thing in a copy of inventories/example (whose addresses are never
reached: every failure here happens on the controller) and expects a message naming the
item and the fix.
"""

import hashlib
import os
import subprocess
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


def assert_refused_before_hosts(rc, out, *needles):
    assert rc != 0, out
    for needle in needles:
        assert needle in out, "expected %r in:\n%s" % (needle, out[-4000:])
    # No task ever ran on a host: everything so far was delegated to localhost.
    assert "Host | " not in out, out[-4000:]
    assert "changed=0" in out


# The stack rules judge every pin and serving value in one call and list every problem
# (library/stack_rules.py), so one run with several bad values proves each refusal: each
# message is asserted by itself. (Each used to be a run of its own: known-bad combination,
# transformers 5.5.3, an unvalidated pin, four serving rules. A playbook run costs about
# 4 CPU-s; each rule alone is unit-tested in tests/unit/test_kunlun_stack.py.)
SERVING_CHANGES = {
    "gpu_memory_utilization": (0.9, ["gpu_memory_utilization", "0.9 with max_num_seqs 256", "at most 0.8"]),
    "max_model_len": (1048576, ["max_model_len", "1048576", "at most 262144"]),
    "rope_scaling": ({"rope_type": "yarn", "factor": 4.0}, ["rope_scaling", "YaRN"]),
    "tensor_parallel_size": (16, ["tensor_parallel_size", "16 does not divide the 8 accelerators"]),
}


def test_bad_pins_and_serving_values_are_each_refused_by_name(inventory, run_preflight):
    comps = inventory_components()
    # The deployment notes' failed upgrade (a known-bad combination), transformers 5.5.3,
    # and a pin that departs from the validated combination (refused unless allowed).
    comps["vllm_kunlun"] = {"version": "0.25.1.dev0", "commit": "2fda97b", "source": "vllm-kunlun"}
    comps["transformers"]["version"] = "5.5.3"
    comps["triton"]["version"] = "3.0.1"
    # The serving changes as a site makes them: only what differs, merged over the pins
    # (preflight judges the merged arguments).
    overrides = {k: v for k, (v, _) in SERVING_CHANGES.items()}
    # The fleet named a known-bad stack (refused by name, with its reason), and the site's own
    # stack reuses a shipped name.
    inventory.update(
        "group_vars/all/stack.yml",
        kunlun_stack_components=comps,
        kunlun_stack_serving_overrides=overrides,
        kunlun_stack_stack="0.25.1-2fda97b",
        kunlun_stack_site_stacks={"0.15.1-4885de2": {"status": "candidate"}},
    )
    rc, out = run_preflight(inventory)
    needles = [
        "stack 0.25.1-2fda97b: known-bad: vllm-kunlun 0.25.1-dev (commit 2fda97b) with kunlun_ops 0.1.58",
        "serve a validated stack (0.15.1-4885de2)",
        "site stack 0.15.1-4885de2: kunlun_stack_site_stacks reuses the name of a shipped stack",
        "known-bad combination",
        "2fda97b",
        "Fix:",
        "transformers 5.5.3",
        "max_pixels",
        "pin triton",
        "3.0.0+b2cde523",
    ]
    for _, words in SERVING_CHANGES.values():
        needles += words
    assert_refused_before_hosts(rc, out, *needles)


def test_an_unknown_stack_and_a_copy_of_the_shipped_stacks_are_refused(inventory, run_preflight):
    """A stack name that is none (a typo) stops before anything is worked out from it; the
    shipped stacks change with a release, a site adds its own beside them."""
    from kunlun_fleet.bundle import load_pins

    inventory.update("group_vars/all/stack.yml", kunlun_stack_stack="0.15.1-4885de3")
    rc, out = run_preflight(inventory)
    assert_refused_before_hosts(rc, out, "kunlun_stack_stack is 0.15.1-4885de3: no such stack (known: 0.15.1-4885de2")
    shipped = load_pins()["kunlun_stack_stacks"]
    inventory.update("group_vars/all/stack.yml", kunlun_stack_stack="0.15.1-4885de2", kunlun_stack_stacks=shipped)
    rc, out = run_preflight(inventory)
    assert_refused_before_hosts(rc, out, "kunlun_stack_stacks is set", "kunlun_stack_site_stacks")


def test_empty_xpu_servers_group(inventory, run_preflight):
    hosts = inventory.hosts()
    hosts["all"]["children"]["xpu_servers"]["hosts"] = {}
    hosts["all"]["children"]["image_builders"]["hosts"] = {}
    inventory.save("hosts.yml", hosts)
    rc, out = run_preflight(inventory)
    assert rc != 0
    assert "group xpu_servers has no hosts" in out, out[-3000:]


def test_no_api_key_in_the_vault(inventory, run_preflight):
    (inventory.path / "group_vars/all/vault.yml").unlink()
    rc, out = run_preflight(inventory)
    assert rc != 0
    assert "No API key for the fleet: vault_kunlun_api_key is not set" in out, out[-3000:]
    assert "kunlun-fleet api-key -i <inventory>" in out
    assert "Host | " not in out


# One -vvv run through every controller check (ending at the last, the bundle's, on a
# bundle without its index): each used to be a run of its own (the API key never printed,
# host variables' secrets never printed, the bundle without bundle.yml).
def test_secrets_are_never_printed_and_a_bundle_without_its_index_is_refused(inventory, run_preflight, tmp_path):
    """Preflight hands every host variable to inventory_check; at -vvv Ansible prints a
    module's arguments. The fleet's API key, a become password (vaulted, as an operator
    keeps it) and a registry password (plain) must appear nowhere, while the run still
    judges the inventory (it passes, with the secrets in it, on to the last check). A bundle
    laid out by hand (no bundle.yml): nothing says which file is which pin, and the fix is
    named."""
    from kunlun_fleet import vault

    key = vault.read_api_key(str(inventory.path), os.environ["ANSIBLE_VAULT_PASSWORD_FILE"])
    become = "Become-Secret-5f1c2e"
    registry = "Registry-Secret-9a7b3d"
    vaulted = subprocess.run(
        [str(ROOT / ".venv/bin/ansible-vault"), "encrypt_string", "--name", "ansible_become_password", become],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    (inventory.path / "group_vars/all/become.yml").write_text("---\n" + vaulted)
    inventory.update("host_vars/p800-a01.yml", image_registry_password=registry)
    installer = "#!/bin/sh\n# XRE self-extracting installer, version 5.0.21.26\n"
    digest = hashlib.sha256(installer.encode()).hexdigest()
    bundle = driver_bundle(tmp_path, digest, installer=installer, index=False)
    inventory.update("group_vars/all/stack.yml", kunlun_stack_bundle_dir=str(bundle))
    rc, out = run_preflight(inventory, "-vvv")
    assert_refused_before_hosts(
        rc,
        out,
        "bundle.yml: missing from %s" % bundle,
        "Fix: build the bundle again: kunlun-fleet bundle build %s --vendor VDIR" % bundle,
    )
    assert key not in out, "the API key appears in preflight's -vvv output"
    assert become not in out, "the become password appears in preflight's -vvv output"
    assert registry not in out, "the registry password appears in preflight's -vvv output"


def test_facts_of_an_earlier_run_are_not_unknown_variables(inventory, run_preflight, tmp_path):
    """A re-run's host variables hold the facts the fact cache kept (xpu_info's xpu_*): they
    are no inventory variable, so no 'declared by no role' warning names them, while a
    variable really unknown still gets one."""
    pb = tmp_path / "facts.yml"
    pb.write_text(
        "- hosts: p800-a01\n  gather_facts: false\n  tasks:\n"
        "    - ansible.builtin.set_fact:\n        xpu_processes: []\n        xpu_smi_path: /usr/local/bin/xpu-smi\n"
        "        cacheable: true\n"
    )
    env = dict(
        os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_CACHE_PLUGIN_CONNECTION=str(tmp_path / "facts")
    )
    cached = subprocess.run(
        [str(ROOT / ".venv/bin/ansible-playbook"), "-i", str(inventory.path), str(pb)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert cached.returncode == 0, cached.stdout + cached.stderr
    inventory.update("host_vars/p800-a01.yml", site_rack_label="r7")
    rc, out = run_preflight(inventory)
    assert "variable site_rack_label is declared by no role" in out, out[-4000:]
    assert "xpu_processes" not in out and "xpu_smi_path" not in out, out[-4000:]


# inventory_check lists every problem of the inventory in one message
# (library/inventory_check.py), so one run with several mistakes proves each refusal by its
# own message. (Each used to be a run of its own: an empty gateways group, two hosts on one
# address, a boolean written as a string, a misspelt variable, a missing host variable.)
def test_inventory_mistakes_are_each_refused_with_the_fix(inventory, run_preflight):
    hosts = inventory.hosts()
    hosts["all"]["children"]["gateways"]["hosts"] = {}
    hosts["all"]["children"]["xpu_servers"]["hosts"]["p800-a02"]["ansible_host"] = "10.20.1.11"
    inventory.save("hosts.yml", hosts)
    # A copy of the pinned serving arguments (it would shadow the pins and keep stale values),
    # a flag by the retired serve_extra_args, and a value the serve role works out itself.
    inventory.update(
        "group_vars/all/stack.yml",
        kunlun_stack_allow_unvalidated="false",
        kunlun_stack_devce_count=8,
        kunlun_stack_serving=stack_defaults_serving(),
        serve_extra_args=["--disable-log-requests"],
        serve_image_ref="kunlun-serving:mine",
    )
    (inventory.path / "host_vars/p800-a03.yml").unlink()
    rc, out = run_preflight(inventory)
    assert_refused_before_hosts(
        rc,
        out,
        "group gateways has no hosts: add at least one host under gateways in hosts.yml",
        "p800-a01 and p800-a02 share the address 10.20.1.11",
        "kunlun_stack_allow_unvalidated is the string 'false'",
        "write false without quotes",
        "unknown variable kunlun_stack_devce_count",
        "did you mean kunlun_stack_device_count",
        "host p800-a03 (group xpu_servers) does not define storage_data_disks",
        "kunlun_stack_serving is set (on gw-01, p800-a01",
        "set kunlun_stack_serving_overrides to only the arguments that differ",
        "give each flag by its vllm name in kunlun_stack_serving_overrides",
        "serve_image_ref is set",
        "the serve role derives it (roles/serve/vars/main.yml)",
    )


DRIVER = "drivers/xre-Linux-x86_64-5.0.21.26.run"


def driver_bundle(tmp_path, digest, installer=None, index=True):
    """A bundle whose manifest lists the driver's installer with `digest`, and whose
    bundle.yml maps the driver pin to it."""
    bundle = tmp_path / "bundle"
    (bundle / "drivers").mkdir(parents=True)
    if installer is not None:
        (bundle / DRIVER).write_text(installer)
    (bundle / "MANIFEST.sha256").write_text("%s  %s\n" % (digest, DRIVER))
    if index:
        (bundle / "bundle.yml").write_text(
            yaml.safe_dump(
                {
                    "format": 1,
                    "artifacts": {
                        "driver": {"path": DRIVER, "installer": "xre", "version": "5.0.21.26", "sha256": digest}
                    },
                }
            )
        )
    return bundle


# bundle_check names every file that is wrong in one message, so one run proves both
# refusals (each used to be a run of its own). The bundle without its index:
# test_secrets_are_never_printed_and_a_bundle_without_its_index_is_refused.
def test_bundle_missing_file_and_checksum_mismatch(inventory, run_preflight, tmp_path):
    bundle = driver_bundle(tmp_path, "0" * 64)
    (bundle / "wheels").mkdir()
    (bundle / "wheels/cocopod.whl").write_text("not the wheel\n")
    with open(bundle / "MANIFEST.sha256", "a") as fh:
        fh.write("%s  wheels/cocopod.whl\n" % ("1" * 64))
    inventory.update("group_vars/all/stack.yml", kunlun_stack_bundle_dir=str(bundle))
    rc, out = run_preflight(inventory)
    assert_refused_before_hosts(
        rc,
        out,
        "drivers/xre-Linux-x86_64-5.0.21.26.run: listed in the manifest but missing",
        "wheels/cocopod.whl: checksum mismatch: sha256",
        "the manifest says 1111",
    )


def test_ansible_version_range(inventory, run_preflight):
    inventory.update("group_vars/all/preflight.yml", preflight_ansible_max_version="2.19.0")
    rc, out = run_preflight(inventory)
    assert rc != 0
    assert_refused_before_hosts(rc, out, "is outside the tested range", "make setup")


def inventory_components():
    import copy

    from kunlun_fleet.bundle import load_pins

    return copy.deepcopy(load_pins()["kunlun_stack_components"])


def stack_defaults_serving():
    from kunlun_fleet.bundle import load_pins

    return dict(load_pins()["kunlun_stack_serving"])
