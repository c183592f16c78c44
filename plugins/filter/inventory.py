# -*- coding: utf-8 -*-
# Copyright: kunlun-fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Variables an inventory must not set, for preflight's inventory check. Documentation:
fixed_variables.yml beside this file."""

from __future__ import absolute_import, division, print_function

import os

__metaclass__ = type


def fixed_variables(role_vars, replaced=None):
    """{name: fix} for every variable a role works out itself (`role_vars`: {path of a role's
    vars/main.yml: its parsed content}) and every replaced one (`replaced`: {name: fix}).

    A role's vars/main.yml outranks the inventory, so an inventory's value of one of its
    names is silently ignored; the fix names the role that derives it."""
    fixed = {}
    for path, content in sorted((role_vars or {}).items()):
        role = os.path.basename(os.path.dirname(os.path.dirname(path)))
        for name in sorted(content or {}):
            fixed[name] = (
                "the %s role derives it (roles/%s/vars/main.yml); remove it from the inventory "
                "and set what it derives from" % (role, role)
            )
    fixed.update(replaced or {})
    return fixed


class FilterModule:
    def filters(self):
        return {"fixed_variables": fixed_variables}
