#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: kunlun-fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: model_fetch
short_description: Fetch model files from peers' read-only shares, resumable, each verified before it is renamed
  into place
description:
  - Fetches every file of I(files) over HTTP from the first of I(sources) that answers (a host's model_share), in
    sorted order, one transfer at a time.
  - Each file is written to I(partial_dir)/<path> and hashed as it arrives. After an interruption (a dead source, a
    lost connection, a killed run) the partial file is kept and continued with a Range request, from the same
    source or the next one, in this run or the next.
  - A file is renamed into I(dest) only once its sha256 is the manifest's; a file whose sum differs is discarded
    and fetched again from the next source. Nothing half-written is ever in I(dest).
  - A source at its bound of concurrent transfers answers 503; the module waits up to I(busy_wait) seconds for
    it, then moves on. A source that fails is left for the next one, which then serves the following files too.
    When every source failed for a file, the module fails naming each source, its address and its error.
  - In check mode nothing is fetched; the result says which source would be used.
options:
  dest:
    description: The model directory.
    type: path
    required: true
  partial_dir:
    description: Where partial files are kept (same filesystem as I(dest), outside it).
    type: path
    required: true
  files:
    description: The files to fetch, relative path -> manifest sha256.
    type: dict
    required: true
  sources:
    description: The sources in the order to try - C(name) and C(address) (a peer's share, at
      http://I(address):I(port)/I(prefix)/), or C(name) and C(url) (any http:// base URL).
    type: list
    elements: dict
    required: true
  port:
    description: The peers' share port.
    type: int
    default: 8478
  prefix:
    description: The URL path the peers serve the files under (the model directory's name).
    type: str
    default: ""
  timeout:
    description: Seconds to connect and between two reads before a source counts as dead.
    type: int
    default: 30
  busy_wait:
    description: Seconds to wait for a source at its bound of concurrent transfers before trying the next.
    type: int
    default: 600
  mode:
    description: Mode of the fetched files (octal string).
    type: str
    default: "0644"
  owner:
    description: Owner of the fetched files.
    type: str
  group:
    description: Group of the fetched files.
    type: str
author:
  - kunlun-fleet contributors (@kunlun-fleet)
"""

EXAMPLES = r"""
- name: Fetch the missing files from a peer, the other peers as fallbacks
  model_fetch:
    dest: /home/newdata/models/Qwen3.8-27B-W8A8-INT8-Dynamic
    partial_dir: /home/newdata/models/.Qwen3.8-27B-W8A8-INT8-Dynamic.partial
    files: "{{ model_before.to_copy_sha256 }}"
    sources:
      - {name: kf-node-1, address: 172.31.250.11}
      - {name: kf-node-2, address: 172.31.250.12}
    port: 8478
    prefix: Qwen3.8-27B-W8A8-INT8-Dynamic
"""

RETURN = r"""
fetched:
  description: Files renamed into place - C(path), C(source), C(bytes), C(resumed_from) (bytes already in the
    partial file when this run began).
  returned: success
  type: list
  elements: dict
bytes_by_source:
  description: Bytes received from each source this run.
  returned: always
  type: dict
failures:
  description: Every failed attempt (C(source), C(url), C(file), C(error)) - a fallback happened after each.
  returned: always
  type: list
  elements: dict
busy_waits:
  description: How many times a source answered that it was at its bound.
  returned: always
  type: int
would_fetch:
  description: In check mode, the files and the first source.
  returned: check mode
  type: dict
"""

import grp
import pwd

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.model_transfer import FetchFailed, Fetcher


def main():
    module = AnsibleModule(
        argument_spec=dict(
            dest=dict(type="path", required=True),
            partial_dir=dict(type="path", required=True),
            files=dict(type="dict", required=True),
            sources=dict(type="list", elements="dict", required=True),
            port=dict(type="int", default=8478),
            prefix=dict(type="str", default=""),
            timeout=dict(type="int", default=30),
            busy_wait=dict(type="int", default=600),
            mode=dict(type="str", default="0644"),
            owner=dict(type="str"),
            group=dict(type="str"),
        ),
        supports_check_mode=True,
    )
    p = module.params
    sources = []
    for source in p["sources"]:
        url = source.get("url") or (
            "http://%s:%d/%s" % (source.get("address"), p["port"], p["prefix"].strip("/"))
            if source.get("address")
            else ""
        )
        if not source.get("name") or not url.startswith("http://"):
            module.fail_json(msg="Every source needs a name and an address or http:// url, not %r" % (source,))
        sources.append(dict(name=source["name"], url=url.rstrip("/")))
    if not p["files"]:
        module.exit_json(changed=False, fetched=[], bytes_by_source={}, failures=[], busy_waits=0)
    if not sources:
        module.fail_json(msg="%d model files to fetch but no source" % len(p["files"]))
    if module.check_mode:
        module.exit_json(
            changed=True,
            would_fetch=dict(files=sorted(p["files"]), source=sources[0]["name"]),
            bytes_by_source={},
            failures=[],
            busy_waits=0,
        )
    try:
        uid = pwd.getpwnam(p["owner"]).pw_uid if p["owner"] else -1
        gid = grp.getgrnam(p["group"]).gr_gid if p["group"] else -1
    except KeyError as exc:
        module.fail_json(msg="Unknown owner or group for the model files: %s" % exc)
    fetcher = Fetcher(
        p["dest"],
        p["partial_dir"],
        sources,
        timeout=p["timeout"],
        busy_wait=p["busy_wait"],
        mode=int(p["mode"], 8),
        uid=uid,
        gid=gid,
    )
    try:
        fetcher.fetch(dict((k, str(v).lower()) for k, v in p["files"].items()))
    except FetchFailed as exc:
        module.fail_json(
            msg="%s" % exc,
            fetched=fetcher.files,
            bytes_by_source=fetcher.bytes_by_source,
            failures=fetcher.failures,
            busy_waits=fetcher.busy_waits,
            changed=bool(fetcher.files),
        )
    module.exit_json(
        changed=True,
        fetched=fetcher.files,
        bytes_by_source=fetcher.bytes_by_source,
        failures=fetcher.failures,
        busy_waits=fetcher.busy_waits,
    )


if __name__ == "__main__":
    main()
