#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: kunlun-fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: inventory_check
short_description: Validate the shape of a kunlun-fleet inventory before any host is touched
description:
  - Checks that the required groups have hosts, that each host of a group defines the variables
    the group needs, that no two hosts share an address, that booleans are not written as strings,
    that no variable is a misspelling of a known one, and that the inventory sets none of the
    variables kunlun-fleet works out itself (a role's C(vars/main.yml), which an inventory cannot
    override) or has replaced.
  - The known variables are the options of every role's C(meta/argument_specs.yml), so a new role
    variable is known as soon as its role declares it.
  - Runs on the controller, reads only its arguments, changes nothing; safe in check mode.
options:
  groups:
    description: The inventory's groups, as the C(groups) magic variable gives them.
    type: dict
    required: true
  hosts:
    description: For each host, the variables the inventory gives it (host and group vars).
    type: dict
    required: true
  required_groups:
    description: Groups that must hold at least one host.
    type: list
    elements: str
    default: [xpu_servers]
  required_host_vars:
    description: For a group, the variables each of its hosts must define.
    type: dict
    default: {}
  argument_specs:
    description: The parsed C(meta/argument_specs.yml) of every role (a list of their contents).
    type: list
    elements: dict
    default: []
  extra_known:
    description: Further variable names to accept (magic and connection variables are always accepted).
    type: list
    elements: str
    default: []
  fixed:
    description:
      - Variables an inventory must not set, each with the fix named in the refusal (what to set instead).
      - A name also in O(extra_known) is not refused (a fact a role sets for the play).
    type: dict
    default: {}
  similarity:
    description: How close (0..1, difflib ratio) an unknown name must be to a known one to be called a misspelling.
    type: float
    default: 0.8
author:
  - kunlun-fleet contributors (@kunlun-fleet)
"""

EXAMPLES = r"""
- name: Check the inventory's shape
  inventory_check:
    groups: "{{ groups }}"
    hosts: "{{ preflight_inventory_vars }}"
    required_groups: [xpu_servers, image_builders, gateways]
    required_host_vars: {xpu_servers: [storage_data_disks]}
    argument_specs: "{{ preflight_argument_specs }}"
  delegate_to: localhost
  run_once: true
"""

RETURN = r"""
problems:
  description: Every problem found, each naming the item and the fix (the module fails when any).
  returned: always
  type: list
  elements: str
unknown:
  description: Variables no role declares and that resemble no known name (reported as warnings).
  returned: always
  type: list
  elements: str
"""

import difflib

from ansible.module_utils.basic import AnsibleModule

# Set by Ansible itself or by inventory plugins; never declared by a role.
MAGIC = frozenset(
    (
        "inventory_hostname",
        "inventory_hostname_short",
        "inventory_dir",
        "inventory_file",
        "group_names",
        "groups",
        "hostvars",
        "playbook_dir",
        "play_hosts",
        "role_names",
        "omit",
        "environment",
        "vars",
        # Left in hostvars by fact gathering and the fact cache.
        "gather_subset",
        "module_setup",
        "discovered_interpreter_python",
    )
)
TRUE_FALSE_STRINGS = frozenset(("true", "false", "yes", "no", "on", "off", "1", "0"))


def spec_options(argument_specs):
    """{variable: type} over every entry point of every role's argument specs."""
    options = {}
    for spec in argument_specs or []:
        for entry in ((spec or {}).get("argument_specs") or {}).values():
            for name, option in ((entry or {}).get("options") or {}).items():
                options[name] = (option or {}).get("type", "str")
    return options


def is_known(name, options, extra):
    return name in options or name in extra or name in MAGIC or name.startswith("ansible_")


def check(params):
    """Return (problems, unknown) for the inventory described by params."""
    groups = params["groups"] or {}
    hosts = params["hosts"] or {}
    options = spec_options(params["argument_specs"])
    extra = frozenset(params["extra_known"] or [])
    fixed = params.get("fixed") or {}
    problems = []

    for group in params["required_groups"]:
        if not groups.get(group):
            problems.append("group %s has no hosts: add at least one host under %s in hosts.yml" % (group, group))

    for group, names in sorted((params["required_host_vars"] or {}).items()):
        for host in groups.get(group) or []:
            for name in names:
                value = (hosts.get(host) or {}).get(name)
                # An explicit empty list is a choice (storage_data_disks: [] adopts the
                # volume mounted at /home); only a missing or blank value is not.
                if value is None or value == "":
                    problems.append(
                        "host %s (group %s) does not define %s: set it in host_vars/%s.yml" % (host, group, name, host)
                    )

    by_address = {}
    for host in sorted(hosts):
        address = str((hosts[host] or {}).get("ansible_host") or host)
        by_address.setdefault(address, []).append(host)
    for address, owners in sorted(by_address.items()):
        if len(owners) > 1:
            problems.append(
                "hosts %s share the address %s: give each host its own ansible_host" % (" and ".join(owners), address)
            )

    unknown = set()
    misspelt = {}
    shadowing = {}
    for host in sorted(hosts):
        for name, value in sorted((hosts[host] or {}).items()):
            if name in fixed and name not in extra:
                shadowing.setdefault(name, []).append(host)
                continue
            kind = options.get(name)
            if kind == "bool" and isinstance(value, str):
                problems.append(
                    "%s is the string %r on host %s, not a boolean (a non-empty string counts as "
                    "true in a condition): write %s without quotes"
                    % (name, value, host, value.lower() if value.lower() in TRUE_FALSE_STRINGS else "true or false")
                )
            if is_known(name, options, extra):
                continue
            close = difflib.get_close_matches(name, list(options), n=1, cutoff=params["similarity"])
            if close:
                misspelt.setdefault((name, close[0]), []).append(host)
            else:
                unknown.add(name)
    for (name, known), owners in sorted(misspelt.items()):
        problems.append(
            "unknown variable %s (on %s): did you mean %s? Rename it in your inventory"
            % (name, ", ".join(owners), known)
        )
    for name, owners in sorted(shadowing.items()):
        problems.append(
            "%s is set (on %s), and kunlun-fleet would ignore it: %s" % (name, ", ".join(owners), fixed[name])
        )
    return problems, sorted(unknown)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            groups=dict(type="dict", required=True),
            hosts=dict(type="dict", required=True),
            required_groups=dict(type="list", elements="str", default=["xpu_servers"]),
            required_host_vars=dict(type="dict", default={}),
            argument_specs=dict(type="list", elements="dict", default=[]),
            extra_known=dict(type="list", elements="str", default=[]),
            fixed=dict(type="dict", default={}),
            similarity=dict(type="float", default=0.8),
        ),
        supports_check_mode=True,
    )
    problems, unknown = check(module.params)
    for name in unknown:
        module.warn("variable %s is declared by no role; it has no effect unless your own plays use it" % name)
    if problems:
        module.fail_json(
            msg="The inventory cannot be used as it is:\n- " + "\n- ".join(problems), problems=problems, unknown=unknown
        )
    module.exit_json(changed=False, problems=[], unknown=unknown)


if __name__ == "__main__":
    main()
