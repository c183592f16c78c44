#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: kunlun-fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: failure_budget
short_description: Whether the hosts a run has left out so far are within the fleet's failure budget
description:
  - A host that fails or becomes unreachable is out of the rest of an Ansible run; the others go on. This module, run
    once between stages, counts the hosts left out so far (in I(hosts), not in I(remaining)) and fails when they are
    more than the budget, or when one of them is a host the whole fleet depends on (I(shared)). Its failure, run
    once, stops the run for every host.
  - The budget is a host count, or a percentage of the run's serving hosts (rounded down, so C(10%) is 0 on a fleet of
    fewer than ten).
  - Changes nothing; the same in check mode.
options:
  stage:
    description: The stage that just ran, for the message.
    type: str
    required: true
  hosts:
    description: The run's hosts of this play (C(ansible_play_hosts_all)).
    type: list
    elements: str
    required: true
  remaining:
    description: Those still in the run (C(ansible_play_hosts)).
    type: list
    elements: str
    required: true
  serving:
    description: The serving hosts of the inventory (the base of a percentage).
    type: list
    elements: str
    required: true
  shared:
    description: Hosts the whole fleet depends on; one of them left out stops the run whatever the budget.
    type: list
    elements: str
    default: []
  budget:
    description: Hosts the run may leave out, an int (0 or more) or a percentage of the serving hosts like C(10%).
    type: raw
    required: true
author: kunlun-fleet contributors (@kunlun-fleet)
"""

EXAMPLES = r"""
- name: The hosts left out so far, against the failure budget
  failure_budget:
    stage: storage
    hosts: "{{ ansible_play_hosts_all }}"
    remaining: "{{ ansible_play_hosts }}"
    serving: "{{ groups['xpu_servers'] }}"
    shared: "{{ groups['gateways'] | default([]) }}"
    budget: "10%"
  run_once: true
  delegate_to: localhost
"""

RETURN = r"""
hosts:
  description: The run's hosts of this play (I(hosts)), for a later play of fewer hosts.
  returned: always
  type: list
  elements: str
left_out:
  description: The hosts left out so far, in the play's order.
  returned: always
  type: list
  elements: str
shared_left_out:
  description: Those of them the whole fleet depends on.
  returned: always
  type: list
  elements: str
allowed:
  description: The budget in hosts.
  returned: always
  type: int
serving:
  description: The run's serving hosts, the base of a percentage.
  returned: always
  type: int
within:
  description: Whether the run goes on (false only in the failure's result).
  returned: always
  type: bool
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.failure_budget import verdict


def main():
    module = AnsibleModule(
        argument_spec=dict(
            stage=dict(type="str", required=True),
            hosts=dict(type="list", elements="str", required=True),
            remaining=dict(type="list", elements="str", required=True),
            serving=dict(type="list", elements="str", required=True),
            shared=dict(type="list", elements="str", default=[]),
            budget=dict(type="raw", required=True),
        ),
        supports_check_mode=True,
    )
    p = module.params
    try:
        v = verdict(p["hosts"], p["remaining"], p["serving"], p["shared"], p["budget"])
    except ValueError as exc:
        module.fail_json(
            msg="kunlun_stack_failure_budget %s. Fix: set it to a host count (0 stops the run at the first host "
            "left out) or a percentage of the serving hosts like '10%%'" % exc,
            within=False,
        )
    out = {k: v[k] for k in ("left_out", "shared_left_out", "allowed", "serving", "within")}
    out["hosts"] = p["hosts"]
    if v["within"]:
        module.exit_json(changed=False, msg="after %s: %s; the run goes on" % (p["stage"], v["why"]), **out)
    fix = (
        "fix the shared host, then run again"
        if v["shared_left_out"]
        else "fix them and run again (the report's resume command), or raise kunlun_stack_failure_budget to go on "
        "without them"
    )
    module.fail_json(
        msg="after %s: %s - the run stops here for every host. Each host's reason is in the run's report; %s"
        % (p["stage"], v["why"], fix),
        **out,
    )


if __name__ == "__main__":
    main()
