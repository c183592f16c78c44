# -*- coding: utf-8 -*-
# Copyright: kunlun-fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The storage role's choice between adopting the logical volume already mounted at the
mount point and building kunlun-fleet's own volume on the data disks (docs/storage.md).
Documentation: storage_adopt.yml beside this file."""

from __future__ import absolute_import, division, print_function

from collections.abc import Mapping

__metaclass__ = type


def storage_adopt(mounted_lv, data_disks, vg_name, lv_name):
    """Whether the volume mounted at the mount point is adopted: `mounted_lv` (volume_info's,
    {} when the mount point is not on a logical volume) is a logical volume, and either no
    data disk is listed or it is not kunlun-fleet's own volume `vg_name`/`lv_name` (which
    stays on the build path, where listed disks extend it)."""
    if not isinstance(mounted_lv, Mapping) or "vg" not in mounted_lv:
        return False
    mounted = "%s/%s" % (mounted_lv["vg"], mounted_lv["lv"])
    return len(data_disks) == 0 or mounted != "%s/%s" % (vg_name, lv_name)


class FilterModule:
    def filters(self):
        return {"storage_adopt": storage_adopt}
