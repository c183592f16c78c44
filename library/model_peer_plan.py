#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: kunlun-fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: model_peer_plan
short_description: Decide which source each host fetches the missing model files from, in waves
description:
  - Pure computation (runs on the controller, changes nothing, same answer in check mode).
  - Hosts that hold a verified copy (no file missing or differing) are the first sources. When no host holds one,
    the first I(origin_hosts) hosts that lack files take them from the origin (the controller's bundle or the
    mirror) in wave 0; with I(peers) false every host does, as before peer distribution.
  - Wave w >= 1 - every host complete before it is a source, read-only, to at most I(per_source) hosts at a time;
    the next hosts are assigned to the sources round-robin, each with the wave's other sources as fallbacks. The
    number of complete hosts grows by a factor of I(per_source) + 1 a wave.
options:
  hosts:
    description: The hosts taking part, in inventory order.
    type: list
    elements: str
    required: true
  addresses:
    description: Each host's fleet address (its share binds to it; C(kunlun_stack_serving_addresses)).
    type: dict
    required: true
  missing:
    description: How many files each host lacks or holds wrong (0 - its copy is complete and verified).
    type: dict
    required: true
  per_source:
    description: The bound on concurrent transfers from one source.
    type: int
    default: 2
  origin_hosts:
    description: Hosts that take the files from the origin when no host holds a verified copy.
    type: int
    default: 1
  peers:
    description: Distribute from host to host; false makes every host take the files from the origin.
    type: bool
    default: true
author:
  - kunlun-fleet contributors (@kunlun-fleet)
"""

EXAMPLES = r"""
- name: Sources of the hosts that lack files
  model_peer_plan:
    hosts: [kf-node-1, kf-node-2, kf-node-3]
    addresses: {kf-node-1: 172.31.250.11, kf-node-2: 172.31.250.12, kf-node-3: 172.31.250.13}
    missing: {kf-node-1: 0, kf-node-2: 7, kf-node-3: 2}
    per_source: 2
  delegate_to: localhost
  run_once: true
  register: model_plan
"""

RETURN = r"""
assignments:
  description: Per host that lacks files - C(wave), C(source) (a host name, or C(origin)), C(source_address),
    C(fallbacks) (list of C(name), C(address)).
  returned: always
  type: dict
waves:
  description: Per wave - C(wave), C(sources), C(pullers), C(per_source) (pullers assigned to each source).
  returned: always
  type: list
  elements: dict
peer_waves:
  description: The numbers of the waves fetched from peers (1..n).
  returned: always
  type: list
  elements: int
origin_hosts:
  description: Hosts that take the files from the origin.
  returned: always
  type: list
  elements: str
sources:
  description: Hosts that serve their copy to others this run.
  returned: always
  type: list
  elements: str
hosts_to_fetch:
  description: How many hosts lack files.
  returned: always
  type: int
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.model_transfer import plan


def main():
    module = AnsibleModule(
        argument_spec=dict(
            hosts=dict(type="list", elements="str", required=True),
            addresses=dict(type="dict", required=True),
            missing=dict(type="dict", required=True),
            per_source=dict(type="int", default=2),
            origin_hosts=dict(type="int", default=1),
            peers=dict(type="bool", default=True),
        ),
        supports_check_mode=True,
    )
    p = module.params
    absent = [h for h in p["hosts"] if h not in p["missing"]]
    if absent:
        module.fail_json(msg="No verification result for %s: cannot tell what they lack" % ", ".join(absent))
    hosts = [dict(name=h, address=p["addresses"].get(h) or h, missing=int(p["missing"][h])) for h in p["hosts"]]
    try:
        result = plan(hosts, module.params["per_source"], module.params["origin_hosts"], module.params["peers"])
    except (ValueError, KeyError) as exc:
        module.fail_json(msg="Cannot plan the model distribution: %s" % exc)
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
