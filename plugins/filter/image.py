# -*- coding: utf-8 -*-
# Copyright: kunlun-fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The serving image's tag: a hash of everything the image is built from, so the same inputs
give the same tag on every run and any change gives a new one. Documentation: image_tag.yml.

The serialization is the one the tag has always had (Ansible's to_json with sort_keys, then
sha256 of its UTF-8 text, the first 16 hex digits): a fleet keeps its tag across this change.
"""

from __future__ import absolute_import, division, print_function

import hashlib
import json

__metaclass__ = type


def _sha256(text):
    return hashlib.sha256(text.encode("utf-8", errors="surrogateescape")).hexdigest()


def image_tag(dockerfile, artifact_sums, base, ca_texts):
    inputs = {
        "dockerfile": dockerfile,
        "artifacts": list(artifact_sums),
        "base": base,
        "ca": [_sha256(text) for text in ca_texts],
    }
    return _sha256(json.dumps(inputs, sort_keys=True))[:16]


class FilterModule:
    def filters(self):
        return {"image_tag": image_tag}
