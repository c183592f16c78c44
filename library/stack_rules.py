#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: kunlun-fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: stack_rules
short_description: Judge pins and serving arguments against the validated combination
description:
  - Applies the rules of C(roles/kunlun_stack/defaults/main.yml) through the shared checker in
    C(module_utils/kunlun_stack.py) - the same checker the image proof and serve use.
  - Fails with one line per problem, each naming the item, what was found and the fix.
  - Reads nothing from the host and changes nothing; safe in check mode.
options:
  components:
    description: The pins in force (C(kunlun_stack_components) after inventory overrides).
    type: dict
    required: true
  validated_components:
    description:
      - The pins of the named stack as shipped (or as the site defined it). A departure from them fails
        unless I(allow_unvalidated).
      - Default the components of I(stack) in I(stacks) and I(site_stacks); one of the two is required.
    type: dict
  stack:
    description:
      - The name of the stack served (C(kunlun_stack_stack)). Refused when unknown, known-bad (with its
        reason, even with I(allow_unvalidated)), incomplete, or a site stack reusing a shipped name; a
        candidate is accepted with a warning.
    type: str
  stacks:
    description: The shipped stacks (C(kunlun_stack_stacks) as this checkout ships them).
    type: dict
    default: {}
  site_stacks:
    description: The site's own stacks (C(kunlun_stack_site_stacks)).
    type: dict
    default: {}
  known_bad:
    description: Known-bad combinations (C(kunlun_stack_known_bad)).
    type: list
    elements: dict
    default: []
  allow_unvalidated:
    description: Accept pins that depart from the validated set (known-bad ones are refused regardless).
    type: bool
    default: false
  serving:
    description: The vllm serving arguments (C(kunlun_stack_serving_effective) names). Omit to check only the pins.
    type: dict
  serving_rules:
    description: The serving rules (C(kunlun_stack_serving_rules)).
    type: dict
    default: {}
  device_count:
    description: Accelerators per host, for the tensor parallel rule.
    type: int
    default: 8
author:
  - kunlun-fleet contributors (@kunlun-fleet)
"""

EXAMPLES = r"""
- name: Refuse a known-bad or unvalidated stack before any host is touched
  stack_rules:
    stack: "{{ kunlun_stack_stack }}"
    stacks: "{{ kunlun_stack_shipped.kunlun_stack_stacks }}"
    site_stacks: "{{ kunlun_stack_site_stacks }}"
    components: "{{ kunlun_stack_components }}"
    known_bad: "{{ kunlun_stack_known_bad }}"
    serving: "{{ kunlun_stack_serving_effective }}"
    serving_rules: "{{ kunlun_stack_serving_rules }}"
    device_count: 8
  delegate_to: localhost
  run_once: true
"""

RETURN = r"""
problems:
  description: Every violated rule (empty when all pass).
  returned: always
  type: list
  elements: dict
  sample: [{item: gpu_memory_utilization, found: "0.9 with max_num_seqs 256 ...", fix: "use at most 0.8 ..."}]
departures:
  description: Pins that differ from the validated set but are not known-bad (accepted with I(allow_unvalidated)).
  returned: always
  type: list
  elements: dict
stack:
  description: The stack judged, when I(stack) was given - its name, status and summary.
  returned: when I(stack) is given and known
  type: dict
  sample: {name: 0.15.1-4885de2, status: validated, summary: vllm 0.15.1 with vllm-kunlun 4885de2 ...}
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.kunlun_stack import (
    check_departures,
    check_known_bad,
    check_serving,
    check_stack,
    component_versions,
    stack_catalog,
)


def run(params):
    """Return (problems, departures, warnings) - the first two as lists of dicts."""
    problems, warnings = [], []
    validated = params.get("validated_components")
    if params.get("stack") is not None:
        problems, warnings = check_stack(params["stack"], params["stacks"], params["site_stacks"])
        if validated is None:
            entry = stack_catalog(params["stacks"], params["site_stacks"]).get(params["stack"]) or {}
            validated = entry.get("components") or {}
    problems += check_known_bad(component_versions(params["components"]), params["known_bad"] or [])
    departures = check_departures(params["components"], validated or {})
    if not params["allow_unvalidated"]:
        problems.extend(departures)
    if params.get("serving") is not None:
        problems.extend(check_serving(params["serving"], params["serving_rules"], params["device_count"]))
    return [p.as_dict() for p in problems], [d.as_dict() for d in departures], warnings


def main():
    module = AnsibleModule(
        argument_spec=dict(
            components=dict(type="dict", required=True),
            validated_components=dict(type="dict"),
            stack=dict(type="str"),
            stacks=dict(type="dict", default={}),
            site_stacks=dict(type="dict", default={}),
            known_bad=dict(type="list", elements="dict", default=[]),
            allow_unvalidated=dict(type="bool", default=False),
            serving=dict(type="dict"),
            serving_rules=dict(type="dict", default={}),
            device_count=dict(type="int", default=8),
        ),
        required_one_of=[("validated_components", "stack")],
        supports_check_mode=True,
    )
    problems, departures, warnings = run(module.params)
    for warning in warnings:
        module.warn(warning)
    if departures and module.params["allow_unvalidated"]:
        for dep in departures:
            module.warn("unvalidated pin accepted: %(item)s: %(found)s" % dep)
    if problems:
        lines = ["%(item)s: %(found)s. Fix: %(fix)s" % p for p in problems]
        module.fail_json(
            msg="The stack configuration cannot work:\n- " + "\n- ".join(lines),
            problems=problems,
            departures=departures,
        )
    result = dict(changed=False, problems=[], departures=departures)
    if module.params.get("stack") is not None:
        entry = stack_catalog(module.params["stacks"], module.params["site_stacks"])[module.params["stack"]]
        result["stack"] = dict(
            name=module.params["stack"], status=entry.get("status"), summary=entry.get("summary", "")
        )
    module.exit_json(**result)


if __name__ == "__main__":
    main()
