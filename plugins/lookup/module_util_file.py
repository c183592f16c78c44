# -*- coding: utf-8 -*-
# Copyright: kunlun-fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The path of one of the project's module_utils files, for a role that ships it to a host
(the monitoring stage's accelerator exporter uses the product's xpu-smi parser, not a copy)."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
name: module_util_file
short_description: The path of one of kunlun-fleet's module_utils files on the controller
description:
  - Returns the absolute path of each named file of the project's module_utils, for a role that copies
    one of them to a host (the same parser the modules use, not a second copy of it).
  - Works in both layouts the roles ship in, without a path relative to a role - the playbook project
    (C(module_utils/) beside C(plugins/)) and the C(kunlun.fleet) collection (C(plugins/module_utils/)).
version_added: "0.1.0"
author:
  - kunlun-fleet contributors (@kunlun-fleet)
options:
  _terms:
    description: File names in module_utils, for example C(xpu_smi.py).
    required: true
    type: list
    elements: str
"""

EXAMPLES = r"""
- name: Ship the xpu-smi parser beside the exporter
  ansible.builtin.copy:
    src: "{{ lookup('module_util_file', 'xpu_smi.py') }}"
    dest: /usr/local/lib/kunlun-fleet/monitoring/xpu_smi.py
    mode: "0644"
"""

RETURN = r"""
_raw:
  description: The absolute path of each file, in the order given.
  type: list
  elements: str
"""

import os

from ansible.errors import AnsibleLookupError
from ansible.plugins.lookup import LookupBase


def candidates(here):
    """Where module_utils is, seen from this file (plugins/lookup/): the project's top-level
    module_utils/, then the collection's plugins/module_utils/."""
    plugins = os.path.dirname(here)
    return [os.path.join(os.path.dirname(plugins), "module_utils"), os.path.join(plugins, "module_utils")]


def find(name, here=None):
    if os.path.basename(name) != name or not name.endswith(".py"):
        raise AnsibleLookupError(
            "module_util_file: %r is not a file name of module_utils (for example xpu_smi.py)" % name
        )
    dirs = candidates(here or os.path.dirname(os.path.abspath(__file__)))
    for directory in dirs:
        path = os.path.join(directory, name)
        if os.path.isfile(path):
            return path
    raise AnsibleLookupError("module_util_file: no %s in %s" % (name, " or ".join(dirs)))


class LookupModule(LookupBase):
    def run(self, terms, variables=None, **kwargs):
        return [find(str(term)) for term in terms]
