#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: kunlun-fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: xpu_info
short_description: Gather facts about the Kunlunxin P800 XPUs of a host
description:
  - Runs C(xpu-smi), C(xpu-smi -q) and C(xpu-smi -L), C(lspci -Dn) (when lspci is
    installed) and C(lsmod) (or reads C(/proc/modules)), reads C(/proc/kunlun/version) and
    C(/proc/xpu/devN/state) where the driver provides them, and lists the C(/dev/xpuN) and
    C(/dev/xpuctrl) nodes.
  - Returns what it found as C(ansible_facts). Changes nothing on the host.
  - Works on a host without the driver; then C(xpu_device_count) is 0,
    C(xpu_driver_version) is null and C(xpu_devices) is empty.
  - Fails when the driver answers (xpu-smi runs, or C(/proc/kunlun/version) exists) but
    none of xpu-smi's header, C(xpu-smi -q) and C(/proc/kunlun/version) gives an XRE
    release; the message names what each of them printed.
version_added: "1.0.0"
author: kunlun-fleet contributors (@kunlun-fleet)
options:
  xpu_smi_path:
    description:
      - Path of the C(xpu-smi) binary.
      - By default C(xpu-smi) is searched on C(PATH) and in C(/usr/local/bin); when it
        is not found the host is reported as having no XPU software.
      - When given, the file must exist and be executable.
    type: path
  dev_dir:
    description: Directory holding the device nodes C(xpuN) and C(xpuctrl).
    type: path
    default: /dev
  proc_dir:
    description: Mount point of procfs (C(kunlun/version), C(xpu/devN/state), C(modules)).
    type: path
    default: /proc
  driver_minimum:
    description:
      - Oldest supported driver (XRE) version, e.g. C(5.0.21.26).
      - When given, C(xpu_driver_at_least_minimum) tells whether the driver reaches it.
    type: str
  firmware_minimum:
    description:
      - Oldest supported firmware release, e.g. C(1.48).
      - When given, every device gets C(firmware_ok); see the notes for how the six-field
        C(ALL Version) of C(xpu-smi -q) is compared.
    type: str
  power_cap_full:
    description:
      - The full power cap of a card in watts, e.g. C(400) for a P800.
      - When given, every device gets C(power_cap_ok), and C(xpu_low_power_devices),
        C(xpu_power_cap_unknown) and C(xpu_low_power_message) say which cards are capped
        below it (a P800 left in its 120 W low-power mode) and which caps are unknown.
      - The module only reports; the caller decides whether a low cap is a refusal.
    type: int
attributes:
  check_mode:
    description: Only reads, so check mode runs the same commands and returns the same facts.
    support: full
  diff_mode:
    description: Changes nothing, so there is no diff to show.
    support: none
  facts:
    description: Returns what it found as C(ansible_facts) (C(xpu_device_count), C(xpu_devices), ...).
    support: full
notes:
  - A device whose table fields read C(ERR!), or whose C(/proc/xpu/devN/state) is not
    C(RUNNING), has C(state=error).
  - Firmware floors compare the firmware release, the last two fields of the six-field
    C(ALL Version) (C(1.0.2.14.1.54) is release C(1.54)); other shapes are compared whole.
  - Card variant from the part number - C(B00100300110312) is C(VD) (needs the kunlun
    module option C(KLreg_RegistryDwords)), C(B00100300110112) is C(VC).
  - The XRE release (C(xpu_driver_version)) is the first value shaped like one (three or
    more dotted numbers, e.g. C(5.0.21.26)) of the table header's C(Driver Version),
    C(xpu-smi -q)'s C(Driver Version) and C(/proc/kunlun/version). Some xpu-smi builds
    print C(515.58) as C(Driver Version) and C(N/A) as C(XPU-RT Version); 515.58 is not
    an XRE release, so the release comes from the next source (docs/target.md).
  - Power cap and power use per card from the table's C(Pwr:Usage/Cap) column
    (C(85W / 400W)), else from the C(Power Readings) block of C(xpu-smi -q); a value that
    is not a figure (C(N/A), C(ERR!)) is null (unknown), never an error.
