# -*- coding: utf-8 -*-
# Copyright: kunlun-fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The serving image's tag: a hash of everything the image is built from, so the same inputs
give the same tag on every run and any change gives a new one. Documentation: image_tag.yml;
image_build_tag.yml for the same tag from the bundle's checksums as the image role holds them.

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


def image_build_tag(dockerfile, artifacts, sums, ca_texts, registry, base_image, bundle_files):
    """image_tag with its inputs taken from the bundle check: each artifact's sum in build
    order (`artifacts`, paths in the bundle, keys of `sums`), and for the base image its
    archive's sum (`bundle_files['base_image']` in `sums`) when it is loaded from the bundle
    (no `registry`), else its reference `base_image`."""
    if len(registry) == 0:
        base = sums[bundle_files["base_image"]]
    else:
        base = base_image
    return image_tag(dockerfile, [sums[path] for path in artifacts], base, ca_texts)


class FilterModule:
    def filters(self):
        return {"image_tag": image_tag, "image_build_tag": image_build_tag}
