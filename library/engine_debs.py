#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: kunlun-fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: engine_debs
short_description: Say which of a set of .deb files apt must be given, without changing anything
description:
  - Reads each file of I(debs) (C(dpkg-deb --field)) and the installed version of its package
    (C(dpkg-query)), and puts in I(install) the files whose package is not installed or installed
    at an older version (C(dpkg --compare-versions)). A file whose package is installed at the same
    or a newer version is left out (giving it to apt would be a no-op or a downgrade), as is a file
    of another architecture than the host's (C(dpkg --print-architecture)) or C(all), and an older
    file of a package given twice.
  - Also says which of I(packages) are not installed (C(missing)), so a caller can check the result
    of the install.
  - Read-only; safe in check mode.
options:
  debs:
    description: The .deb files on the host.
    type: list
    elements: path
    required: true
  packages:
    description: Packages that must be installed once the files are (reported in C(missing) when not).
    type: list
    elements: str
    default: []
author:
  - kunlun-fleet contributors (@kunlun-fleet)
"""

EXAMPLES = r"""
- name: Which of the bundle's .debs apt must be given (read-only)
  engine_debs:
    debs:
      - /var/cache/kunlun-fleet/debs/docker.io_20.10.24+dfsg1-1+deb12u1+b6_amd64.deb
      - /var/cache/kunlun-fleet/debs/tini_0.19.0-1+b3_amd64.deb
    packages: [docker.io]
  register: engine_debs_plan
"""

RETURN = r"""
debs:
  description:
    - One entry a file - C(file), C(package), C(version), C(architecture), C(installed) (the installed
      version, empty when not installed) and C(action) (C(install), C(upgrade), C(current),
      C(newer-installed), C(foreign), C(superseded)).
  returned: always
  type: list
  elements: dict
  sample:
    - {file: /var/cache/kunlun-fleet/debs/tini_0.19.0-1+b3_amd64.deb, package: tini, version: 0.19.0-1+b3,
       architecture: amd64, installed: "", action: install}
install:
  description: The files apt must be given (actions C(install) and C(upgrade)), in the order of I(debs).
  returned: always
  type: list
  elements: str
missing:
  description: The packages of I(packages) that are not installed.
  returned: always
  type: list
  elements: str
architecture:
  description: The host's architecture (C(dpkg --print-architecture)).
  returned: always
  type: str
  sample: amd64
"""

from ansible.module_utils.basic import AnsibleModule


def run(module, argv):
    return module.run_command(argv, environ_update={"LC_ALL": "C"})


def deb_fields(module, dpkg_deb, path):
    rc, out, err = run(module, [dpkg_deb, "--show", "--showformat", "${Package}\t${Version}\t${Architecture}\n", path])
    parts = out.strip().split("\t")
    if rc != 0 or len(parts) != 3 or not all(parts):
        module.fail_json(
            msg="%s is not a readable .deb (%s); nothing was changed. Fix: replace it in the "
            "bundle's debs/ with the file apt-get download gives." % (path, (err or out).strip())
        )
    return parts


def installed_versions(module, dpkg_query, names):
    """{package: installed version} for the names dpkg has installed."""
    if not names:
        return {}
    rc, out, err = run(
        module, [dpkg_query, "--show", "--showformat", "${Package}\t${Version}\t${db:Status-Status}\n"] + sorted(names)
    )
    # 1: some package is unknown to dpkg (never installed), which is what this asks.
    if rc not in (0, 1):
        module.fail_json(msg="dpkg-query failed: %s" % err.strip())
    found = {}
    for line in out.splitlines():
        parts = line.split("\t")
        if len(parts) == 3 and parts[2] == "installed":
            found[parts[0].split(":")[0]] = parts[1]
    return found


def newer(module, dpkg, a, b):
    """Whether version a is newer than version b."""
    rc, _out, _err = run(module, [dpkg, "--compare-versions", a, "gt", b])
    return rc == 0


def plan(module, debs, packages):
    dpkg = module.get_bin_path("dpkg", required=True)
    dpkg_deb = module.get_bin_path("dpkg-deb", required=True)
    dpkg_query = module.get_bin_path("dpkg-query", required=True)
    rc, out, err = run(module, [dpkg, "--print-architecture"])
    if rc != 0:
        module.fail_json(msg="dpkg --print-architecture failed: %s" % err.strip())
    arch = out.strip()
    entries = []
    for path in debs:
        package, version, deb_arch = deb_fields(module, dpkg_deb, path)
        entries.append(
            {
                "file": path,
                "package": package,
                "version": version,
                "architecture": deb_arch,
                "installed": "",
                "action": "",
            }
        )
    installed = installed_versions(module, dpkg_query, set(e["package"] for e in entries) | set(packages))
    best = {}
    for e in entries:
        if e["architecture"] not in (arch, "all"):
            e["action"] = "foreign"
            continue
        other = best.get(e["package"])
        if other is None or newer(module, dpkg, e["version"], other["version"]):
            if other is not None:
                other["action"] = "superseded"
            best[e["package"]] = e
        else:
            e["action"] = "superseded"
    for e in best.values():
        e["installed"] = installed.get(e["package"], "")
        if not e["installed"]:
            e["action"] = "install"
        elif newer(module, dpkg, e["version"], e["installed"]):
            e["action"] = "upgrade"
        elif e["version"] == e["installed"]:
            e["action"] = "current"
        else:
            e["action"] = "newer-installed"
    return {
        "debs": entries,
        "architecture": arch,
        "install": [e["file"] for e in entries if e["action"] in ("install", "upgrade")],
        "missing": [p for p in packages if p not in installed],
    }


def main():
    module = AnsibleModule(
        argument_spec=dict(
            debs=dict(type="list", elements="path", required=True),
            packages=dict(type="list", elements="str", default=[]),
        ),
        supports_check_mode=True,
    )
    module.exit_json(changed=False, **plan(module, module.params["debs"], module.params["packages"]))


if __name__ == "__main__":
    main()
