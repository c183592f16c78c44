"""plugins/filter/acceptance.py and image.py: the acceptance stage's verdict lines and the
serving image's tag, as the roles compute them; the report's lines and the tag's inputs as the
image role holds them, pinned against the Jinja the roles assembled them with before (rendered
by Ansible's own templar, with these filters)."""

import hashlib
import json

import pytest
from ansible.template import Templar, trust_as_template

from plugins.filter.acceptance import acceptance_line, acceptance_lines
from plugins.filter.image import image_build_tag, image_tag


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


def jinja(expr, **variables):
    """The expression as a role renders it, with the project's filters beside Ansible's."""
    templar = Templar(variables=variables)
    templar.environment.filters.update({"acceptance_line": acceptance_line, "image_tag": image_tag})
    return templar.template(trust_as_template(expr))


# roles/acceptance/tasks/main.yml and roles/image/tasks/validate.yml, as they were.
LINES_JINJA = """{{ ansible_play_hosts | map('extract', hostvars, 'acceptance_line') | list
   + ([acceptance_fleet | acceptance_line('fleet endpoint ' ~ acceptance_gateway_url, acceptance_single_stream_target,
        tokens=false)]
      if acceptance_gateway_url | length > 0 else []) }}"""
TAG_JINJA = """{{ image_dockerfile | image_tag(image_artifacts | map('extract', image_sums) | list,
   image_sums[kunlun_stack_bundle_files.base_image] if image_registry | length == 0 else kunlun_stack_base_image,
   image_ca_texts) }}"""

HOSTVARS = {
    "kf-node-1": {
        "acceptance_line": "PASS kf-node-1: single stream 41.3 tok/s (target 30), first token 0.21 s, 256 tokens"
    },
    "kf-node-2": {
        "acceptance_line": "FAIL kf-node-2: single stream 0.0 tok/s (target 30), first token 0.00 s, 0 tokens"
    },
}
FLEET = {"tokens_per_s": 35, "ttft_s": 0.4, "completion_tokens": 9, "changed": False}
SKIPPED = {"changed": False, "skipped": True, "skip_reason": "Conditional result was False", "false_condition": "x"}


@pytest.mark.parametrize(
    "fleet, url",
    [
        (FLEET, "https://gw:8443"),
        ({"failed": True, "msg": "connection refused"}, "http://gw:8080"),
        (SKIPPED, ""),
    ],
)
@pytest.mark.parametrize("hosts", [["kf-node-2", "kf-node-1"], ["kf-node-1"], []])
def test_the_report_lines_are_the_hosts_then_the_fleet_endpoints(fleet, url, hosts):
    expected = jinja(
        LINES_JINJA,
        ansible_play_hosts=hosts,
        hostvars=HOSTVARS,
        acceptance_fleet=fleet,
        acceptance_gateway_url=url,
        acceptance_single_stream_target=30,
    )
    got = acceptance_lines(hosts, HOSTVARS, fleet, url, 30)
    assert got == expected and type(got) is list


def test_without_a_fleet_endpoint_its_skipped_measurement_is_not_read():
    assert acceptance_lines(["h"], {"h": {"acceptance_line": "PASS h: ..."}}, None, "", 30) == ["PASS h: ..."]
    assert acceptance_lines([], HOSTVARS, FLEET, "https://gw:8443", 30) == [
        "PASS fleet endpoint https://gw:8443: single stream 35.0 tok/s (target 30), first token 0.40 s"
    ]


SUMS = {
    "wheels/vllm-0.15.1.whl": "1" * 64,
    "src/vllm-kunlun.tar.gz": "2" * 64,
    "images/base.tar": "3" * 64,
}
FILES = {"vllm": "wheels/vllm-0.15.1.whl", "vllm_kunlun": "src/vllm-kunlun.tar.gz", "base_image": "images/base.tar"}


@pytest.mark.parametrize(
    "registry, files",
    [
        ("", FILES),
        ("registry.example:5000", FILES),
        # pulled from a registry, the bundle need not hold the base image at all
        ("registry.example:5000", {k: v for k, v in FILES.items() if k != "base_image"}),
    ],
)
@pytest.mark.parametrize("ca_texts", [[], ["-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"]])
def test_the_build_tag_is_the_tag_the_role_assembled(registry, files, ca_texts):
    artifacts = ["src/vllm-kunlun.tar.gz", "wheels/vllm-0.15.1.whl"]
    base_image = "registry.example:5000/ubuntu:22.04"
    expected = jinja(
        TAG_JINJA,
        image_dockerfile="FROM base\n",
        image_artifacts=artifacts,
        image_sums=SUMS,
        kunlun_stack_bundle_files=files,
        image_registry=registry,
        kunlun_stack_base_image=base_image,
        image_ca_texts=ca_texts,
    )
    got = image_build_tag("FROM base\n", artifacts, SUMS, ca_texts, registry, base_image, files)
    assert got == expected
    base = SUMS["images/base.tar"] if not registry else base_image
    assert got == image_tag("FROM base\n", ["2" * 64, "1" * 64], base, ca_texts)


def test_an_artifact_without_a_sum_is_an_error():
    with pytest.raises(KeyError):
        image_build_tag("FROM x\n", ["missing.whl"], SUMS, [], "", "b", FILES)
