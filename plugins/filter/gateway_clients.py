# -*- coding: utf-8 -*-
# Copyright: kunlun-fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The gateway's client keys (docs/gateway.md "Client keys"): what is wrong with them, and
the HAProxy map file that names the client of each key. No message here ever holds a key:
the problems name the client, the map file goes to a task with no_log.
Documentation: gateway_client_problems.yml and gateway_client_map.yml beside this file."""

from __future__ import absolute_import, division, print_function

import re

__metaclass__ = type

# The same rules as kunlun_fleet/vault.py (the CLI refuses what the role would refuse;
# tests/unit/test_gateway_clients.py holds them equal).
NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}$")
# A bearer token (RFC 6750's b64token): one word of these, so that it is one key of the
# map file and HAProxy's http_auth_bearer returns it whole.
KEY_RE = re.compile(r"^[A-Za-z0-9._~+/-]+=*$")
KEY_MIN = 16
KEY_MAX = 512
FLEET = "fleet"


def _key_problem(key):
    """Why `key` cannot be a client key, in words that do not repeat it; None if it can."""
    if not isinstance(key, str):
        return "is not a string"
    if len(key) < KEY_MIN:
        return "is shorter than %d characters" % KEY_MIN
    if len(key) > KEY_MAX:
        return "is longer than %d characters" % KEY_MAX
    if not KEY_RE.match(key):
        return "has characters a bearer token cannot carry (only letters, digits and - . _ ~ + / and a trailing =)"
    return None


def gateway_client_problems(client_keys, fleet_key, previous_key=""):
    """Every reason the clients `client_keys` ({name: key}) and the fleet key (and the one a
    rotation replaces, `previous_key`, when not empty) cannot make the gateway's map, each
    naming the client and its fix, never a key; [] when they can."""
    fix = "Fix it in the inventory's vault (kunlun-fleet api-key -i INV revoke NAME, then add NAME)."
    if client_keys is None:
        client_keys = {}
    if not isinstance(client_keys, dict):
        return [
            "gateway_client_keys (vault_kunlun_client_keys) must be a mapping of client name to key, not a %s. %s"
            % (type(client_keys).__name__, fix)
        ]
    problems = []
    reason = _key_problem(fleet_key)
    if reason:
        problems.append(
            "the fleet key (vault_kunlun_api_key) %s: the gateway cannot check it. Fix: make the fleet's key with "
            "kunlun-fleet api-key -i INV." % reason
        )
    if previous_key:
        reason = _key_problem(previous_key)
        if reason:
            problems.append(
                "the fleet key a rotation replaces (vault_kunlun_api_key_previous) %s. Fix: finish the rotation with "
                "kunlun-fleet api-key -i INV rotate --finish." % reason
            )
        elif previous_key == fleet_key:
            problems.append(
                "the fleet key a rotation replaces (vault_kunlun_api_key_previous) is the fleet key itself. Fix: "
                "kunlun-fleet api-key -i INV rotate --finish."
            )
    seen = {}
    for name in sorted(client_keys, key=str):
        key = client_keys[name]
        if not isinstance(name, str) or not NAME_RE.match(name):
            problems.append(
                "client name %r is not a name: lowercase letters, digits, - and _, starting with a letter or digit, "
                "at most 63 characters. %s" % (name, fix)
            )
            continue
        if name == FLEET:
            problems.append("client name 'fleet' is the fleet key's own: choose another name. %s" % fix)
            continue
        reason = _key_problem(key)
        if reason:
            problems.append("client %s's key %s. %s" % (name, reason, fix))
            continue
        if key == fleet_key or (previous_key and key == previous_key):
            problems.append(
                "client %s's key is the fleet key (vault_kunlun_api_key%s): give it a key of its own. %s"
                % (name, "" if key == fleet_key else "_previous", fix)
            )
            continue
        if key in seen:
            problems.append(
                "clients %s and %s have the same key: give each a key of its own. %s" % (seen[key], name, fix)
            )
            continue
        seen[key] = name
    return problems


def gateway_client_map(client_keys, fleet_key, previous_key=""):
    """The map file HAProxy looks each request's bearer token up in: one line `<key> <client
    name>` per client of `client_keys` ({name: key}), sorted by name, and the fleet key as the
    client `fleet` (during a rotation the key it replaces too, as `fleet`). Refuses (without
    naming any key) what gateway_client_problems refuses."""
    problems = gateway_client_problems(client_keys, fleet_key, previous_key)
    if problems:
        raise ValueError("gateway_client_map: %s" % " ".join(problems))
    lines = [
        "# kunlun-fleet: the gateway's client keys, bearer token -> client name (HAProxy map file).",
        "# Written by the gateway role from the inventory's vault; 0600 root. Do not edit.",
        "%s %s" % (fleet_key, FLEET),
    ]
    if previous_key:
        lines.append("%s %s" % (previous_key, FLEET))
    for name in sorted(client_keys or {}):
        lines.append("%s %s" % (client_keys[name], name))
    return "\n".join(lines) + "\n"


class FilterModule:
    def filters(self):
        return {"gateway_client_problems": gateway_client_problems, "gateway_client_map": gateway_client_map}
