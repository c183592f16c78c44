"""plugins/filter/gateway_clients.py and the haproxy.cfg lines that use its map: the client
keys' problems (never naming a key), the map file, the template's key check. HAProxy itself
runs them in test_gateway_clients_haproxy.py."""

import json
import re
import secrets

import pytest
from test_gateway_proxy_config import lines, render

from kunlun_fleet import vault
from plugins.filter import gateway_clients
from plugins.filter.gateway_clients import gateway_client_map, gateway_client_problems

FLEET = "kf-" + "F" * 43
A, B = "kf-" + "a" * 43, "kf-" + "b" * 43


def test_the_map_names_each_key_s_client_the_fleet_key_first():
    text = gateway_client_map({"team-b": B, "team-a": A}, FLEET)
    entries = [line.split() for line in text.splitlines() if line and not line.startswith("#")]
    assert entries == [[FLEET, "fleet"], [A, "team-a"], [B, "team-b"]]
    assert text.endswith("\n")
    # Only the fleet key, for a site with no team key (and none given at all).
    for none in ({}, None):
        assert [line.split() for line in gateway_client_map(none, FLEET).splitlines() if line[:1] != "#"] == [
            [FLEET, "fleet"]
        ]


@pytest.mark.parametrize(
    "clients, fleet, expected",
    [
        ({"Team-A": A}, FLEET, ["client name 'Team-A' is not a name"]),
        ({"-a": A}, FLEET, ["client name '-a' is not a name"]),
        ({"a" * 64: A}, FLEET, ["is not a name"]),
        ({"fleet": A}, FLEET, ["client name 'fleet' is the fleet key's own"]),
        ({"team-a": "short"}, FLEET, ["client team-a's key is shorter than 16 characters"]),
        ({"team-a": "kf-with space-0123456789"}, FLEET, ["client team-a's key has characters a bearer token cannot"]),
        ({"team-a": "kf-with#hash-0123456789"}, FLEET, ["client team-a's key has characters"]),
        ({"team-a": 12345678901234567890}, FLEET, ["client team-a's key is not a string"]),
        ({"team-a": FLEET}, FLEET, ["client team-a's key is the fleet key"]),
        ({"team-a": A, "team-b": A}, FLEET, ["clients team-a and team-b have the same key"]),
        ({}, "short", ["the fleet key (vault_kunlun_api_key) is shorter than 16"]),
        (["team-a"], FLEET, ["must be a mapping of client name to key, not a list"]),
    ],
)
def test_each_problem_names_the_client_and_the_fix_never_a_key(clients, fleet, expected):
    problems = gateway_client_problems(clients, fleet)
    assert len(problems) == len(expected), problems
    for problem, text in zip(problems, expected, strict=True):
        assert text in problem
        assert "Fix" in problem
    keys = [FLEET, A, "kf-with space-0123456789", "kf-with#hash-0123456789"]
    assert not any(key in " ".join(problems) for key in keys)
    with pytest.raises(ValueError) as refused:
        gateway_client_map(clients, fleet)
    assert not any(key in str(refused.value) for key in keys)


def test_good_names_and_keys_pass():
    clients = {"a": A, "team_7-x": B, "9" * 63: "kf-" + "c" * 40 + "=="}
    assert gateway_client_problems(clients, FLEET) == []


def test_the_cli_and_the_role_have_the_same_name_rule():
    assert vault.NAME_RE.pattern == gateway_clients.NAME_RE.pattern
    assert vault.FLEET == gateway_clients.FLEET
    # The CLI's keys are keys the role accepts.
    key = "kf-" + secrets.token_urlsafe(32)
    assert gateway_client_problems({"team-a": key}, FLEET) == []


def test_haproxy_checks_the_key_for_the_api_only_and_sends_the_fleet_key_on():
    cfg = lines(render())
    check = "http-request set-var(txn.kunlun_client) http_auth_bearer,map_str(/etc/haproxy/kunlun-clients.map) if api"
    assert check in cfg
    refuse = next(line for line in cfg if line.startswith("http-request return status 401"))
    assert refuse.endswith("if api !{ var(txn.kunlun_client) -m found }")
    body = re.search(r"string '(.*)' if api", refuse).group(1)
    error = json.loads(body)["error"]
    assert error["code"] == "invalid_api_key" and error["type"] == "invalid_request_error"
    swap = (
        'http-request set-header Authorization "Bearer %[str(internal),map_str(/etc/haproxy/kunlun-internal.map)]"'
        " if api"
    )
    assert swap in cfg
    assert "http-request set-header X-Kunlun-Client %[var(txn.kunlun_client)] if api" in cfg
    assert "http-request del-header X-Kunlun-Client unless api" in cfg
    assert "http-request capture var(txn.kunlun_client) len 64 if api" in cfg
    # The allow-list's refusals come first: a refused path never reaches the key check.
    assert cfg.index("http-request deny deny_status 403 unless api or health or metrics") < cfg.index(check)
    assert cfg.index(check) < cfg.index(refuse) < cfg.index(swap)


def test_the_map_paths_follow_the_variables():
    cfg = "\n".join(lines(render(gateway_proxy_client_map="/srv/c.map", gateway_proxy_internal_map="/srv/i.map")))
    assert "map_str(/srv/c.map)" in cfg and "map_str(/srv/i.map)" in cfg
    assert "/etc/haproxy/kunlun-" not in cfg
