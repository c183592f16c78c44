"""plugins/filter/gateway.py: the worker URLs the router balances over and the gateways a drain
or a restore changes, pinned against the Jinja the gateway role computed them with before
(rendered by Ansible's own templar)."""

import pytest
from ansible.template import Templar, trust_as_template

from plugins.filter.gateway import gateway_worker_todo, gateway_worker_urls

# roles/gateway/tasks/controller.yml and worker.yml, as they were.
URLS_JINJA = """{{ gateway_workers if gateway_workers | length > 0 else
   (groups[gateway_worker_group] | default([]) | map('ansible.builtin.extract', kunlun_stack_worker_urls) | list) }}"""
TODO_JINJA = """{{ gateway_worker_answering | selectattr('json.urls', 'contains', gateway_worker_url)
     | map(attribute='gateway_gw') | list
   if gateway_worker_state == 'absent' else
   gateway_worker_answering | rejectattr('json.urls', 'contains', gateway_worker_url)
     | map(attribute='gateway_gw') | list }}"""

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


def answer(gw, urls):
    return {"gateway_gw": gw, "status": 200, "json": {"urls": urls}, "changed": False}


URL = "http://10.0.0.1:8000"
ANSWERS = [
    [],
    [answer("gw1", [URL, "http://10.0.0.2:8000"]), answer("gw2", []), answer("gw3", [URL])],
    [answer("gw1", ["http://10.0.0.2:8000"])],
    # a longer URL with the worker's as a prefix is another worker
    [answer("gw1", [URL + "0"])],
]


@pytest.mark.parametrize("answering", ANSWERS)
@pytest.mark.parametrize("state", ["absent", "present"])
def test_drain_where_listed_restore_where_not_as_the_jinja_did(answering, state):
    expected = jinja(TODO_JINJA, gateway_worker_answering=answering, gateway_worker_url=URL, gateway_worker_state=state)
    assert gateway_worker_todo(answering, URL, state) == expected


def test_the_gateways_to_change_in_their_order():
    answering = ANSWERS[1]
    assert gateway_worker_todo(answering, URL, "absent") == ["gw1", "gw3"]
    assert gateway_worker_todo(answering, URL, "present") == ["gw2"]
    # already in the wanted state everywhere: nothing to change (an unchanged re-run)
    assert gateway_worker_todo([answer("gw1", [])], URL, "absent") == []
    assert gateway_worker_todo([answer("gw1", [URL])], URL, "present") == []


def test_an_answer_without_urls_fails_as_the_jinja_did_and_names_the_gateway():
    odd = [{"gateway_gw": "gw1", "status": 200, "json": {"workers": []}}]
    with pytest.raises(Exception, match="urls"):
        jinja(TODO_JINJA, gateway_worker_answering=odd, gateway_worker_url=URL, gateway_worker_state="absent")
    with pytest.raises(ValueError, match="gw1 answered /list_workers without a list of urls"):
        gateway_worker_todo(odd, URL, "absent")
