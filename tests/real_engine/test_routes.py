"""Every route the real vLLM 0.15.1 registers, read from its program at test time
(route_table.py), served by the stand-in with the same authentication and the same answers:
each route is sent contract.route_requests (no key, a wrong key, the key, and the body
refusals) on both servers and contract.route_answer is compared. A route a new pin adds
to the real server and the stand-in lacks fails here, named."""

import json

import pytest

import contract

pytestmark = pytest.mark.slow

AUTHENTICATION = "vllm.entrypoints.openai.api_server.AuthenticationMiddleware"


def test_the_route_table_is_what_the_real_server_serves(real_routes, clients):
    """The table read from build_app is the running server's: its /openapi.json lists the
    same routes with the same methods, and the API-key middleware is installed (the key
    comes from the role's --config file)."""
    listed = {}
    for route in real_routes["routes"]:
        if route["in_schema"]:
            listed.setdefault(route["path"], set()).update(route["methods"])
    doc = clients["real"].call("GET", "/openapi.json", key=None).json()
    served = {path: {m.upper() for m in methods} for path, methods in doc["paths"].items()}
    assert served == listed
    assert AUTHENTICATION in real_routes["middleware"], real_routes["middleware"]


def test_every_route_answers_as_on_the_real_server(real_routes, clients):
    """Same status, media type and error or shape, per route and per key; the real server asks
    for the key exactly on the paths under /v1 (AuthenticationMiddleware.__call__)."""
    differences, missing, auth = [], {}, []
    real_client = clients["real"]
    for route in real_routes["routes"]:
        for case, method, path, kw in contract.route_requests(real_client, route):
            replies = {name: client.call(method, path, **kw) for name, client in clients.items()}
            real, standin = (contract.route_answer(replies[n]) for n in ("real", "standin"))
            where = "%s %s (%s)" % (method, path, case)
            if case == "no key" and (real["status"] == 401) != path.startswith("/v1"):
                auth.append("%s: %s" % (where, real["status"]))
            if contract.routed(replies["real"]) and not contract.routed(replies["standin"]):
                missing.setdefault("%s %s" % (method, path), []).append(case)
            elif real != standin:
                differences.append(
                    "%s\n  real vLLM 0.15.1: %s\n  stand-in:         %s"
                    % (where, json.dumps(real, sort_keys=True)[:1500], json.dumps(standin, sort_keys=True)[:1500])
                )
    assert not auth, "the real server no longer asks for the key on the paths under /v1 only:\n" + "\n".join(auth)
    assert not missing, "routes of the real server the stand-in does not serve:\n" + "\n".join(
        "%s (%s)" % (where, ", ".join(cases)) for where, cases in missing.items()
    )
    assert not differences, "\n".join(differences)
