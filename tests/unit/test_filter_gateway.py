"""plugins/filter/gateway.py: the worker URLs the router balances over, pinned against the
Jinja the gateway role computed them with before (rendered by Ansible's own templar). The
gateways a drain or a restore changes are the module's (tests/unit/test_gateway_worker.py)."""

import pytest
from ansible.template import Templar, trust_as_template

from plugins.filter.gateway import gateway_worker_urls

# roles/gateway/tasks/controller.yml, as it was.
URLS_JINJA = """{{ gateway_workers if gateway_workers | length > 0 else
   (groups[gateway_worker_group] | default([]) | map('ansible.builtin.extract', kunlun_stack_worker_urls) | list) }}"""
WORKER_URLS = {"a1": "http://10.0.0.1:8000", "a2": "http://10.0.0.2:8000", "gw": "http://10.0.0.9:8000"}


def jinja(expr, **variables):
    return Templar(variables=variables).template(trust_as_template(expr))


@pytest.mark.parametrize(
    "workers, groups",
    [
        ([], {"xpu_servers": ["a2", "a1"]}),
        (["http://192.0.2.7:8000"], {"xpu_servers": ["a1"]}),
        (["http://192.0.2.7:8000", "http://192.0.2.8:8000"], {}),
        ([], {"xpu_servers": []}),
        ([], {}),
    ],
)
def test_the_urls_given_else_the_worker_groups_in_its_order(workers, groups):
    expected = jinja(
        URLS_JINJA,
        gateway_workers=workers,
        groups=groups,
        gateway_worker_group="xpu_servers",
        kunlun_stack_worker_urls=WORKER_URLS,
    )
    got = gateway_worker_urls(workers, groups.get("xpu_servers", []), WORKER_URLS)
    assert got == expected and type(got) is list
    if workers:
        assert got is workers


def test_a_group_host_without_a_url_is_an_error_that_names_it():
    with pytest.raises(ValueError, match="host a3 has no worker URL"):
        gateway_worker_urls([], ["a1", "a3"], WORKER_URLS)
