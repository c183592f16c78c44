#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: kunlun-fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: collect_outputs
short_description: The raw outputs the product's parsers read, serials and addresses masked, changing nothing
description:
  - Runs, read-only, the commands whose output the project's modules parse, as they run them
    (C(xpu-smi), C(xpu-smi -q), C(xpu-smi -L), C(lspci -Dn), C(lsmod), C(findmnt -J) and
    C(blkid -p -o export) of the filesystem at I(mount_point), C(lsblk --raw), C(docker info
    --format '{{json .}}'), C(uname -a)) and reads the files they read (C(/proc/modules),
    C(/proc/kunlun/version), C(/proc/xpu/devN/state), C(/etc/os-release),
    C(/proc/self/mountinfo)), and returns their text. Nothing is written on the host.
  - A command that is not installed, or a file that does not exist, is returned as missing
    (C(missing=true)), never as a failure.
  - Before the text leaves the host, serial numbers, MAC addresses and IP addresses are
    replaced by placeholders, one per distinct value, the same in every output of the host
    (C(SERIAL-0001); C(02:00:00:00:00:01); C(192.0.2.1), C(198.51.100.1), C(203.0.113.1);
    C(2001:db8::1)). Loopback, unspecified and netmask-like addresses, version numbers
    (a dotted number after the word "version") and UUIDs are kept. Credentials in URLs
    (C(scheme://user:password@)) are replaced by C(USER:PASSWORD).
  - kunlun-fleet status --collect DIR writes one file per output under DIR/<host>/.
  - Read-only; safe in check mode.
options:
  mount_point:
    description: The data volume's mount point (C(storage_mount_point)); findmnt and blkid read the filesystem there.
    type: path
    default: /home
  xpu_smi_path:
    description: The xpu-smi to run; by default C(xpu-smi) on C(PATH) or in C(/usr/local/bin), as xpu_info finds it.
    type: path
  timeout:
    description: Seconds each command may take (C(timeout) is used when installed).
    type: int
    default: 30
author:
  - kunlun-fleet contributors (@kunlun-fleet)
"""

EXAMPLES = r"""
- name: The raw outputs, masked
  collect_outputs:
    mount_point: /home
  register: collected
"""

RETURN = r"""
outputs:
  description: One entry per command or file, in a fixed order.
  returned: always
  type: list
  elements: dict
  contains:
    name:
      description: The output's file name under DIR/<host>/ (C(xpu-smi-q.txt)).
      type: str
    command:
      description: The command as run (or C(cat <file>) for a file read).
      type: str
    rc:
      description: The exit status (0 for a file read; null when missing).
      type: int
    missing:
      description: True when the command is not installed or the file does not exist.
      type: bool
    reason:
      description: Why it is missing, else empty.
      type: str
    stdout:
      description: What it printed (the file's content), masked.
      type: str
    stderr:
      description: What it printed on stderr, masked, at most 4000 characters.
      type: str
masked:
  description: How many distinct values of each kind were replaced.
  returned: always
  type: dict
  sample: {serial: 8, mac: 2, ipv4: 3, ipv6: 1}
"""

import glob
import json
import os
import re

from ansible.module_utils.basic import AnsibleModule

MAX_TEXT = 1024 * 1024
MAX_ERR = 4000

# ---------------------------------------------------------------- masking
# A serial: the value of a key that names a serial ("Serial Number : X", "ID_SERIAL=X",
# "serial": "X"). Every occurrence of that value anywhere in the host's outputs is replaced.
_SERIAL_KV = re.compile(r"(?im)^[ \t]*[^:=\n]*serial[^:=\n]*?[ \t]*[:=][ \t]*(?P<value>\S[^\n]*?)[ \t]*$")
_SERIAL_JSON = re.compile(r'(?i)"[^"\n]*serial[^"\n]*"\s*:\s*"(?P<value>[^"\n]+)"')
_NOT_A_SERIAL = re.compile(r"(?i)^(?:n/?a|none|null|unknown|\[?not supported\]?|-+|0+|serial-\d+)$")
_MAC = re.compile(r"(?i)(?<![0-9a-f:-])(?:[0-9a-f]{2}([:-]))(?:[0-9a-f]{2}\1){4}[0-9a-f]{2}(?![0-9a-f:-])")
_IPV4 = re.compile(r"(?<![\d.])(?:(?:25[0-5]|2[0-4]\d|1?\d?\d)\.){3}(?:25[0-5]|2[0-4]\d|1?\d?\d)(?!\.?\d)")
_H = r"[0-9a-f]{1,4}"
_IPV6 = re.compile(
    r"(?i)(?<![\w:.])(?:(?:%s:){7}%s|(?:%s(?::%s){0,6})?::(?:%s(?::%s){0,6})?)(?![\w:])" % (_H, _H, _H, _H, _H, _H)
)
_VERSION_BEFORE = re.compile(r"(?i)version[^0-9\n]{0,60}$")
_URL_CREDENTIALS = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/@\s:\"']+:[^/@\s\"']+@")
_KEPT_IPV4 = re.compile(r"^(?:127\.|0\.0\.0\.0$|255\.|192\.0\.2\.|198\.51\.100\.|203\.0\.113\.)")
_KEPT_MAC = re.compile(r"(?i)^(?:00[:-]){5}00$|^(?:ff[:-]){5}ff$|^02[:-]00[:-]00[:-]00[:-]")
IPV4_RANGES = ("192.0.2.%d", "198.51.100.%d", "203.0.113.%d")


class Masker(object):
    """Replaces serials, MAC and IP addresses by placeholders, one per distinct value,
    stable over every text given to the same Masker (equal values stay equal)."""

    def __init__(self):
        self.seen = {"serial": {}, "mac": {}, "ipv4": {}, "ipv6": {}}

    def _placeholder(self, kind, value):
        known = self.seen[kind]
        key = value.lower()
        if key not in known:
            n = len(known) + 1
            if kind == "serial":
                known[key] = "SERIAL-%04d" % n
            elif kind == "mac":
                known[key] = "02:00:00:00:%02x:%02x" % (n // 256 % 256, n % 256)
            elif kind == "ipv4":
                block, host = divmod(n - 1, 254)
                known[key] = (IPV4_RANGES[block] % (host + 1)) if block < len(IPV4_RANGES) else "IPV4-%d" % n
            else:
                known[key] = "2001:db8::%x" % n
        return known[key]

    def learn(self, texts):
        """Finds the serials in all the texts first, so that a serial seen once under a
        serial key is masked wherever else it appears."""
        for text in texts:
            for pattern in (_SERIAL_KV, _SERIAL_JSON):
                for m in pattern.finditer(text or ""):
                    value = m.group("value").strip().strip("\"'")
                    if len(value) >= 4 and not _NOT_A_SERIAL.match(value):
                        self._placeholder("serial", value)

    def text(self, text):
        if not text:
            return text
        for value in sorted(self.seen["serial"], key=len, reverse=True):
            text = re.sub(re.escape(value), self.seen["serial"][value], text, flags=re.IGNORECASE)
        text = _URL_CREDENTIALS.sub(r"\1USER:PASSWORD@", text)

        def mac(m):
            value = m.group(0)
            return value if _KEPT_MAC.match(value) else self._placeholder("mac", value)

        def ipv6(m):
            value = m.group(0)
            if (
                value in ("::", "::1")
                or value.lower().startswith("2001:db8:")
                or not re.search(r"[0-9a-f]", value, re.I)
            ):
                return value
            return self._placeholder("ipv6", value)

        def ipv4(m):
            value = m.group(0)
            if _KEPT_IPV4.match(value) or _VERSION_BEFORE.search(m.string[max(0, m.start() - 80) : m.start()]):
                return value
            return self._placeholder("ipv4", value)

        text = _MAC.sub(mac, text)
        text = _IPV6.sub(ipv6, text)
        return _IPV4.sub(ipv4, text)

    def counts(self):
        return dict((kind, len(values)) for kind, values in self.seen.items())


def mask_outputs(outputs, masker=None):
    """Masks the stdout and stderr of every output in place (one Masker for the host)."""
    masker = masker or Masker()
    masker.learn([o.get("stdout") or "" for o in outputs] + [o.get("stderr") or "" for o in outputs])
    for o in outputs:
        for key in ("stdout", "stderr"):
            if o.get(key):
                o[key] = masker.text(o[key])
    return masker


# ---------------------------------------------------------------- what is read
def _entry(name, command):
    return {"name": name, "command": command, "rc": None, "missing": False, "reason": "", "stdout": "", "stderr": ""}


def _cut(text, limit):
    return text if len(text) <= limit else text[:limit] + "\n[... cut at %d characters]\n" % limit


def read_file(name, path):
    entry = _entry(name, "cat %s" % path)
    try:
        with open(path) as fh:
            entry.update(rc=0, stdout=_cut(fh.read(), MAX_TEXT))
    except (IOError, OSError) as exc:
        entry.update(missing=True, reason="%s: %s" % (path, exc.strerror or exc))
    return entry


class Collector(object):
    def __init__(self, module):
        self.module = module
        self.timeout = module.params["timeout"]
        self.limiter = module.get_bin_path("timeout")

    def run(self, name, tool, args, shown=None, tool_path=None, env=None):
        entry = _entry(name, " ".join([shown or tool] + args))
        # Found as the product's modules find it (PATH first, then the sbin directories
        # get_bin_path adds): the same binary, so the same output.
        path = tool_path or self.module.get_bin_path(tool)
        if not path:
            entry.update(missing=True, reason="%s is not installed" % tool)
            return entry
        argv = [path] + args
        if self.limiter:
            argv = [self.limiter, str(self.timeout)] + argv
        rc, out, err = self.module.run_command(argv, environ_update=env or {})
        entry.update(rc=rc, stdout=_cut(out, MAX_TEXT), stderr=_cut(err, MAX_ERR))
        return entry


def find_xpu_smi(module):
    given = module.params["xpu_smi_path"]
    if given:
        return given if os.path.isfile(given) and os.access(given, os.X_OK) else None
    return module.get_bin_path("xpu-smi", required=False, opt_dirs=["/usr/local/bin"])


def parse_findmnt_source(text):
    try:
        systems = (json.loads(text) if text.strip() else {}).get("filesystems") or []
    except (ValueError, AttributeError):
        return ""
    return (systems[-1].get("source") or "") if systems else ""


def gather(module, proc_dir="/proc", etc_dir="/etc"):
    c = Collector(module)
    c_locale = {"LC_ALL": "C"}
    outputs = []
    smi = find_xpu_smi(module)
    for name, args in (("xpu-smi.txt", []), ("xpu-smi-q.txt", ["-q"]), ("xpu-smi-L.txt", ["-L"])):
        outputs.append(
            c.run(name, "xpu-smi", args, tool_path=smi or None)
            if smi
            else dict(
                _entry(name, " ".join(["xpu-smi"] + args)),
                missing=True,
                reason="xpu-smi is not installed (not on PATH, not in /usr/local/bin)",
            )
        )
    outputs.append(c.run("lspci-Dn.txt", "lspci", ["-Dn"]))
    outputs.append(c.run("lsmod.txt", "lsmod", []))
    outputs.append(read_file("proc_modules.txt", os.path.join(proc_dir, "modules")))
    outputs.append(read_file("proc_kunlun_version.txt", os.path.join(proc_dir, "kunlun", "version")))
    states = sorted(
        glob.glob(os.path.join(proc_dir, "xpu", "dev*", "state")),
        key=lambda p: [int(x) if x.isdigit() else x for x in re.split(r"(\d+)", p)],
    )
    if states:
        for path in states:
            outputs.append(read_file("proc_xpu_%s_state.txt" % os.path.basename(os.path.dirname(path)), path))
    else:
        outputs.append(
            dict(
                _entry("proc_xpu_devN_state.txt", "cat %s" % os.path.join(proc_dir, "xpu/dev*/state")),
                missing=True,
                reason="no %s" % os.path.join(proc_dir, "xpu/dev*/state"),
            )
        )
    mount_point = module.params["mount_point"]
    findmnt = c.run(
        "findmnt.json",
        "findmnt",
        ["-J", "--output", "SOURCE,FSTYPE,OPTIONS", "--mountpoint", mount_point],
        env=c_locale,
    )
    outputs.append(findmnt)
    source = parse_findmnt_source(findmnt["stdout"]) if findmnt["rc"] == 0 else ""
    if source.startswith("/dev/"):
        outputs.append(c.run("blkid.txt", "blkid", ["-p", "-o", "export", source], env=c_locale))
    else:
        outputs.append(
            dict(
                _entry("blkid.txt", "blkid -p -o export <the device at %s>" % mount_point),
                missing=True,
                reason="no block device mounted at %s (findmnt: %s)" % (mount_point, source or "nothing"),
            )
        )
    outputs.append(c.run("lsblk.txt", "lsblk", ["--noheadings", "--raw", "--output", "NAME,TYPE"]))
    outputs.append(c.run("docker-info.json", "docker", ["info", "--format", "{{json .}}"]))
    outputs.append(read_file("os-release.txt", os.path.join(etc_dir, "os-release")))
    outputs.append(c.run("uname-a.txt", "uname", ["-a"]))
    outputs.append(read_file("proc_self_mountinfo.txt", os.path.join(proc_dir, "self", "mountinfo")))
    masker = mask_outputs(outputs)
    return outputs, masker.counts()


def main():
    module = AnsibleModule(
        argument_spec=dict(
            mount_point=dict(type="path", default="/home"),
            xpu_smi_path=dict(type="path"),
            timeout=dict(type="int", default=30),
        ),
        supports_check_mode=True,
    )
    outputs, counts = gather(module)
    module.exit_json(changed=False, outputs=outputs, masked=counts, mount_point=module.params["mount_point"])


if __name__ == "__main__":
    main()
