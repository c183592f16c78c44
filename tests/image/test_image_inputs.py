"""playbooks/image.yml refuses bad input on the controller (nothing built, no host
contacted), and the image tag is a hash of exactly its inputs."""

import copy
import os
import re

from kunlun_fleet.sim.artifacts.wheel import build_wheel

from image_helpers import PINS, ROOT, base_archive, write_manifest

TAG_PLAYBOOK = ROOT / "tests/image/tag.yml"


def refused(rc, out, *needles):
    assert rc != 0, out[-3000:]
    for needle in needles:
        assert needle in out, "expected %r in:\n%s" % (needle, out[-4000:])
    assert "UNREACHABLE" not in out and "Build | " not in out and "Distribute | " not in out, out[-4000:]


def tag_of(site, *extra):
    rc, out = site.run(TAG_PLAYBOOK, *extra)
    assert rc == 0, out[-4000:]
    return re.search(r"IMAGE_TAG=([0-9a-f]{16})", out).group(1)


def test_checksum_mismatch_is_refused(site):
    rel = site.files()["cocopod"]
    (site.bundle / rel).write_bytes(b"tampered\n")
    refused(*site.run(), rel, "the manifest says", "Fix:")


def test_missing_artifact_is_refused(site):
    rel = site.files()["vllm_kunlun"]
    (site.bundle / rel).unlink()
    write_manifest(site.bundle)
    refused(*site.run(), rel, "missing", "Fix:")


def test_known_bad_pins_are_refused_by_stack_rules(site):
    comps = copy.deepcopy(PINS["kunlun_stack_components"])
    comps["transformers"]["version"] = "5.5.3"
    site.vars["kunlun_stack_components"] = comps
    refused(*site.run(), "Validate | The pins pass", "known-bad combination", "max_pixels", "Fix:")


def test_known_bad_is_refused_even_when_unvalidated_pins_are_allowed(site):
    comps = copy.deepcopy(PINS["kunlun_stack_components"])
    comps["vllm_kunlun"].update(version="0.25.1.dev0", commit="2fda97b")
    site.vars.update(kunlun_stack_components=comps, kunlun_stack_allow_unvalidated=True)
    refused(*site.run(), "2fda97b", "known-bad combination")


def test_base_image_missing_and_no_registry_is_refused(site):
    site.drop("base_image")
    refused(*site.run(), "has no source: image_registry is empty", PINS["kunlun_stack_base_image"], "Fix:")


def test_no_bundle_is_refused(site):
    site.vars["kunlun_stack_bundle_dir"] = ""
    refused(*site.run(), 'kunlun_stack_bundle_dir is ""', "Fix:")


def test_with_a_registry_the_base_archive_is_not_needed(site):
    site.drop("base_image")
    site.vars.update(
        image_registry=PINS["kunlun_stack_base_image"].split("/")[0],
        image_registry_username="u",
        image_registry_password="s3cret-never-logged",
    )
    rc, out = site.run(TAG_PLAYBOOK)
    assert rc == 0, out[-3000:]
    assert "s3cret-never-logged" not in out


def test_a_registry_that_does_not_hold_the_base_image_is_refused(site):
    site.vars["image_registry"] = "registry.example:5000"
    refused(*site.run(), "is not in it", PINS["kunlun_stack_base_image"].split("/")[0], "Fix:")


def test_tag_is_stable_and_follows_every_input(site, tmp_path):
    base = tag_of(site)
    assert tag_of(site) == base
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
    changed_artifact = tag_of(site)
    assert changed_artifact != base
    # the base image archive: another save of the same image
    base_archive(site.vendor / "vllm-kunlun-exp-base.tar", [PINS["kunlun_stack_base_image"]], extra=b"another base")
    site.rebuild()
    changed_base = tag_of(site)
    assert changed_base not in (base, changed_artifact)
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
    changed_pin = tag_of(site)
    assert changed_pin != changed_base
    # an extra CA certificate
    ca = tmp_path / "site-ca.crt"
    ca.write_text("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")
    site.vars["image_ca_certificates"] = [str(ca)]
    assert tag_of(site) not in (changed_pin,)
