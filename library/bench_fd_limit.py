#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: kunlun-fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: bench_fd_limit
short_description: Check that the load generator's machine can open enough connections for the bench
description:
  - Every concurrent stream of the bench is one open connection of the load generator. Compares what
    I(concurrency) streams need (one descriptor each plus I(headroom)) with this machine's open-files limit
    (C(RLIMIT_NOFILE)) before any load is sent.
  - Given the bench's I(points) instead, it works out the most streams open at once itself - the largest fleet
    point, or the I(host_parallel) hosts with the largest own points side by side - whatever kinds of points
    there are (fleet points only, hosts only).
  - Soft limit enough - nothing to do. Soft limit too low but the hard limit enough - reported as C(raise) -
    the bench's points raise the soft limit to the hard one for the load generator (a process may, without
    privileges). Even the hard limit too low - fails, naming the limit and the fix.
  - Changes nothing; the same in check mode. Standard library only.
options:
  concurrency:
    description: The most concurrent streams the bench keeps in flight at once. One of I(concurrency) or I(points).
    type: int
  points:
    description:
      - The bench's points (roles/bench's points.json.j2), each with C(target) (C(fleet) or a host) and
        C(concurrency). One of I(concurrency) or I(points).
    type: list
    elements: dict
  host_parallel:
    description: Hosts whose own points run at the same time (the role's C(bench_host_parallel)), with I(points).
    type: int
    default: 8
  headroom:
    description: Descriptors the load generator needs besides one per stream (its processes, files, sockets).
    type: int
    default: 1024
author:
  - kunlun-fleet contributors (@kunlun-fleet)
"""

EXAMPLES = r"""
- name: The controller can open enough connections
  bench_fd_limit:
    concurrency: 2048
  delegate_to: localhost
  run_once: true

- name: The controller can open enough connections for the bench's points
  bench_fd_limit:
    points: "{{ bench_points }}"
    host_parallel: 8
  delegate_to: localhost
  run_once: true
"""

RETURN = r"""
soft:
  description: The open-files soft limit (-1 unlimited).
  returned: always
  type: int
hard:
  description: The open-files hard limit (-1 unlimited).
  returned: always
  type: int
needed:
  description: Descriptors the bench needs.
  returned: always
  type: int
concurrency:
  description: The concurrent streams the check is for (given, or worked out from I(points)).
  returned: always
  type: int
action:
  description: C(ok), C(raise) (the points raise the soft limit to the hard one) or C(refuse).
  returned: always
  type: str
msg:
  description: What was found and, when refused, the fix.
  returned: always
  type: str
"""

import resource

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.bench_results import concurrent_streams, fd_plan


def main():
    module = AnsibleModule(
        argument_spec=dict(
            concurrency=dict(type="int"),
            points=dict(type="list", elements="dict"),
            host_parallel=dict(type="int", default=8),
            headroom=dict(type="int", default=1024),
        ),
        required_one_of=[("concurrency", "points")],
        mutually_exclusive=[("concurrency", "points")],
        supports_check_mode=True,
    )
    p = module.params
    if p["points"] is not None:
        concurrency, how = concurrent_streams(p["points"], p["host_parallel"])
    else:
        concurrency, how = p["concurrency"], "given"
    if concurrency < 0:
        module.fail_json(msg="concurrency must be 0 or more, got %d" % concurrency)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    soft = -1 if soft == resource.RLIM_INFINITY else soft
    hard = -1 if hard == resource.RLIM_INFINITY else hard
    needed, action, message = fd_plan(concurrency, p["headroom"], soft, hard)
    result = dict(
        changed=False,
        soft=soft,
        hard=hard,
        needed=needed,
        action=action,
        concurrency=concurrency,
        msg="%s (%s)" % (message, how),
    )
    if action == "refuse":
        module.fail_json(**result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