"""

EXAMPLES = r"""
- name: Gather XPU facts
  xpu_info:

- name: Require eight healthy XPUs
  ansible.builtin.assert:
    that:
      - ansible_facts.xpu_device_count == 8
      - ansible_facts.xpu_devices | selectattr('state', 'ne', 'ok') | list | length == 0
      - ansible_facts.xpu_devices | rejectattr('node_present') | list | length == 0
    fail_msg: "{{ inventory_hostname }}: expected 8 healthy XPUs with /dev nodes"

- name: Gather XPU facts and compare the driver and firmware with their floors
  xpu_info:
    driver_minimum: 5.0.21.26
    firmware_minimum: "1.48"

- name: Gather XPU facts and find the cards capped below the full 400 W
  xpu_info:
    power_cap_full: 400

- name: Use a non-standard xpu-smi
  xpu_info:
    xpu_smi_path: /opt/xre/bin/xpu-smi
"""

RETURN = r"""
ansible_facts:
  description: Facts about the host's XPUs.
  returned: always
  type: dict
  contains:
    xpu_smi_path:
      description: The xpu-smi used, or null when none was found.
      type: str
      sample: /usr/local/bin/xpu-smi
    xpu_smi_error:
      description: Why xpu-smi gave no devices (its message and exit status), else null.
      type: str
      sample: "xpu-smi exited 9: No XPU device found"
    xpu_driver_version:
      description:
        - The loaded driver's XRE release, from the first source that gives one (see the
          notes), null without a driver.
      type: str
      sample: 5.0.21.26
    xpu_driver_version_source:
      description:
        - Where I(xpu_driver_version) was read - C(xpu-smi), C(xpu-smi -q) or
          C(/proc/kunlun/version); null without a driver.
      type: str
      sample: /proc/kunlun/version
    xpu_driver_version_read:
      description:
        - What each source printed, null where it gave nothing - the table header's C(Driver
          Version) and C(XPU-RT Version), C(xpu-smi -q)'s C(Driver Version) line, the first
          line of C(/proc/kunlun/version).
      type: dict
      sample:
        xpu-smi: "Driver Version: 515.58 XPU-RT Version: N/A"
        xpu-smi -q: "Driver Version : 515.58"
        /proc/kunlun/version: null
    xpu_runtime_version:
      description: XPU-RT version from xpu-smi (null when it prints N/A).
      type: str
      sample: 5.0.21
    xpu_proc_driver_version:
      description: The XRE release in /proc/kunlun/version, null when the file is absent or names none.
      type: str
    xpu_device_count:
      description: Number of devices xpu-smi reports.
      type: int
      sample: 8
    xpu_devices:
      description: One entry per device xpu-smi reports.
      type: list
      elements: dict
      sample:
        - index: 0
          name: P800 OAM
          bus_id: "00000000:52:00.0"
          memory_total_mib: 98304
          part_number: B00100300110112
          card_variant: VC
          firmware_version: 1.0.2.14.1.54
          node_present: true
          state: ok
          proc_state: null
          err_fields: []
          serial: 02K0A3A0010
          uuid: XPU-7c15324f-f867-54f0-a54f-1854e1deb257
          device_id: "0x36862057"
          firmware_release: "1.54"
          firmware_ok: true
          power_cap_w: 400
          power_draw_w: 85
          power_cap_ok: true
    xpu_low_power_devices:
      description:
        - The devices whose power cap is below I(power_cap_full) (empty when it is not
          given), with index, serial, bus_id, power_cap_w (watts) and label (C(device 3
          (serial ...)), or the bus id when the device has no serial).
      type: list
      elements: dict
      sample:
        - index: 3
          serial: 02KE5E61F0013
          bus_id: "00000000:61:00.0"
          power_cap_w: 120
          label: device 3 (serial 02KE5E61F0013)
    xpu_power_cap_unknown:
      description:
        - The devices whose power cap xpu-smi does not give (N/A, ERR!, not printed), same
          fields (empty when I(power_cap_full) is not given).
      type: list
      elements: dict
    xpu_low_power_message:
      description:
        - The cards below I(power_cap_full), each by index and serial (bus id without one)
          and its cap, and the fix; null when there are none.
      type: str
    xpu_driver_at_least_minimum:
      description: Whether the driver is at least I(driver_minimum) (null when not given).
      type: bool
    xpu_processes:
      description: Processes using an XPU (from the xpu-smi table).
      type: list
      elements: dict
      sample: [{xpu: 3, pid: 4242, type: C, name: python3, memory_mib: 1024}]
    xpu_pci_functions:
      description: Number of P800 PCI functions lspci shows (null without lspci).
      type: int
      sample: 8
    xpu_pci_slots:
      description: The PCI addresses of those functions.
      type: list
      elements: str
    xpu_modules_loaded:
      description: Which of kunlun and kunlun_peermem are loaded.
      type: list
      elements: str
      sample: [kunlun, kunlun_peermem]
    xpu_device_nodes:
      description: The /dev/xpuN nodes present.
      type: list
      elements: str
      sample: [/dev/xpu0, /dev/xpu1]
    xpu_ctrl_node_present:
      description: Whether /dev/xpuctrl exists.
      type: bool
    xpu_card_variants:
      description: Sorted unique card variants (VC, VD) of the devices.
      type: list
      elements: str
      sample: [VC]
