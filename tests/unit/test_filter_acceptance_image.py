"""plugins/filter/acceptance.py and image.py: the acceptance stage's verdict lines and the
serving image's tag, as the roles compute them."""

import hashlib
import json

from plugins.filter.acceptance import acceptance_line
from plugins.filter.image import image_tag


def test_a_host_at_or_over_the_target_passes_with_its_figures():
    result = {"tokens_per_s": 41.26, "ttft_s": 0.214, "completion_tokens": 256, "changed": False}
    assert acceptance_line(result, "kf-node-1", 30) == (
        "PASS kf-node-1: single stream 41.3 tok/s (target 30), first token 0.21 s, 256 tokens"
    )
    assert acceptance_line(dict(result, tokens_per_s=30.0), "kf-node-1", "30").startswith("PASS ")


def test_a_slow_or_failed_measurement_fails_and_says_why():
    assert acceptance_line({"tokens_per_s": 29.96, "ttft_s": 1.5, "completion_tokens": 64}, "h", 30.0) == (
        "FAIL h: single stream 30.0 tok/s (target 30.0), first token 1.50 s, 64 tokens"
    )
    failed = {"failed": True, "msg": "HTTP 401 from http://10.0.0.5:8000/v1/completions"}
    assert acceptance_line(failed, "h", 30) == (
        "FAIL h: single stream 0.0 tok/s (target 30), first token 0.00 s, 0 tokens"
        " - HTTP 401 from http://10.0.0.5:8000/v1/completions"
    )


def test_the_fleet_line_names_the_endpoint_without_a_token_count():
    line = acceptance_line(
        {"tokens_per_s": 35, "ttft_s": 0.4, "completion_tokens": 9}, "fleet endpoint https://gw:8443", 30, tokens=False
    )
    assert line == "PASS fleet endpoint https://gw:8443: single stream 35.0 tok/s (target 30), first token 0.40 s"


def test_the_tag_is_the_hash_ansible_gave_before_so_a_fleet_keeps_its_tag():
    """The reference is computed with Ansible's own to_json and hash filters, as the image role
    computed the tag until it moved into the filter."""
    from ansible.template import Templar, trust_as_template

    inputs = {
        "dockerfile": "FROM base\nRUN echo ü\n",
        "artifacts": ["a" * 64, "b" * 64],
        "base": "c" * 64,
        "ca_texts": ["-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"],
    }
    reference = Templar(variables=inputs).template(
        trust_as_template(
            "{{ ({'dockerfile': dockerfile, 'artifacts': artifacts, 'base': base,"
            " 'ca': ca_texts | map('ansible.builtin.hash', 'sha256') | list} | to_json(sort_keys=true)"
            " | ansible.builtin.hash('sha256'))[:16] }}"
        )
    )
    assert image_tag(inputs["dockerfile"], inputs["artifacts"], inputs["base"], inputs["ca_texts"]) == reference


def test_every_input_changes_the_tag():
    base = ("FROM x\n", ["1" * 64], "2" * 64, [])
    tag = image_tag(*base)
    assert len(tag) == 16 and int(tag, 16) >= 0
    assert image_tag(*base) == tag
    variants = [
        ("FROM y\n", ["1" * 64], "2" * 64, []),
        ("FROM x\n", ["3" * 64], "2" * 64, []),
        ("FROM x\n", ["1" * 64], "registry:5000/base:1", []),
        ("FROM x\n", ["1" * 64], "2" * 64, ["ca"]),
    ]
    tags = {image_tag(*v) for v in variants}
    assert tag not in tags and len(tags) == len(variants)
    expected = hashlib.sha256(
        json.dumps({"artifacts": ["1" * 64], "base": "2" * 64, "ca": [], "dockerfile": "FROM x\n"}).encode()
    ).hexdigest()[:16]
    assert tag == expected
