#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: kunlun-fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: engine_state
short_description: Read the Docker engine's configuration and data-root, and work out the merged daemon.json
description:
  - Reads the daemon configuration file I(daemon_json) and says which of five states it is in
    (C(absent), C(present), C(unreadable), C(invalid), C(not_object)); only C(absent) and C(present)
    can be merged into. An unreadable file (a directory at that path, a dangling symbolic link, an
    I/O error) is never taken for an absent one, so the keys it holds cannot be dropped.
  - Works out the file the engine role writes (I(merged)) - the file's keys, then I(settings) without
    C(exec-opts), then I(extra) (both merged recursively; I(extra) wins), C(graph) dropped, C(data-root)
    set to I(data_root), and C(exec-opts) the file's entries without C(native.cgroupdriver=...) followed
    by the C(exec-opts) of I(settings).
  - Reads the data-root in use (the file's C(data-root), else its C(graph), else C(/var/lib/docker)),
    whether it holds anything when it differs from I(data_root), and - when the merged file sets
    C(storage-driver) - the storage drivers of the images and containers it holds, seen on disk
    (C(image/<driver>/) with content) and by the running engine (C(docker info)).
  - Read-only; safe in check mode.
options:
  daemon_json:
    description: The daemon configuration file (C(engine_daemon_json)).
    type: path
    required: true
  data_root:
    description: The data-root the role configures (C(engine_data_root)).
    type: path
    required: true
  settings:
    description: The keys the project sets (C(engine_daemon_settings)); C(exec-opts) is merged entry by entry.
    type: dict
    default: {}
  extra:
    description: More keys to merge (C(engine_daemon_extra)); they win over the file's and I(settings).
    type: dict
    default: {}
  docker_info_timeout:
    description: Seconds C(docker info) may take before the running engine is taken as not answering.
    type: int
    default: 30
author:
  - kunlun-fleet contributors (@kunlun-fleet)
"""

EXAMPLES = r"""
- name: Read daemon.json, the merged result and the data-root in use
  engine_state:
    daemon_json: /etc/docker/daemon.json
    data_root: /home/docker
    settings: {storage-driver: overlay2, exec-opts: [native.cgroupdriver=systemd]}
    extra: {registry-mirrors: ["https://mirror.example"]}
  register: engine_state

- name: daemon.json can be merged into
  ansible.builtin.assert:
    that: engine_state.daemon_json.state in ['absent', 'present']
    fail_msg: "{{ engine_state.daemon_json.path }} is {{ engine_state.daemon_json.error }}"
"""

RETURN = r"""
daemon_json:
  description:
    - The file - C(path); C(state) (absent, present, unreadable, invalid, not_object); C(error), what is
      wrong in words (empty when absent or present); C(content), its keys (empty unless present).
  returned: always
  type: dict
  sample:
    path: /etc/docker/daemon.json
    state: invalid
    error: "not valid JSON: Expecting ',' delimiter: line 3 column 1 (char 40)"
    content: {}
merged:
  description: The daemon.json the role writes; empty when the file cannot be merged into.
  returned: always
  type: dict
  sample: {data-root: /home/docker, storage-driver: overlay2, exec-opts: [native.cgroupdriver=systemd],
           labels: [site=lab-7]}
old_root:
  description: The data-root in use (the file's C(data-root), else C(graph), else C(/var/lib/docker)).
  returned: always
  type: str
  sample: /var/lib/docker
old_root_content:
  description: Whether the data-root in use holds anything and differs from I(data_root) (a carry-over is due).
  returned: always
  type: bool
drivers:
  description:
    - What the data-root in use was used with, read only when the merged file sets C(storage-driver) -
      C(read) (whether it was read), C(on_disk) (drivers with images, layers or mounts under
      C(image/<driver>/)), C(running), C(running_root), C(running_images), C(running_containers) (from
      C(docker info) of the running engine; empty and 0 when none answers).
  returned: always
  type: dict
  sample: {read: true, on_disk: [vfs], running: vfs, running_root: /var/lib/docker, running_images: 1,
           running_containers: 0}
old_root_drivers:
  description:
    - The storage drivers whose images or containers the data-root in use holds - the ones on disk, and
      the running engine's when it runs on that data-root with any image or container.
  returned: always
  type: list
  elements: str
  sample: [vfs]
"""

import errno
import json
import os
import re

from ansible.module_utils.basic import AnsibleModule

DEFAULT_ROOT = "/var/lib/docker"
# image/<driver>/ holds the image and layer metadata of each driver that was used.
DRIVER_CONTENT = ("imagedb/content/sha256", "layerdb/sha256", "layerdb/mounts")
CGROUP_DRIVER = re.compile(r"native\.cgroupdriver=")


def read_daemon_json(path):
    """{path, state, error, content}: absent, present, unreadable, invalid or not_object."""
    found = {"path": path, "state": "absent", "error": "", "content": {}}
    if not os.path.lexists(path):
        return found
    try:
        with open(path, "rb") as fh:
            raw = fh.read()
    except (IOError, OSError) as exc:
        if exc.errno == errno.EISDIR:
            why = "a directory"
        elif exc.errno == errno.ENOENT and os.path.islink(path):
            why = "a symbolic link to %s, which does not exist" % os.readlink(path)
        else:
            why = exc.strerror or str(exc)
        found.update(state="unreadable", error="unreadable (%s)" % why)
        return found
    try:
        data = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        found.update(state="invalid", error="not valid JSON: not UTF-8 text (%s)" % exc)
        return found
    except ValueError as exc:
        found.update(state="invalid", error="not valid JSON: %s" % exc)
        return found
    if not isinstance(data, dict):
        found.update(state="not_object", error="valid JSON but not an object (a mapping of keys)")
        return found
    found.update(state="present", content=data)
    return found


def combine(base, *others):
    """Ansible's combine(..., recursive=True): mappings merged key by key, anything else replaced."""
    result = dict(base)
    for other in others:
        for key, value in other.items():
            if isinstance(result.get(key), dict) and isinstance(value, dict):
                result[key] = combine(result[key], value)
            else:
                result[key] = value
    return result


def merge(current, settings, extra, data_root):
    """The daemon.json the role writes (the operator's keys kept)."""
    project_keys = dict((k, v) for k, v in settings.items() if k != "exec-opts")
    kept = dict((k, v) for k, v in current.items() if k != "graph")
    merged = combine(kept, project_keys, extra)
    opts = current.get("exec-opts", [])
    opts = opts if isinstance(opts, list) else [opts]
    merged["data-root"] = data_root
    merged["exec-opts"] = [o for o in opts if not (isinstance(o, str) and CGROUP_DRIVER.match(o))] + list(
        settings.get("exec-opts") or []
    )
    return merged


def old_root_of(current):
    for key in ("data-root", "graph"):
        if current.get(key):
            return current[key]
    return DEFAULT_ROOT


def has_content(path):
    """Whether the directory holds any entry (absent: no); other errors are raised."""
    try:
        with os.scandir(path) as entries:
            return any(True for _entry in entries)
    except (IOError, OSError) as exc:
        if exc.errno == errno.ENOENT:
            return False
        raise


def drivers_on_disk(root):
    image_dir = os.path.join(root, "image")
    seen = []
    for drv in sorted(os.listdir(image_dir)) if os.path.isdir(image_dir) else []:
        for sub in DRIVER_CONTENT:
            d = os.path.join(image_dir, drv, sub)
            if os.path.isdir(d) and os.listdir(d):
                seen.append(drv)
                break
    return seen


def running_engine(module, timeout):
    """docker info of the running engine ({} when there is no docker or it does not answer)."""
    docker = module.get_bin_path("docker")
    if not docker:
        return {}
    argv = [docker, "info", "--format", "{{json .}}"]
    limiter = module.get_bin_path("timeout")
    if limiter:
        argv = [limiter, str(timeout)] + argv
    rc, out, _err = module.run_command(argv)
    if rc != 0:
        return {}
    try:
        info = json.loads(out)
    except ValueError:
        return {}
    return info if isinstance(info, dict) else {}


def read_drivers(module, old_root, timeout):
    seen = {
        "read": True,
        "on_disk": drivers_on_disk(old_root),
        "running": "",
        "running_root": "",
        "running_images": 0,
        "running_containers": 0,
    }
    info = running_engine(module, timeout)
    if info.get("Driver"):
        seen.update(
            running=info["Driver"],
            running_root=info.get("DockerRootDir") or "",
            running_images=int(info.get("Images") or 0),
            running_containers=int(info.get("Containers") or 0),
        )
    return seen


def old_root_drivers(seen, old_root):
    drivers = list(seen["on_disk"])
    if (
        seen["running"]
        and seen["running_root"].rstrip("/") == old_root.rstrip("/")
        and seen["running_images"] + seen["running_containers"] > 0
    ):
        drivers.append(seen["running"])
    unique = []
    for drv in drivers:
        if drv not in unique:
            unique.append(drv)
    return unique


def read(module, daemon_json, data_root, settings, extra, timeout=30):
    found = read_daemon_json(daemon_json)
    current = found["content"]
    usable = found["state"] in ("absent", "present")
    merged = merge(current, settings, extra, data_root) if usable else {}
    old_root = old_root_of(current)
    content = False
    if usable and old_root.rstrip("/") != data_root.rstrip("/"):
        try:
            content = has_content(old_root)
        except (IOError, OSError) as exc:
            module.fail_json(
                msg="the engine's data-root in use %s cannot be read (%s); nothing was changed. "
                "Fix: make it a readable directory, or point data-root in %s at the right one."
                % (old_root, exc.strerror or exc, daemon_json)
            )
    seen = {
        "read": False,
        "on_disk": [],
        "running": "",
        "running_root": "",
        "running_images": 0,
        "running_containers": 0,
    }
    if "storage-driver" in merged:
        seen = read_drivers(module, old_root, timeout)
    return {
        "daemon_json": found,
        "merged": merged,
        "old_root": old_root,
        "old_root_content": content,
        "drivers": seen,
        "old_root_drivers": old_root_drivers(seen, old_root),
    }


def main():
    module = AnsibleModule(
        argument_spec=dict(
            daemon_json=dict(type="path", required=True),
            data_root=dict(type="path", required=True),
            settings=dict(type="dict", default={}),
            extra=dict(type="dict", default={}),
            docker_info_timeout=dict(type="int", default=30),
        ),
        supports_check_mode=True,
    )
    p = module.params
    module.exit_json(
        changed=False,
        **read(
            module, p["daemon_json"], p["data_root"], p["settings"] or {}, p["extra"] or {}, p["docker_info_timeout"]
        ),
    )


if __name__ == "__main__":
    main()
