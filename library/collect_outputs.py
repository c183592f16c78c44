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
  - With I(diagnostics) (kunlun-fleet support-bundle) also what an engineer reads when a
    host misbehaves - the tail of C(dmesg), the serving unit (C(systemctl cat), C(systemctl
    status)), its journal's tail, the tail of the newest vLLM log in I(log_dir), C(docker
    inspect) of the serving container, I(config_dir)/serve.env, the driver's local facts
    (I(facts_file)) - with every secret masked on the host first (the value of an
    assignment whose name ends in KEY, TOKEN, SECRET, PASSWORD or CREDENTIALS, an
    C(--api-key) argument, a bearer token). The key file
    (api-keys.yaml) is never read.
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
  diagnostics:
    description: Also the diagnostics of the serving unit, its container and the kernel (see above).
    type: bool
    default: false
  service:
    description: The serving unit (C(serve_service_name)), with I(diagnostics).
    type: str
    default: kunlun-serve
  container:
    description: The serving container's name, with I(diagnostics).
    type: str
    default: kunlun-serve
  log_dir:
    description: vLLM's log directory (C(serve_log_dir)); the newest file's tail is read, with I(diagnostics).
    type: path
  config_dir:
    description: The serving configuration (C(serve_config_dir)); its serve.env is read, masked, with I(diagnostics).
    type: path
    default: /etc/kunlun-serve
  facts_file:
    description: The driver stage's local facts (C(driver_facts_file)), read with I(diagnostics).
    type: path
    default: /etc/ansible/facts.d/xpu.fact
  tail_lines:
    description: How many of the last lines of the journal, the vLLM log and C(dmesg) are kept, with I(diagnostics).
    type: int
    default: 2000
author:
  - kunlun-fleet contributors (@kunlun-fleet)
"""

EXAMPLES = r"""
- name: The raw outputs, masked
  collect_outputs:
    mount_point: /home
  register: collected

- name: The same, and the serving unit's diagnostics, for a support bundle
  collect_outputs:
    mount_point: /home
    diagnostics: true
    log_dir: /home/newdata/logs/serve
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
  contains:
    secret:
      description: With I(diagnostics), how many secret values were replaced by C(********).
      type: int
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


# Secrets, masked on the host before any text leaves it: an assignment whose name ends in
# what it holds (VLLM_API_KEY=..., in serve.env, `docker inspect`'s Env or a journal line;
# not max_tokens=...), an --api-key argument, a bearer token. The name stays, the value goes.
SECRET_MASK = "********"
_SECRET_NAME = r"[A-Za-z0-9_]*(?:KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIALS?)\b"
_VALUE = r"(?:\"(?P<dq>[^\"\n]*)\"|'(?P<sq>[^'\n]*)'|(?P<bare>[^\s\"',}]+))"
_SECRET_ASSIGN = re.compile(r"(?i)\b%s[\"']?\s*[=:]\s*%s" % (_SECRET_NAME, _VALUE))
_SECRET_ARG = re.compile(r"(?i)--api-key(?:=|\s+|\"\s*,\s*)%s" % _VALUE)
_BEARER = re.compile(r"(?i)\bbearer\s+(?P<bare>[A-Za-z0-9\-._~+/]+=*)")


def mask_secrets(text):
    """text with the value of every secret-looking assignment, --api-key and bearer token
    replaced by ********; returns (text, how many values were replaced)."""
    if not text:
        return text, 0
    count = [0]

    def hide(m):
        group = next(g for g in ("dq", "sq", "bare") if g in m.re.groupindex and m.group(g) is not None)
        if m.group(group) in ("", SECRET_MASK):
            return m.group(0)
        count[0] += 1
        start, end = m.start(group) - m.start(0), m.end(group) - m.start(0)
        return m.group(0)[:start] + SECRET_MASK + m.group(0)[end:]

    for pattern in (_SECRET_ASSIGN, _SECRET_ARG, _BEARER):
        text = pattern.sub(hide, text)
    return text, count[0]


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

    def run(self, name, tool, args, shown=None, tool_path=None, env=None, newest=False):
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
        # newest: a log's last MAX_TEXT characters, not its first
        kept = out[-MAX_TEXT:] if newest else _cut(out, MAX_TEXT)
        entry.update(rc=rc, stdout=kept, stderr=_cut(err, MAX_ERR))
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
    secrets = 0
    diagnostics = module.params.get("diagnostics")
    if diagnostics:
        extra = gather_diagnostics(module, c)
        for o in extra:
            for key in ("stdout", "stderr"):
                o[key], n = mask_secrets(o[key])
                secrets += n
        outputs += extra
    masker = mask_outputs(outputs)
    counts = masker.counts()
    if diagnostics:
        counts["secret"] = secrets
    return outputs, counts


