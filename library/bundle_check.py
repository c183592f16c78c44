#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: kunlun-fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: bundle_check
short_description: Verify the offline bundle against its sha256 manifest
description:
  - Verifies every file listed in the bundle's C(MANIFEST.sha256) and that every artifact the
    validated combination needs is listed. Names every missing or mismatching file.
  - Run it on the controller (C(delegate_to: localhost)) before any host is touched.
  - Digests of unchanged files (same size and modification time) are remembered in I(cache_file).
options:
  bundle_dir:
    description: The bundle directory.
    type: path
    required: true
  required:
    description: Paths, relative to the bundle, that must be present and listed.
    type: list
    elements: str
    default: []
  cache_file:
    description: Where to remember digests between runs (a controller path); empty to disable.
    type: path
author:
  - kunlun-fleet contributors
"""

EXAMPLES = r"""
- name: Verify the bundle
  bundle_check:
    bundle_dir: "{{ kunlun_stack_bundle_dir }}"
    required: ["{{ kunlun_stack_driver.artifact }}"]
  delegate_to: localhost
  run_once: true
"""

RETURN = r"""
problems:
  description: One entry per bad file (path, state, fix); the module fails when there is any.
  returned: always
  type: list
  elements: dict
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.bundle_manifest import check_bundle


def main():
    module = AnsibleModule(
        argument_spec=dict(
            bundle_dir=dict(type="path", required=True),
            required=dict(type="list", elements="str", default=[]),
            cache_file=dict(type="path"),
        ),
        supports_check_mode=True,
    )
    found = check_bundle(module.params["bundle_dir"], module.params["required"], module.params["cache_file"])
    problems = [{"path": p, "state": s, "fix": f} for p, s, f in found]
    if problems:
        module.fail_json(msg="The offline bundle %s is not usable:\n- %s" % (
            module.params["bundle_dir"], "\n- ".join("%(path)s: %(state)s. Fix: %(fix)s" % p for p in problems)),
            problems=problems)
    module.exit_json(changed=False, problems=[])


if __name__ == "__main__":
    main()
