# -*- coding: utf-8 -*-
# Copyright: kunlun-fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The distribution packages a role needs that a host lacks, from one dpkg-query of them
(roles/kunlun_stack/tasks/packages.yml). Documentation: packages_missing.yml beside this
file."""

from __future__ import absolute_import, division, print_function

import re

__metaclass__ = type

# dpkg-query --showformat '${Package} ${db:Status-Status}\n': "<name> installed" for an
# installed package; not-installed, config-files, half-installed, unpacked, ... otherwise.
INSTALLED = re.compile(r" installed$")


def packages_missing(packages, dpkg_lines):
    """The `packages` (in their order) that no line of `dpkg_lines` says are installed."""
    installed = [line.split(" ")[0] for line in dpkg_lines if INSTALLED.search(line)]
    return [name for name in packages if name not in installed]


class FilterModule:
    def filters(self):
        return {"packages_missing": packages_missing}
