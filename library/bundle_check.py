#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: kunlun-fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: bundle_check
short_description: Verify the offline bundle against its sha256 manifest, its index and the pins
description:
  - Verifies every file listed in the bundle's C(MANIFEST.sha256) and that every I(required) path is listed.
    Names every missing or mismatching file.
  - With I(artifacts) (pin keys such as C(driver), C(vllm), C(base_image)) or I(index_all), also the bundle's
    index C(bundle.yml) (written by C(kunlun-fleet bundle build), passed parsed as I(index)) - it must exist;
    each entry's file is in the manifest with the same sha256, is what its pin says (a wheel's METADATA name
    and version, an installer's header, the base image's RepoTags, the model directory's manifest and
    config.json) and, where the pins know the package index's sha256, has that digest
    (C(module_utils/bundle_index.py)).
  - A source tarball (vllm-kunlun) is identified by its commit, as C(git archive) records it in the pax
    global header, or, for a tarball that records none (an sdist, a plain tar), by the sha256 the pin
    declares for that commit (C(kunlun_stack_components.<key>.sha256)); it must hold a C(setup.py) at its
    top or in its one top-level directory. The versions it declares are reported, never compared.
  - Run it on the controller, delegated to C(localhost), before any host is touched.
  - Digests of unchanged files (same size and modification time), and what each file says it is, are
    remembered in I(cache_file).
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
      - Verify only the I(required) files and those of I(artifacts) (a stage that uses a few artifacts of
        a large bundle); by default every file the manifest lists is verified.
    type: bool
    default: false
  artifacts:
    description: Pin keys whose C(bundle.yml) entries must exist and be true to the pins and the files.
    type: list
    elements: str
    default: []
  index_all:
    description: Also verify every other pinned entry C(bundle.yml) has (preflight).
    type: bool
    default: false
  index:
    description:
      The bundle's C(bundle.yml), parsed (C(kunlun_stack_bundle_index)); read when I(artifacts) or I(index_all).
    type: dict
    default: {}
  pins:
    description:
      - The pins the index is compared with (C(kunlun_stack_bundle_pins) - kunlun_stack_components,
        kunlun_stack_driver, kunlun_stack_base_image, kunlun_stack_model, kunlun_stack_gateway_router,
        kunlun_stack_index_sha256).
    type: dict
    default: {}
author:
  - kunlun-fleet contributors (@kunlun-fleet)
"""

EXAMPLES = r"""
- name: Verify the driver's installer, its index entry and its pin
  bundle_check:
    bundle_dir: "{{ kunlun_stack_bundle_dir }}"
    index: "{{ kunlun_stack_bundle_index }}"
    pins: "{{ kunlun_stack_bundle_pins }}"
    artifacts: [driver]
    only_required: true
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
  description: The manifest's sha256 of each I(required) path and each file of I(artifacts), verified against the file.
  returned: success
  type: dict
  sample: {"drivers/xre-Linux-x86_64-5.0.21.26.run": "9f2c...e1"}
identities:
  description:
    - What each checked entry's file says of itself, by pin key. For a source tarball C(name), C(version)
      and C(declared) (the versions its PKG-INFO, pyproject.toml and setup.py declare), C(commit) (from the
      git archive pax header, empty when it records none), C(top_dir) (the one directory the tree is in,
      empty when it is at the archive's root) and C(setup_py).
  returned: success
  type: dict
  sample: {"vllm_kunlun": {"name": "vllm-kunlun", "version": "0.15.1.dev0", "commit": "4885de2...",
           "top_dir": "vLLM-Kunlun-4885de2", "setup_py": true}}
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.bundle_index import check


def main():
    module = AnsibleModule(
        argument_spec=dict(
            bundle_dir=dict(type="path", required=True),
            required=dict(type="list", elements="str", default=[]),
            cache_file=dict(type="path"),
            only_required=dict(type="bool", default=False),
            artifacts=dict(type="list", elements="str", default=[]),
            index_all=dict(type="bool", default=False),
            index=dict(type="dict", default={}),
            pins=dict(type="dict", default={}),
        ),
        supports_check_mode=True,
    )
    params = module.params
    sums = {}
    identities = {}
    found = check(
        params["bundle_dir"],
        params["pins"],
        params["index"],
        artifacts=params["artifacts"],
        required=params["required"],
        cache_path=params["cache_file"],
        only_required=params["only_required"],
        index_all=params["index_all"],
        sums_out=sums,
        identities_out=identities,
    )
    problems = [{"path": p, "state": s, "fix": f} for p, s, f in found]
    if problems:
        # Callers run it on the controller before any host is touched.
        module.fail_json(
            msg="The offline bundle %s is not usable; nothing was changed:\n- %s"
            % (module.params["bundle_dir"], "\n- ".join("%(path)s: %(state)s. Fix: %(fix)s" % p for p in problems)),
            problems=problems,
        )
    module.exit_json(changed=False, problems=[], sums=sums, identities=identities)


if __name__ == "__main__":
    main()
