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
  - Soft limit enough - nothing to do. Soft limit too low but the hard limit enough - reported as C(raise):
    the bench's points raise the soft limit to the hard one for the load generator (a process may, without
    privileges). Even the hard limit too low - fails, naming the limit and the fix.
  - Changes nothing; the same in check mode. Standard library only.
options:
  concurrency:
    description: The most concurrent streams any point of the bench keeps in flight.
    type: int
    required: true
  headroom:
    description: Descriptors the load generator needs besides one per stream (its processes, files, sockets).
    type: int
    default: 1024
author:
  - kunlun-fleet contributors
"""

EXAMPLES = r"""
- name: The controller can open enough connections
  bench_fd_limit:
    concurrency: 2048
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
from ansible.module_utils.bench_results import fd_plan


def main():
    module = AnsibleModule(
        argument_spec=dict(concurrency=dict(type="int", required=True),
                           headroom=dict(type="int", default=1024)),
        supports_check_mode=True,
    )
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    soft = -1 if soft == resource.RLIM_INFINITY else soft
    hard = -1 if hard == resource.RLIM_INFINITY else hard
    needed, action, message = fd_plan(module.params["concurrency"], module.params["headroom"], soft, hard)
    result = dict(changed=False, soft=soft, hard=hard, needed=needed, action=action, msg=message)
    if action == "refuse":
        module.fail_json(**result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
