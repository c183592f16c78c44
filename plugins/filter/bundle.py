# -*- coding: utf-8 -*-
# Copyright: kunlun-fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Files of the offline bundle as the roles name them: paths relative to the bundle
directory (what bundle_check's `required` and the manifest list). Documentation:
bundle_paths.yml beside this file."""

from __future__ import absolute_import, division, print_function

import os

__metaclass__ = type


def bundle_paths(files, subdir):
    """The files a find returned in `subdir` of the bundle (`files`: its registered `files`,
    each with a `path`), as `subdir/<name>`, sorted by name as Jinja's sort does
    (case-insensitive)."""
    names = sorted((os.path.basename(f["path"]) for f in files), key=lambda name: name.lower())
    return ["%s/%s" % (subdir, name) for name in names]


class FilterModule:
    def filters(self):
        return {"bundle_paths": bundle_paths}
