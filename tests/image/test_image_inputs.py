"""playbooks/image.yml refuses bad input on the controller (nothing built, no host
contacted), and the image tag is a hash of exactly its inputs."""

import copy
import os
import re
import shutil

import yaml

from kunlun_fleet.sim.artifacts.wheel import build_wheel

from image_helpers import PINS, base_archive, write_manifest


def refused(rc, out, *needles):
    assert rc != 0, out[-3000:]
    for needle in needles:
        assert needle in out, "expected %r in:\n%s" % (needle, out[-4000:])
    assert "UNREACHABLE" not in out and "Build | " not in out and "Distribute | " not in out, out[-4000:]


# bundle_check names every file that is wrong, and stack_rules every bad pin, in one
# message: one run each proves both refusals (each used to be a run of its own).
def test_checksum_mismatch_and_missing_artifact_are_refused(site):
    tampered, gone = site.files()["cocopod"], site.files()["vllm_kunlun"]
    (site.bundle / gone).unlink()
    write_manifest(site.bundle)
    (site.bundle / tampered).write_bytes(b"tampered\n")
    rc, out = site.run()
    refused(rc, out, tampered, "the manifest says", "Fix:")
    assert re.search(re.escape(gone) + r"[^\n]*missing", out), out[-4000:]


def test_known_bad_pins_are_refused_by_stack_rules_even_when_unvalidated_pins_are_allowed(site):
    comps = copy.deepcopy(PINS["kunlun_stack_components"])
    comps["transformers"]["version"] = "5.5.3"
    comps["vllm_kunlun"].update(version="0.25.1.dev0", commit="2fda97b")
    site.vars.update(kunlun_stack_components=comps, kunlun_stack_allow_unvalidated=True)
    refused(*site.run(), "Validate | The pins pass", "known-bad combination", "max_pixels", "2fda97b", "Fix:")


def test_base_image_missing_and_no_registry_is_refused(site):
    site.drop("base_image")
    refused(*site.run(), "has no source: image_registry is empty", PINS["kunlun_stack_base_image"], "Fix:")


def test_no_bundle_is_refused(site):
    site.vars["kunlun_stack_bundle_dir"] = ""
    refused(*site.run(), 'kunlun_stack_bundle_dir is ""', "Fix:")


def test_a_registry_that_does_not_hold_the_base_image_is_refused(site):
    site.vars["image_registry"] = "registry.example:5000"
    refused(*site.run(), "is not in it", PINS["kunlun_stack_base_image"].split("/")[0], "Fix:")


def test_tag_is_stable_and_follows_every_input(site, tmp_path):
    """The tag of each state of the inputs, each state changed on top of the one before,
    all computed in one run (a run costs about 5 CPU-s): a play per state, with a copy of
    that state's bundle and its variables in the play's vars, on a host of its own (the
    facts kunlun_stack sets once per play, the bundle's index among them, are the host's
    for the rest of the run; no host is contacted). The same inputs give the same tag (two
    plays); across runs, the e2e's second run (changed=0) shows it. With a registry, the
    base image archive is not needed (the last state)."""
    inventory_vars = dict(site.vars)
    plays = []
    states = site.hosts["all"]["children"].setdefault("tag_states", {"hosts": {}})["hosts"]

    def state(name):
        bundle = tmp_path / ("bundle-" + name)
        shutil.copytree(site.bundle, bundle)
        play_vars = {k: v for k, v in site.vars.items() if inventory_vars.get(k) != v}
        states["tag-" + name] = {"ansible_host": "192.0.2.%d" % (100 + len(plays))}
        plays.append(
            {
                "name": name,
                "hosts": "tag-" + name,
                "gather_facts": False,
                "vars": dict(copy.deepcopy(play_vars), kunlun_stack_bundle_dir=str(bundle)),
                "tasks": [
                    {"ansible.builtin.include_role": {"name": "image", "tasks_from": "validate.yml"}},
                    {"ansible.builtin.debug": {"msg": "IMAGE_TAG %s={{ image_tag }}" % name}},
                ],
            }
        )

    state("base")
    state("again")
    # an artifact's bytes (and so its manifest line): another build of the same triton
    triton = PINS["kunlun_stack_components"]["triton"]
    build_wheel(
        str(site.vendor / os.path.basename(site.files()["triton"])),
        "triton",
        triton["version"],
        {"triton/__init__.py": b"# another triton build\n"},
        "cp310-cp310-linux_x86_64",
    )
    site.rebuild()
    state("artifact")
    # the base image archive: another save of the same image
    base_archive(site.vendor / "vllm-kunlun-exp-base.tar", [PINS["kunlun_stack_base_image"]], extra=b"another base")
    site.rebuild()
    state("base-image")
    # a pin (an unvalidated but not known-bad one, allowed), with the vendor's file of it
    comps = copy.deepcopy(PINS["kunlun_stack_components"])
    comps["xspeedgate_ops"]["version"] = "0.0.1+torch25"
    (site.vendor / os.path.basename(site.files()["xspeedgate_ops"])).unlink()
    build_wheel(
        str(site.vendor / "xspeedgate_ops-0.0.1+torch25-cp310-cp310-linux_x86_64.whl"),
        "xspeedgate_ops",
        "0.0.1+torch25",
        {"xspeedgate_ops/__init__.py": b""},
        "cp310-cp310-linux_x86_64",
    )
    site.vars.update(kunlun_stack_components=comps, kunlun_stack_allow_unvalidated=True)
    site.rebuild()
    state("pin")
    # an extra CA certificate
    ca = tmp_path / "site-ca.crt"
    ca.write_text("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")
    site.vars["image_ca_certificates"] = [str(ca)]
    state("ca")
    # the base image from a registry: no archive in the bundle, the credentials never logged
    site.drop("base_image")
    site.vars.update(
        image_registry=PINS["kunlun_stack_base_image"].split("/")[0],
        image_registry_username="u",
        image_registry_password="s3cret-never-logged",
    )
    state("registry")

    site.vars = inventory_vars
    playbook = tmp_path / "tags.yml"
    playbook.write_text(yaml.safe_dump(plays, sort_keys=False))
    rc, out = site.run(playbook)
    assert rc == 0, out[-4000:]
    assert "s3cret-never-logged" not in out
    tags = dict(re.findall(r"IMAGE_TAG ([a-z-]+)=([0-9a-f]{16})", out))
    assert list(tags) == [p["name"] for p in plays], out[-4000:]
    assert tags.pop("again") == tags["base"]
    # every change gives a tag none of the states before it had
    assert len(set(tags.values())) == len(tags), tags