def tail(entry, lines):
    """Keep the last `lines` lines of a collected output (said in the text when cut)."""
    kept = entry["stdout"].splitlines(True)
    if len(kept) > lines:
        entry["stdout"] = "[... the last %d of %d lines]\n" % (lines, len(kept)) + "".join(kept[-lines:])
    return entry


def read_tail(name, path, lines, limit=MAX_TEXT):
    """The last `lines` lines of a file that may be large (a log before its rotation):
    only its last `limit` bytes are read."""
    entry = _entry(name, "tail -n %d %s" % (lines, path))
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - limit))
            data = fh.read().decode("utf-8", "replace")
    except (IOError, OSError) as exc:
        entry.update(missing=True, reason="%s: %s" % (path, exc.strerror or exc))
        return entry
    if size > limit:
        data = data.split("\n", 1)[-1]  # the first line read is likely a part of one
    entry.update(rc=0, stdout=data)
    return tail(entry, lines)


def newest_file(directory):
    try:
        names = [os.path.join(directory, n) for n in os.listdir(directory)]
    except OSError:
        return None
    files = [p for p in names if os.path.isfile(p) and not p.endswith((".gz", ".xz", ".zst"))]
    return max(files, key=os.path.getmtime) if files else None


def gather_diagnostics(module, c):
    """The serving unit, its container, its logs and the kernel's recent messages."""
    p = module.params
    lines, service = p["tail_lines"], p["service"]
    out = [
        tail(c.run("dmesg-tail.txt", "dmesg", ["--ctime"], newest=True), min(lines, 1000)),
        c.run("unit.txt", "systemctl", ["cat", service]),
        c.run("unit-status.txt", "systemctl", ["status", "--no-pager", "--full", service], env={"SYSTEMD_COLORS": "0"}),
        c.run(
            "journal-tail.txt",
            "journalctl",
            ["--unit", service, "--lines", str(lines), "--no-pager", "--output", "short-iso"],
        ),
    ]
    log = newest_file(p["log_dir"]) if p["log_dir"] else None
    if log:
        out.append(read_tail("vllm-log-tail.txt", log, lines))
    else:
        out.append(
            dict(
                _entry("vllm-log-tail.txt", "tail %s/<newest>" % (p["log_dir"] or "<log_dir>")),
                missing=True,
                reason="no log file in %s" % p["log_dir"] if p["log_dir"] else "log_dir not given",
            )
        )
    out.append(c.run("docker-inspect.json", "docker", ["inspect", p["container"]]))
    out.append(read_file("serve.env", os.path.join(p["config_dir"], "serve.env")))
    out.append(read_file("xpu-facts.json", p["facts_file"]))
    return out


def main():
    module = AnsibleModule(
        argument_spec=dict(
            mount_point=dict(type="path", default="/home"),
            xpu_smi_path=dict(type="path"),
            timeout=dict(type="int", default=30),
            diagnostics=dict(type="bool", default=False),
            service=dict(type="str", default="kunlun-serve"),
            container=dict(type="str", default="kunlun-serve"),
            log_dir=dict(type="path"),
            config_dir=dict(type="path", default="/etc/kunlun-serve"),
            facts_file=dict(type="path", default="/etc/ansible/facts.d/xpu.fact"),
            tail_lines=dict(type="int", default=2000),
        ),
        supports_check_mode=True,
    )
    outputs, counts = gather(module)
    module.exit_json(changed=False, outputs=outputs, masked=counts, mount_point=module.params["mount_point"])


if __name__ == "__main__":
    main()
