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
  only_required:
    description:
      - Verify only the I(required) files (a stage that uses a few artifacts of a large bundle);
        by default every file the manifest lists is verified.
    type: bool
    default: false
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
sums:
  description: The manifest's sha256 of each I(required) path, verified against the file.
  returned: success
  type: dict
  sample: {"drivers/xre-5.0.21.26-linux-x86_64.run": "9f2c...e1"}
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.bundle_manifest import check_bundle


def main():
    module = AnsibleModule(
        argument_spec=dict(
            bundle_dir=dict(type="path", required=True),
            required=dict(type="list", elements="str", default=[]),
            cache_file=dict(type="path"),
            only_required=dict(type="bool", default=False),
        ),
        supports_check_mode=True,
    )
    sums = {}
    found = check_bundle(module.params["bundle_dir"], module.params["required"], module.params["cache_file"],
                         only_required=module.params["only_required"], sums_out=sums)
    problems = [{"path": p, "state": s, "fix": f} for p, s, f in found]
    if problems:
        # Callers run it on the controller before any host is touched.
        module.fail_json(msg="The offline bundle %s is not usable; nothing was changed:\n- %s" % (
            module.params["bundle_dir"], "\n- ".join("%(path)s: %(state)s. Fix: %(fix)s" % p for p in problems)),
            problems=problems)
    module.exit_json(changed=False, problems=[], sums=sums)


if __name__ == "__main__":
    main()
