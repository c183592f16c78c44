#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: kunlun-fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: model_share
short_description: Start or stop a host's read-only share of its verified model (a transient systemd unit)
description:
  - C(state=started) runs I(script) (roles/model/files/model_share.py) with the host's python3 as the transient
    unit I(unit) (C(systemd-run), nothing written under /etc, gone after a reboot), bound to the host's fleet
    I(address) and I(port), serving only the files of I(manifest) under I(root) to the I(allow) addresses, at most
    I(max_transfers) at a time. The unit runs with a read-only view of the file system (C(ProtectSystem=strict),
    C(ProtectHome=read-only)) except its runtime directory, where it keeps its statistics, and needs the mount that
    holds I(root) (C(RequiresMountsFor=)), so it does not start while the data volume is not mounted. It waits until
    the port answers. A unit already active with the same settings is left as it is (one left by an interrupted run with
    other settings is restarted).
  - C(state=stopped) stops the unit and returns what it served (bytes, peak concurrent transfers, per client).
author:
  - kunlun-fleet contributors (@kunlun-fleet)
options:
  state:
    description: Whether the share runs.
    type: str
    choices: [started, stopped]
    required: true
  unit:
    description: The transient unit's name (without .service).
    type: str
    default: kunlun-model-share
  script:
    description: The server script on the host.
    type: path
  address:
    description: The host's fleet address the share binds to.
    type: str
  port:
    description: The share's TCP port.
    type: int
    default: 8478
  root:
    description: The model directory.
    type: path
  manifest:
    description: The sha256 manifest on the host; only its files are served.
    type: path
  prefix:
    description: URL path the files are served under (the model directory's name).
    type: str
    default: ""
  allow:
    description: Client addresses allowed (the fleet's); empty allows any.
    type: list
    elements: str
    default: []
  max_transfers:
    description: Concurrent transfers served at most (one more is answered 503, Retry-After 1).
    type: int
    default: 2
  rate:
    description: Bytes per second per transfer, 0 for no limit.
    type: int
    default: 0
  wait:
    description: Seconds to wait for the port to answer after the start.
    type: int
    default: 30
"""

EXAMPLES = r"""
- name: Serve the verified model to the fleet
  model_share:
    state: started
    script: /usr/local/lib/kunlun-fleet/model_share.py
    address: 172.31.250.11
    root: /home/newdata/models/Qwen3.8-27B-W8A8-INT8-Dynamic
    manifest: /home/newdata/models/Qwen3.8-27B-W8A8-INT8-Dynamic.sha256
    prefix: Qwen3.8-27B-W8A8-INT8-Dynamic
    allow: [172.31.250.12, 172.31.250.13]

- name: Stop it and read what it served
  model_share:
    state: stopped
  register: model_share_stats
"""

RETURN = r"""
active:
  description: Whether the unit runs after the task.
  returned: always
  type: bool
stats:
  description: What the share served - C(bytes), C(transfers), C(completed), C(peak) (most concurrent transfers),
    C(refused_busy), C(refused_client), C(by_client) (bytes per client address).
  returned: when the share ran
  type: dict
"""

import json
import os
import socket
import time

from ansible.module_utils.basic import AnsibleModule


def _active(module, systemctl, unit):
    rc, out, _err = module.run_command([systemctl, "is-active", unit + ".service"])
    return out.strip() in ("active", "activating", "reloading")


def _stats(path):
    try:
        with open(path) as handle:
            return json.load(handle)
    except (IOError, OSError, ValueError):
        return None


def _answers(address, port):
    try:
        sock = socket.create_connection((address, port), timeout=2)
    except (socket.error, socket.timeout):
        return False
    sock.close()
    return True


def main():
    module = AnsibleModule(
        argument_spec=dict(
            state=dict(type="str", choices=["started", "stopped"], required=True),
            unit=dict(type="str", default="kunlun-model-share"),
            script=dict(type="path"),
            address=dict(type="str"),
            port=dict(type="int", default=8478),
            root=dict(type="path"),
            manifest=dict(type="path"),
            prefix=dict(type="str", default=""),
            allow=dict(type="list", elements="str", default=[]),
            max_transfers=dict(type="int", default=2),
            rate=dict(type="int", default=0),
            wait=dict(type="int", default=30),
        ),
        required_if=[("state", "started", ("script", "address", "root", "manifest"))],
        supports_check_mode=True,
    )
    p = module.params
    systemctl = module.get_bin_path("systemctl", required=True)
    stats_file = "/run/%s/stats.json" % p["unit"]
    active = _active(module, systemctl, p["unit"])
    if p["state"] == "stopped":
        stats = _stats(stats_file)
        if not active:
            module.exit_json(changed=False, active=False, stats=stats)
        if not module.check_mode:
            rc, out, err = module.run_command([systemctl, "stop", p["unit"] + ".service"])
            if rc != 0:
                module.fail_json(msg="systemctl stop %s.service failed: %s" % (p["unit"], (err or out).strip()))
        module.exit_json(changed=True, active=False, stats=stats)
    server_args = [
        "--bind",
        p["address"],
        "--port",
        str(p["port"]),
        "--root",
        p["root"],
        "--manifest",
        p["manifest"],
        "--prefix",
        p["prefix"],
        "--allow",
        ",".join(p["allow"]),
        "--max-transfers",
        str(p["max_transfers"]),
        "--rate",
        str(p["rate"]),
        "--stats-file",
        stats_file,
    ]
    if active:
        running = _stats(stats_file) or {}
        if running.get("argv") == server_args:
            module.exit_json(changed=False, active=True, stats=running)
        # left running by an interrupted run with other settings: restart it with these
        if not module.check_mode:
            module.run_command([systemctl, "stop", p["unit"] + ".service"])
    if p["max_transfers"] < 1:
        module.fail_json(msg="max_transfers must be at least 1, not %d" % p["max_transfers"])
    if module.check_mode:
        # the files it would serve may only be there after this run's earlier transfers
        module.exit_json(changed=True, active=False)
    for what in ("script", "manifest"):
        if not os.path.isfile(p[what]):
            module.fail_json(msg="The model share's %s %s does not exist" % (what, p[what]))
    if not os.path.isdir(p["root"]):
        module.fail_json(msg="The model directory %s to share does not exist" % p["root"])
    systemd_run = module.get_bin_path("systemd-run", required=True)
    python = module.get_bin_path("python3", required=True)
    # a unit left failed by an earlier run keeps its name: clear it first
    module.run_command([systemctl, "reset-failed", p["unit"] + ".service"])
    argv = [
        systemd_run,
        "--unit",
        p["unit"],
        "--collect",
        "--description",
        "kunlun-fleet: read-only share of the verified model for the model stage",
        "--property",
        "RuntimeDirectory=%s" % p["unit"],
        "--property",
        "ProtectSystem=strict",
        "--property",
        "ProtectHome=read-only",
        "--property",
        "PrivateTmp=yes",
        "--property",
        "NoNewPrivileges=yes",
        # The model lives on the data volume: never served from the directory under its mount point.
        "--property",
        "RequiresMountsFor=%s" % p["root"],
        "--",
        python,
        p["script"],
    ] + server_args
    rc, out, err = module.run_command(argv)
    if rc != 0:
        module.fail_json(msg="systemd-run could not start the model share: %s" % (err or out).strip(), cmd=argv)
    deadline = time.time() + p["wait"]
    while not _answers(p["address"], p["port"]):
        if time.time() > deadline or not _active(module, systemctl, p["unit"]):
            _rc, journal, _err = module.run_command(
                ["journalctl", "--no-pager", "-n", "20", "-u", p["unit"] + ".service"]
            )
            module.run_command([systemctl, "stop", p["unit"] + ".service"])
            module.fail_json(
                msg="The model share %s.service does not answer on %s:%d after %ds (port taken, or the "
                "address is not this host's). Its journal:\n%s"
                % (p["unit"], p["address"], p["port"], p["wait"], journal.strip())
            )
        time.sleep(0.2)
    module.exit_json(changed=True, active=True, stats=_stats(stats_file))


if __name__ == "__main__":
    main()
