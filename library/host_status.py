#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: kunlun-fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: host_status
short_description: Read a serving host's state in one call, live and read-only (kunlun-fleet status)
description:
  - Reads, in one call, what an operator checks every morning on a serving host - the OS
    (C(PRETTY_NAME) of C(/etc/os-release)) and the kernel; the data volume at I(mount_point)
    (source device and filesystem type from C(/proc/self/mountinfo), size and free bytes from
    statvfs, and the line of I(fstab) that mounts it, which a volume not mounted names - its
    device did not appear at boot, a data disk failed or missing); the driver facts the
    driver stage leaves in I(facts_file) (driver version, the devices and their state, each
    card's power cap); the serving unit (its state and since
    when, from C(systemctl show)), the image it runs (the running
    container's image, else the image ID the unit pins) against the ID of I(image) (the
    current serving tag), the served model name and port from the unit's C(ExecStart); and the
    requests running and waiting on the local vLLM (C(vllm:num_requests_running),
    C(vllm:num_requests_waiting) of C(http://127.0.0.1:<port>/metrics), a short timeout; C(https://) verified
    with I(ca_file) when the unit serves TLS, C(--ssl-certfile)).
  - Every read that fails gives its section an C(error) in words (C(unreadable - <reason>),
    C(no driver facts - ...)) and null values; the module fails only on bad parameters.
  - Reads no secret (never the serving API key file) and changes nothing (C(changed) is always
    false); safe in check mode.
options:
  mount_point:
    description: The data volume's mount point (C(storage_mount_point)).
    type: path
    default: /home
  fstab:
    description: The fstab file whose line for I(mount_point) is reported.
    type: path
    default: /etc/fstab
  service:
    description: The serving unit and its container, without C(.service) (C(serve_service_name)).
    type: str
    default: kunlun-serve
  unit_file:
    description: The serving unit's file. Default C(/etc/systemd/system/<service>.service).
    type: path
  config_dir:
    description: The serve role's configuration directory; its C(image) file holds the pinned image ID.
    type: path
    default: /etc/kunlun-serve
  image:
    description: The serving image's current tag, C(<repository>:<tag>) (C(serve_image_ref)).
    type: str
    default: kunlun-serving:current
  previous_tag:
    description: The tag of the image a rollback returns to (named when a host runs it).
    type: str
    default: previous
  facts_file:
    description: The driver stage's facts file (JSON, C(driver_facts_file)).
    type: path
    default: /etc/ansible/facts.d/xpu.fact
  expected_devices:
    description: Accelerators the host should have (C(kunlun_stack_device_count)); null to leave them unjudged.
    type: int
  full_power_cap_w:
    description: A card's full power cap in watts (C(kunlun_stack_full_power_cap_w)); null to leave caps unjudged.
    type: int
  port:
    description: The serving port when the unit names none (C(--port)).
    type: int
    default: 8000
  worker_url:
    description: The URL the gateways list this host under (C(kunlun_stack_worker_urls)); returned as given.
    type: str
    default: ""
  ca_file:
    description:
      - The CA certificate file that alone verifies the local server when its unit serves TLS (the fleet CA's on the
        host, C(kunlun_stack_worker_ca_host)). Omitted or empty - the host's trust store.
    type: path
  metrics_timeout:
    description: Seconds the read of the local C(/metrics) may take.
    type: float
    default: 3
  command_timeout:
    description: Seconds each C(systemctl) or C(docker) command may take (with C(timeout) when installed).
    type: int
    default: 10
author:
  - kunlun-fleet contributors (@kunlun-fleet)
"""

EXAMPLES = r"""
- name: Read the host
  host_status:
    expected_devices: 8
    full_power_cap_w: 400
  register: status_host

- name: Another mount point and service name
  host_status:
    mount_point: /data
    service: vllm-serve
    image: registry.example:5000/kunlun-serving:current
"""

RETURN = r"""
os:
  description: C(pretty_name) (os-release's PRETTY_NAME), C(kernel) (the release), C(error).
  returned: always
  type: dict
  sample: {pretty_name: "Debian GNU/Linux 12 (bookworm)", kernel: 6.1.0-25-amd64, error: ""}
volume:
  description:
    - What holds I(mount_point) - C(mount_point), C(mounted) (a filesystem is mounted there),
      C(source), C(fstype), C(size_bytes), C(free_bytes) (available to users), C(free_pct),
      C(fstab) (the last line of I(fstab) that mounts at I(mount_point), as written; null when none),
      C(mount_unit) (systemd's unit for the mount point, C(home.mount)), C(error).
  returned: always
  type: dict
  sample: {mount_point: /home, mounted: true, source: /dev/mapper/data-home, fstype: xfs,
           size_bytes: 15393162788864, free_bytes: 14983105024000, free_pct: 97.3,
           fstab: "UUID=0b9c... /home xfs defaults,nofail,x-systemd.device-timeout=90s 0 0", mount_unit: home.mount,
           error: ""}
driver:
  description:
    - From I(facts_file) - C(state) (present, absent, unreadable), C(version), C(pin), C(devices)
      (the devices listed), C(devices_ok) (in state ok), C(expected), C(bad_devices) (indexes not
      ok), C(power_caps_w), C(low_power) (indexes capped below I(full_power_cap_w)), C(power_ok)
      (null when not judged or unknown), C(error).
  returned: always
  type: dict
  sample: {state: present, version: 5.0.21.26, pin: 5.0.21.26, devices: 8, devices_ok: 8, expected: 8,
           bad_devices: [], power_caps_w: [400, 400, 400, 400, 400, 400, 400, 400], low_power: [],
           power_ok: true, error: ""}
service:
  description:
    - C(unit); C(active), systemd's ActiveState (active, inactive, failed, activating, ...) or
      C(not-found); C(sub); C(since) (ActiveEnterTimestamp); C(active_for_s); C(error).
  returned: always
  type: dict
  sample: {unit: kunlun-serve.service, active: active, sub: running, since: "Tue 2026-12-01 06:12:03 UTC",
           active_for_s: 10840.2, error: ""}
image:
  description:
    - C(ref) (I(image)); C(current_id) and C(previous_id) (the tags' image IDs on the host);
      C(unit_id) (the ID in the unit's ExecStart); C(pinned_id) (C(config_dir/image));
      C(running_id) and C(container) (the container's image and state); C(runs_id) (the
      running container's image, else the unit's, else a stopped container's); C(runs_tags)
      (the repository's tags of it); C(stack) (the name of the stack that image was built
      from, its C(org.kunlun-fleet.stack) label; empty when it has none);
      C(state) - C(current), C(stale) (another image than the current tag), C(none) (no unit,
      no container) or C(unknown) (see C(error)); C(error).
  returned: always
  type: dict
  sample: {ref: "kunlun-serving:current", current_id: "sha256:9f1c...", previous_id: "sha256:41ab...",
           unit_id: "sha256:9f1c...", pinned_id: "sha256:9f1c...", running_id: "sha256:9f1c...",
           container: running, runs_id: "sha256:9f1c...", runs_tags: [current, 3e5f0a9c1d2b],
           stack: 0.15.1-4885de2, state: current, error: ""}
serving:
  description:
    - C(model) (the unit's C(--served-model-name)), C(port), C(worker_url) (as given),
      C(requests_running), C(requests_waiting) (null when not read), C(error) (the unit or
      C(/metrics) could not be read), C(held_out) (the reason in C(config_dir/held-out), written
      when the driver stage's rolling pass held the host out of service; null when there is none).
  returned: always
  type: dict
  sample: {model: Qwen3.8-27B-INT8-W8A8-Dynamic, port: 8000, worker_url: "http://10.20.1.11:8000",
           requests_running: 3, requests_waiting: 0, error: "", held_out: null}
"""

import json
import os
import re
import shlex
import ssl
import urllib.request as urllib_request

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.bench_results import parse_prometheus

# Files read from the host; the readers take them as arguments (tests point them at fixtures).
OS_RELEASE = "/etc/os-release"
MOUNTINFO = "/proc/self/mountinfo"
FSTAB = "/etc/fstab"
UPTIME = "/proc/uptime"
UNIT_DIR = "/etc/systemd/system"

# docker run options that take no value (every other option takes one, unless written --opt=value).
DOCKER_FLAGS = frozenset(
    [
        "--rm",
        "--init",
        "--privileged",
        "--read-only",
        "-d",
        "--detach",
        "-i",
        "--interactive",
        "-t",
        "--tty",
        "-it",
        "-ti",
        "--no-healthcheck",
        "--oom-kill-disable",
        "-P",
        "--publish-all",
        "--sig-proxy",
    ]
)


def unreadable(exc):
    """'unreadable: <reason>' for an exception, in words."""
    if isinstance(exc, (IOError, OSError)) and getattr(exc, "strerror", None):
        why = exc.strerror + (" (%s)" % exc.filename if getattr(exc, "filename", None) else "")
    else:
        why = str(exc) or type(exc).__name__
    return "unreadable: %s" % why


# ---------------------------------------------------------------- OS and kernel
def parse_os_release(text):
    """{KEY: value} from os-release (shell-quoted values)."""
    out = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, _sep, value = line.partition("=")
        try:
            parts = shlex.split(value)
        except ValueError:
            parts = [value.strip("\"'")]
        out[key.strip()] = " ".join(parts)
    return out


def read_os(path=OS_RELEASE, kernel=None):
    found = {"pretty_name": None, "kernel": kernel if kernel is not None else os.uname()[2], "error": ""}
    try:
        with open(path) as fh:
            info = parse_os_release(fh.read())
    except (IOError, OSError) as exc:
        found["error"] = unreadable(exc)
        return found
    name = info.get("PRETTY_NAME") or " ".join(v for v in (info.get("NAME"), info.get("VERSION")) if v)
    if name:
        found["pretty_name"] = name
    else:
        found["error"] = "unreadable: %s has no PRETTY_NAME" % path
    return found


# ---------------------------------------------------------------- the data volume
def _unescape_mount(text):
    """Mount points in mountinfo escape space, tab, newline and backslash as \\ooo."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), text)


def parse_mountinfo(text, mount_point):
    """{source, fstype} of the top filesystem mounted at mount_point, or {}."""
    want = os.path.normpath(mount_point)
    top = {}
    for line in text.splitlines():
        if " - " not in line:
            continue
        left, _sep, right = line.partition(" - ")
        left, right = left.split(), right.split()
        if len(left) < 5 or len(right) < 2:
            continue
        if os.path.normpath(_unescape_mount(left[4])) == want:
            top = {"fstype": right[0], "source": _unescape_mount(right[1])}
    return top


def fstab_line(text, mount_point):
    """The last line of fstab text that mounts at mount_point (mount -a takes them in order), as written; or None."""
    want = os.path.normpath(mount_point)
    found = None
    for line in text.splitlines():
        fields = line.split()
        if not fields or fields[0].startswith("#") or len(fields) < 2:
            continue
        if os.path.normpath(_unescape_mount(fields[1])) == want:
            found = " ".join(fields)
    return found


def mount_unit_name(mount_point):
    """systemd's mount unit for a path (systemd-escape --path --suffix=mount): /home -> home.mount."""
    path = os.path.normpath(mount_point).strip("/")
    if not path:
        return "-.mount"
    out = []
    for i, char in enumerate(path):
        if char == "/":
            out.append("-")
        elif char.isalnum() and ord(char) < 128 or char in "_:" or (char == "." and i > 0):
            out.append(char)
        else:
            out.append("".join("\\x%02x" % b for b in char.encode("utf-8")))
    return "".join(out) + ".mount"


def read_volume(mount_point, mountinfo=MOUNTINFO, statvfs=os.statvfs, fstab=FSTAB):
    found = {
        "mount_point": mount_point,
        "mounted": False,
        "source": None,
        "fstype": None,
        "size_bytes": None,
        "free_bytes": None,
        "free_pct": None,
        "fstab": None,
        "mount_unit": mount_unit_name(mount_point),
        "error": "",
    }
    try:
        with open(fstab) as fh:
            found["fstab"] = fstab_line(fh.read(), mount_point)
    except (IOError, OSError):
        pass
    try:
        with open(mountinfo) as fh:
            top = parse_mountinfo(fh.read(), mount_point)
        if top:
            found.update(mounted=True, **top)
    except (IOError, OSError) as exc:
        found["error"] = unreadable(exc)
    try:
        st = statvfs(mount_point)
    except (IOError, OSError) as exc:
        found["error"] = found["error"] or unreadable(exc)
        return found
    size = st.f_blocks * st.f_frsize
    free = st.f_bavail * st.f_frsize
    found.update(size_bytes=size, free_bytes=free, free_pct=round(100.0 * free / size, 1) if size else None)
    if not found["mounted"] and not found["error"]:
        if found["fstab"]:
            # Mounted at boot or never: its device did not appear (nofail let the boot go on).
            found["error"] = (
                "nothing mounted at %s: fstab mounts it (%s) but it is not mounted; its device did not appear at boot "
                "(a data disk failed or missing?): check pvs, lvs -a -o +devices and journalctl -b -u %s"
                % (mount_point, found["fstab"], found["mount_unit"])
            )
        else:
            found["error"] = "nothing mounted at %s and no fstab line for it (it is on the filesystem below it)" % (
                mount_point
            )
    return found


# ---------------------------------------------------------------- driver facts
def _int(value):
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def read_driver(path, expected=None, full_power=None):
    found = {
        "facts_file": path,
        "state": "absent",
        "version": None,
        "pin": None,
        "devices": None,
        "devices_ok": None,
        "expected": expected,
        "bad_devices": [],
        "power_caps_w": [],
        "low_power": [],
        "power_ok": None,
        "error": "",
    }
    if not os.path.lexists(path):
        found["error"] = "no driver facts (%s is missing: the driver stage has not completed here)" % path
        return found
    try:
        with open(path) as fh:
            facts = json.load(fh)
    except (IOError, OSError) as exc:
        found.update(state="unreadable", error=unreadable(exc))
        return found
    except ValueError as exc:
        found.update(state="unreadable", error="unreadable: %s is not JSON (%s)" % (path, exc))
        return found
    if not isinstance(facts, dict):
        found.update(state="unreadable", error="unreadable: %s is not a JSON object" % path)
        return found
    devices = facts.get("devices") if isinstance(facts.get("devices"), list) else []
    devices = [d for d in devices if isinstance(d, dict)]
    caps = [_int(d.get("power_cap_w")) for d in devices]
    found.update(
        state="present",
        version=facts.get("driver"),
        pin=facts.get("pin"),
        devices=len(devices),
        devices_ok=sum(1 for d in devices if d.get("state") == "ok"),
        bad_devices=[d.get("index", i) for i, d in enumerate(devices) if d.get("state") != "ok"],
        power_caps_w=caps,
    )
    if full_power:
        found["low_power"] = [
            d.get("index", i) for i, (d, cap) in enumerate(zip(devices, caps)) if cap is not None and cap < full_power
        ]
        known = [cap for cap in caps if cap is not None]
        found["power_ok"] = (
            (not found["low_power"]) if known and len(known) == len(caps) else (False if found["low_power"] else None)
        )
    return found


# ---------------------------------------------------------------- the serving unit
def unit_exec_start(text):
    """The ExecStart command line of a systemd unit as argv ([] when there is none): its
    quotes as systemd reads them, %% and $$ (the unit's literal % and $) as one character."""
    joined = re.sub(r"\\\n", " ", text)
    for line in joined.splitlines():
        line = line.strip()
        if line.startswith("ExecStart="):
            value = line[len("ExecStart=") :].lstrip("-@+!:")
            try:
                words = shlex.split(value)
            except ValueError:
                words = value.split()
            return [re.sub(r"([%$])\1", r"\1", word) for word in words]
    return []


def parse_docker_run(argv):
    """{image, args} of a `docker run` command line (image None when it is not one)."""
    if "run" not in argv[:3]:
        return {"image": None, "args": []}
    rest = argv[argv.index("run") + 1 :]
    i = 0
    while i < len(rest):
        token = rest[i]
        if not token.startswith("-"):
            return {"image": token, "args": rest[i + 1 :]}
        i += 1 if (token in DOCKER_FLAGS or "=" in token) else 2
    return {"image": None, "args": []}


def flag_value(args, name):
    """The value of --name (as `--name value` or `--name=value`) in args, or None."""
    for i, arg in enumerate(args):
        if arg == name and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return None


def read_unit(path):
    """{image, model, port, tls, error} from the serving unit's ExecStart (tls: it names a
    certificate, vllm's --ssl-certfile)."""
    found = {"image": None, "model": None, "port": None, "tls": False, "error": ""}
    if not os.path.lexists(path):
        found["error"] = "no unit %s (the serve stage has not run here)" % path
        return found
    try:
        with open(path) as fh:
            argv = unit_exec_start(fh.read())
    except (IOError, OSError) as exc:
        found["error"] = unreadable(exc)
        return found
    run = parse_docker_run(argv)
    if not run["image"]:
        found["error"] = "unreadable: %s's ExecStart is not a docker run" % path
        return found
    found.update(
        image=run["image"],
        model=flag_value(run["args"], "--served-model-name"),
        port=_int(flag_value(run["args"], "--port")),
        tls=bool(flag_value(run["args"], "--ssl-certfile")),
    )
    return found


def read_held_out(config_dir):
    """The reason the host was held out of service (config_dir/held-out, its first line), or None."""
    try:
        with open(os.path.join(config_dir, "held-out")) as fh:
            return fh.readline().strip() or "held out (no reason written)"
    except (IOError, OSError):
        return None


def read_pinned(config_dir):
    """The image ID the serve role pinned (config_dir/image), or None."""
    try:
        with open(os.path.join(config_dir, "image")) as fh:
            return fh.read().strip() or None
    except (IOError, OSError):
        return None


def parse_systemctl_show(text):
    out = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            out[key.strip()] = value.strip()
    return out


def _limited(module, argv, timeout):
    limiter = module.get_bin_path("timeout")
    return [limiter, str(timeout)] + argv if limiter else argv


def _said(rc, out, err, timeout):
    if rc == 124:
        return "no answer within %d s" % timeout
    return (err or out).strip().splitlines()[-1] if (err or out).strip() else "exit status %d" % rc


def read_service(module, service, timeout, uptime=UPTIME):
    unit = "%s.service" % service
    found = {"unit": unit, "active": None, "sub": None, "since": None, "active_for_s": None, "error": ""}
    systemctl = module.get_bin_path("systemctl")
    if not systemctl:
        found["error"] = "unreadable: no systemctl on the host"
        return found
    props = "LoadState,ActiveState,SubState,ActiveEnterTimestamp,ActiveEnterTimestampMonotonic"
    rc, out, err = module.run_command(
        _limited(module, [systemctl, "show", unit, "--property", props], timeout), environ_update={"LC_ALL": "C"}
    )
    if rc != 0:
        found["error"] = "unreadable: systemctl show %s: %s" % (unit, _said(rc, out, err, timeout))
        return found
    show = parse_systemctl_show(out)
    if show.get("LoadState") == "not-found":
        found.update(active="not-found", sub="dead")
        return found
    found.update(
        active=show.get("ActiveState") or None,
        sub=show.get("SubState") or None,
        since=show.get("ActiveEnterTimestamp") or None,
    )
    mono = _int(show.get("ActiveEnterTimestampMonotonic"))
    if found["active"] == "active" and mono:
        try:
            with open(uptime) as fh:
                found["active_for_s"] = round(max(0.0, float(fh.read().split()[0]) - mono / 1e6), 1)
        except (IOError, OSError, ValueError, IndexError):
            pass
    return found


# ---------------------------------------------------------------- the image
def split_ref(ref):
    """(repository, tag) of an image reference; tag 'latest' when it has none."""
    head, sep, tail = ref.rpartition(":")
    if sep and "/" not in tail:
        return head, tail
    return ref, "latest"


def parse_docker_images(text):
    """{tag: image ID} from `docker images --format '{{.Tag}} {{.ID}}'`."""
    out = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] != "<none>":
            out[parts[0]] = parts[1]
    return out


def judge_image(found, tags, current_tag, previous_tag):
    """Fills runs_id, runs_tags and state from what was read."""

    def resolve(ref):
        if not ref or ref.startswith("sha256:"):
            return ref
        repo, tag = split_ref(ref)
        return tags.get(tag, ref) if repo == split_ref(found["ref"])[0] else ref

    found["current_id"] = tags.get(current_tag)
    found["previous_id"] = tags.get(previous_tag)
    running = found["running_id"] if found["container"] == "running" else None
    # The running container's image; else the one the unit starts; else a stopped container's.
    runs = resolve(running or found["unit_id"] or found["pinned_id"] or found["running_id"])
    found["runs_id"] = runs
    found["runs_tags"] = sorted(t for t, i in tags.items() if runs and i == runs)
    if found["error"]:
        found["state"] = "unknown"
    elif not runs:
        found["state"] = "none"
    elif not found["current_id"]:
        found.update(state="unknown", error="no %s on the host (the image stage has not run here)" % found["ref"])
    else:
        found["state"] = "current" if runs == found["current_id"] else "stale"
    return found


def read_image(module, ref, previous_tag, service, unit_image, pinned, timeout):
    repo, current_tag = split_ref(ref)
    found = {
        "ref": ref,
        "current_id": None,
        "previous_id": None,
        "unit_id": unit_image,
        "pinned_id": pinned,
        "running_id": None,
        "container": None,
        "runs_id": None,
        "runs_tags": [],
        "stack": "",
        "state": "unknown",
        "error": "",
    }
    tags = {}
    docker = module.get_bin_path("docker")
    if not docker:
        found["error"] = "unreadable: no docker on the host"
        return judge_image(found, tags, current_tag, previous_tag)
    rc, out, err = module.run_command(
        _limited(module, [docker, "images", "--no-trunc", "--format", "{{.Tag}} {{.ID}}", repo], timeout)
    )
    if rc != 0:
        found["error"] = "unreadable: docker images %s: %s" % (repo, _said(rc, out, err, timeout))
        return judge_image(found, tags, current_tag, previous_tag)
    tags = parse_docker_images(out)
    rc, out, err = module.run_command(
        _limited(module, [docker, "container", "inspect", "--format", "{{.Image}} {{.State.Status}}", service], timeout)
    )
    if rc == 0 and len(out.split()) >= 2:
        found["running_id"], found["container"] = out.split()[:2]
    elif rc == 124:
        found["error"] = "unreadable: docker container inspect %s: %s" % (service, _said(rc, out, err, timeout))
    else:
        found["container"] = "absent"
    judge_image(found, tags, current_tag, previous_tag)
    found["stack"] = read_stack(module, docker, found["runs_id"], timeout)
    return found


# The label the image stage gives every serving image: the name of the stack it was built from.
STACK_LABEL = "org.kunlun-fleet.stack"


def read_stack(module, docker, image_id, timeout):
    """The stack the image `image_id` was built from (its STACK_LABEL); '' when the image has
    none (built before stacks were named) or it cannot be read."""
    if not image_id:
        return ""
    fmt = '{{ index .Config.Labels "%s" }}' % STACK_LABEL
    rc, out, err = module.run_command(
        _limited(module, [docker, "image", "inspect", "--format", fmt, image_id], timeout)
    )
    value = out.strip() if rc == 0 else ""
    return "" if value == "<no value>" else value


# ---------------------------------------------------------------- requests in flight
def parse_metrics(text):
    """(running, waiting) summed over vLLM's engines, each None when /metrics lacks it."""
    metrics = parse_prometheus(text or "")

    def total(name):
        values = metrics.get("vllm:num_requests_" + name)
        return sum(values.values()) if values else None

    return total("running"), total("waiting")


def read_requests(port, timeout, opener=None, tls=False, ca_file=None):
    """{requests_running, requests_waiting, error} from http://127.0.0.1:<port>/metrics, or
    https:// verified with ca_file alone when the server serves TLS."""
    found = {"requests_running": None, "requests_waiting": None, "error": ""}
    # No proxy for loopback, whatever the environment says.
    if opener is None:
        handlers = [urllib_request.ProxyHandler({})]
        if tls:
            handlers.append(urllib_request.HTTPSHandler(context=ssl.create_default_context(cafile=ca_file or None)))
        opener = urllib_request.build_opener(*handlers)
    url = "%s://127.0.0.1:%d/metrics" % ("https" if tls else "http", port)
    try:
        resp = opener.open(url, timeout=timeout)
        try:
            text = resp.read().decode("utf-8", "replace")
        finally:
            resp.close()
    except Exception as exc:  # noqa: BLE001 - any failure is a value here, never the module's
        reason = getattr(exc, "reason", None) or exc
        found["error"] = "unreadable: %s: %s" % (url, reason)
        return found
    running, waiting = parse_metrics(text)
    if running is None and waiting is None:
        found["error"] = "unreadable: %s has no vllm:num_requests_running / _waiting" % url
    found.update(
        requests_running=None if running is None else int(running),
        requests_waiting=None if waiting is None else int(waiting),
    )
    return found


# ---------------------------------------------------------------- all of it
def _guard(reader, fallback, *args, **kwargs):
    """A reader's result, or its fallback with the unexpected error in words."""
    try:
        return reader(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001 - a read that breaks is reported, never a failure
        return dict(fallback, error=unreadable(exc))


def read(module, p, os_release=OS_RELEASE, mountinfo=MOUNTINFO, uptime=UPTIME):
    unit_file = p["unit_file"] or os.path.join(UNIT_DIR, "%s.service" % p["service"])
    out = {
        "os": _guard(read_os, {"pretty_name": None, "kernel": None}, os_release),
        "volume": _guard(
            read_volume,
            {
                "mount_point": p["mount_point"],
                "mounted": False,
                "source": None,
                "fstype": None,
                "size_bytes": None,
                "free_bytes": None,
                "free_pct": None,
            },
            p["mount_point"],
            mountinfo,
            fstab=p["fstab"],
        ),
        "driver": _guard(
            read_driver,
            {
                "facts_file": p["facts_file"],
                "state": "unreadable",
                "devices": None,
                "devices_ok": None,
                "expected": p["expected_devices"],
                "power_ok": None,
            },
            p["facts_file"],
            p["expected_devices"],
            p["full_power_cap_w"],
        ),
        "service": _guard(
            read_service,
            {"unit": "%s.service" % p["service"], "active": None},
            module,
            p["service"],
            p["command_timeout"],
            uptime,
        ),
    }
    unit = _guard(read_unit, {"image": None, "model": None, "port": None, "tls": False}, unit_file)
    out["image"] = _guard(
        read_image,
        {"ref": p["image"], "state": "unknown"},
        module,
        p["image"],
        p["previous_tag"],
        p["service"],
        unit["image"],
        read_pinned(p["config_dir"]),
        p["command_timeout"],
    )
    port = unit["port"] or p["port"]
    serving = {
        "model": unit["model"],
        "port": port,
        "worker_url": p["worker_url"],
        "requests_running": None,
        "requests_waiting": None,
        "error": unit["error"],
        "held_out": read_held_out(p["config_dir"]),
    }
    active = out["service"].get("active")
    if active == "active":
        got = _guard(read_requests, {}, port, p["metrics_timeout"], tls=unit["tls"], ca_file=p.get("ca_file"))
        serving.update(requests_running=got.get("requests_running"), requests_waiting=got.get("requests_waiting"))
        serving["error"] = "; ".join(e for e in (serving["error"], got.get("error")) if e)
    else:
        serving["error"] = "; ".join(
            e
            for e in (serving["error"], "requests not read: %s is %s" % (out["service"]["unit"], active or "unknown"))
            if e
        )
    out["serving"] = serving
    return out


def check_params(p):
    """The bad parameters, in words (the only failures of this module)."""
    problems = []
    if not re.match(r"^[A-Za-z0-9][A-Za-z0-9_.@-]*$", p["service"] or ""):
        problems.append("service %r is not a unit name (without .service)" % p["service"])
    if not p["image"] or any(c.isspace() for c in p["image"]):
        problems.append("image %r is not an image reference (<repository>:<tag>)" % p["image"])
    if p["expected_devices"] is not None and p["expected_devices"] < 1:
        problems.append("expected_devices must be 1 or more, got %d" % p["expected_devices"])
    if p["full_power_cap_w"] is not None and p["full_power_cap_w"] < 1:
        problems.append("full_power_cap_w must be 1 or more, got %d" % p["full_power_cap_w"])
    if not 0 < p["port"] < 65536:
        problems.append("port must be 1 to 65535, got %d" % p["port"])
    if p["metrics_timeout"] <= 0 or p["command_timeout"] <= 0:
        problems.append("metrics_timeout and command_timeout must be above 0")
    return problems


def main():
    module = AnsibleModule(
        argument_spec=dict(
            mount_point=dict(type="path", default="/home"),
            fstab=dict(type="path", default=FSTAB),
            service=dict(type="str", default="kunlun-serve"),
            unit_file=dict(type="path"),
            config_dir=dict(type="path", default="/etc/kunlun-serve"),
            image=dict(type="str", default="kunlun-serving:current"),
            previous_tag=dict(type="str", default="previous"),
            facts_file=dict(type="path", default="/etc/ansible/facts.d/xpu.fact"),
            expected_devices=dict(type="int"),
            full_power_cap_w=dict(type="int"),
            port=dict(type="int", default=8000),
            worker_url=dict(type="str", default=""),
            ca_file=dict(type="path"),
            metrics_timeout=dict(type="float", default=3.0),
            command_timeout=dict(type="int", default=10),
        ),
        supports_check_mode=True,
    )
    problems = check_params(module.params)
    if problems:
        module.fail_json(msg="host_status: " + "; ".join(problems))
    module.exit_json(changed=False, **read(module, module.params))


if __name__ == "__main__":
    main()