"""

import os
import re

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.xpu_smi import (
    device_state,
    driver_release,
    firmware_at_least,
    firmware_release,
    kunlun_modules_loaded,
    low_power_devices,
    low_power_message,
    merge_devices,
    parse_lspci,
    parse_proc_version,
    parse_query,
    parse_list,
    parse_table,
    version_at_least,
)


def read_text(path):
    try:
        with open(path) as f:
            return f.read()
    except (IOError, OSError):
        return None


def find_xpu_smi(module):
    given = module.params["xpu_smi_path"]
    if given:
        if not (os.path.isfile(given) and os.access(given, os.X_OK)):
            module.fail_json(
                msg="xpu_smi_path %s is not an executable file: install the XRE "
                "driver or point xpu_smi_path at its xpu-smi" % given
            )
        return given
    return module.get_bin_path("xpu-smi", required=False, opt_dirs=["/usr/local/bin"])


def gather(module):
    dev_dir = module.params["dev_dir"]
    proc_dir = module.params["proc_dir"]
    facts = {
        "xpu_smi_path": None,
        "xpu_smi_error": None,
        "xpu_driver_version": None,
        "xpu_driver_version_source": None,
        "xpu_driver_version_read": {},
        "xpu_runtime_version": None,
        "xpu_proc_driver_version": None,
        "xpu_device_count": 0,
        "xpu_devices": [],
        "xpu_processes": [],
        "xpu_pci_functions": None,
        "xpu_pci_slots": [],
        "xpu_modules_loaded": [],
        "xpu_device_nodes": [],
        "xpu_ctrl_node_present": False,
        "xpu_card_variants": [],
        "xpu_driver_at_least_minimum": None,
        "xpu_low_power_devices": [],
        "xpu_power_cap_unknown": [],
        "xpu_low_power_message": None,
    }

    smi = find_xpu_smi(module)
    facts["xpu_smi_path"] = smi
    table = {"driver_version": None, "runtime_version": None, "devices": [], "processes": []}
    query = {"devices": []}
    listing = []
    table_text = query_text = None
    if smi:
        rc, out, err = module.run_command([smi])
        if rc == 0:
            table_text = out
            table = parse_table(out)
            rc_q, out_q, err_q = module.run_command([smi, "-q"])
            if rc_q == 0:
                query_text = out_q
                query = parse_query(out_q)
            rc_l, out_l, err_l = module.run_command([smi, "-L"])
            if rc_l == 0:
                listing = parse_list(out_l)
        else:
            message = (err or out or "").strip().splitlines()
            facts["xpu_smi_error"] = "xpu-smi exited %d: %s" % (rc, message[0] if message else "no output")

    # The header's Driver Version is the XRE release in one xpu-smi form only (515.58 in
    # the other): the release is taken from the source that gives one.
    proc_text = read_text(os.path.join(proc_dir, "kunlun", "version"))
    release = driver_release(table_text, query_text, proc_text)
    if release["error"]:
        module.fail_json(msg=release["error"], xpu_driver_version_read=release["read"])
    facts["xpu_driver_version"] = release["version"]
    facts["xpu_driver_version_source"] = release["source"]
    facts["xpu_driver_version_read"] = release["read"]
    facts["xpu_runtime_version"] = table["runtime_version"] or query.get("runtime_version")
    facts["xpu_proc_driver_version"] = parse_proc_version(proc_text)
    if module.params["driver_minimum"]:
        facts["xpu_driver_at_least_minimum"] = version_at_least(
            facts["xpu_driver_version"], module.params["driver_minimum"]
        )

    devices = merge_devices(table, query, listing)
    full_cap = module.params["power_cap_full"]
    for dev in devices:
        node = os.path.join(dev_dir, "xpu%d" % dev["index"])
        dev["node_present"] = os.path.exists(node)
        state, raw = device_state(read_text(os.path.join(proc_dir, "xpu", "dev%d" % dev["index"], "state")))
        dev["proc_state"] = raw
        if state == "error":
            dev["state"] = "error"
        dev["firmware_release"] = firmware_release(dev["firmware_version"])
        dev["firmware_ok"] = None
        if module.params["firmware_minimum"]:
            dev["firmware_ok"] = firmware_at_least(dev["firmware_version"], module.params["firmware_minimum"])
        dev["power_cap_ok"] = None
        if full_cap is not None and dev["power_cap_w"] is not None:
            dev["power_cap_ok"] = dev["power_cap_w"] >= full_cap
    if full_cap is not None:
        low, unknown = low_power_devices(devices, full_cap)
        facts["xpu_low_power_devices"] = low
        facts["xpu_power_cap_unknown"] = unknown
        facts["xpu_low_power_message"] = low_power_message(low, full_cap, len(devices))
    facts["xpu_devices"] = devices
    facts["xpu_device_count"] = len(devices)
    facts["xpu_processes"] = table.get("processes", [])
    facts["xpu_card_variants"] = sorted(set(d["card_variant"] for d in devices if d["card_variant"]))

    lspci = module.get_bin_path("lspci", required=False)
    if lspci:
        rc, out, err = module.run_command([lspci, "-Dn"])
        if rc == 0:
            functions = parse_lspci(out)
            facts["xpu_pci_functions"] = len(functions)
            facts["xpu_pci_slots"] = [f["slot"] for f in functions]

    lsmod = module.get_bin_path("lsmod", required=False)
    modules_text = None
    if lsmod:
        rc, out, err = module.run_command([lsmod])
        if rc == 0:
            modules_text = out
    if modules_text is None:
        modules_text = read_text(os.path.join(proc_dir, "modules")) or ""
    facts["xpu_modules_loaded"] = kunlun_modules_loaded(modules_text)

    try:
        names = os.listdir(dev_dir)
    except (IOError, OSError):
        names = []
    nodes = sorted((n for n in names if re.match(r"^xpu\d+$", n)), key=lambda n: int(n[3:]))
    facts["xpu_device_nodes"] = [os.path.join(dev_dir, n) for n in nodes]
    facts["xpu_ctrl_node_present"] = os.path.exists(os.path.join(dev_dir, "xpuctrl"))
    return facts


def main():
    module = AnsibleModule(
        argument_spec=dict(
            xpu_smi_path=dict(type="path"),
            dev_dir=dict(type="path", default="/dev"),
            proc_dir=dict(type="path", default="/proc"),
            driver_minimum=dict(type="str"),
            firmware_minimum=dict(type="str"),
            power_cap_full=dict(type="int"),
        ),
        supports_check_mode=True,
    )
    facts = gather(module)
    module.exit_json(changed=False, ansible_facts=facts)


if __name__ == "__main__":
    main()
