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
    description: The project's validated pins, as shipped. A departure from them fails unless I(allow_unvalidated).
    type: dict
    required: true
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
    components: "{{ kunlun_stack_components }}"
    validated_components: "{{ preflight_validated.kunlun_stack_components }}"
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
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.kunlun_stack import check_departures, check_known_bad, check_serving, component_versions


def run(params):
    """Return (problems, departures) as lists of dicts."""
    problems = check_known_bad(component_versions(params["components"]), params["known_bad"] or [])
    departures = check_departures(params["components"], params["validated_components"])
    if not params["allow_unvalidated"]:
        problems.extend(departures)
    if params.get("serving") is not None:
        problems.extend(check_serving(params["serving"], params["serving_rules"], params["device_count"]))
    return [p.as_dict() for p in problems], [d.as_dict() for d in departures]


def main():
    module = AnsibleModule(
        argument_spec=dict(
            components=dict(type="dict", required=True),
            validated_components=dict(type="dict", required=True),
            known_bad=dict(type="list", elements="dict", default=[]),
            allow_unvalidated=dict(type="bool", default=False),
            serving=dict(type="dict"),
            serving_rules=dict(type="dict", default={}),
            device_count=dict(type="int", default=8),
        ),
        supports_check_mode=True,
    )
    problems, departures = run(module.params)
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
    module.exit_json(changed=False, problems=[], departures=departures)


if __name__ == "__main__":
    main()
