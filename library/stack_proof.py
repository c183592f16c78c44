#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: kunlun-fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: stack_proof
short_description: Prove the validated combination from inside a serving image, with the accelerators
description:
  - Starts the image once (C(docker run --rm), never privileged, no network) with every accelerator
    node of the host (C(--device /dev/xpuN) for each, plus C(/dev/xpuctrl)), the serving environment and the
    serving container's other options (I(shm_size), I(cap_add), I(security_opt), I(volumes)), and runs a
    standard-library probe with the image's own Python (C(<venv>/bin/python -c)).
  - The probe reads the C(importlib.metadata) version of every pinned component, C(torch.__version__),
    C(torch_xmlir._XMLIRC._xpu_get_devices_number()), where C(vllm_kunlun) is loaded from (it must be
    site-packages) and whether C(from vllm_kunlun import _kunlun) works.
  - It also proves what vllm-kunlun runs on. Kunlunxin's torch runs in CUDA-compatible mode, so the probe
    checks that C(torch.cuda.is_available()) is true, that C(torch.cuda.device_count()) equals
    I(device_count), that C(torch.arange(4, device="cuda:0")) reads back as C([0, 1, 2, 3]), and that
    C(torch.cuda.get_device_properties(0).total_memory) is within I(device_memory_min_gib) to
    I(device_memory_max_gib) (a P800 has 96 GB of HBM). C(torch.xpu) is never consulted, it is an Intel
    stub.
  - It resolves the platform class that vllm-kunlun registers the way vLLM does (the
    C(vllm.platform_plugins) entry point) and checks the class's C(device_name) and C(dist_backend)
    against I(platform_fields); its C(dispatch_key) is read and shown (the public 0.15.1-era class sets
    none, so it is vLLM's default C(CPU)). It never reads the platform's C(is_cuda()), which vllm-kunlun's
    platform answers with false, also in a working stack.
  - With I(quantization), it loads that method as vLLM does when it starts, the C(vllm.general_plugins)
    entry points first, then C(get_quantization_config) of C(vllm.model_executor.layers.quantization) (which
    the image build may have replaced with vllm-kunlun's); the method must be in its C(QUANTIZATION_METHODS).
  - A component built from a source tree (C(source) in its pin) is identified by its commit (the bundle
    check), so its installed version is shown and not compared, since the tree declares its own.
  - The findings are compared with the pins and with the known-bad combinations, through the checker
    preflight uses (C(module_utils/kunlun_stack.py)). Any mismatch fails with a table
    C(layer | component | expected | found). The message names each broken layer, lowest first, with its
    fix. C(driver) means the runtime does not see every accelerator (torch_xmlir's count is wrong, or
    torch.cuda sees no device or the same short count). C(torch) means torch.cuda is not available, its
    count differs from torch_xmlir's, the cuda:0 tensor fails or device 0's memory is out of range while
    the devices are visible. C(plugin) means vllm-kunlun, its C(_kunlun) extension or its platform class
    is wrong or does not import. C(image) means a version departs from the pins or the image is a
    known-bad combination.
  - Changes nothing (the container is removed when the probe ends). In check mode the probe runs as
    well, so C(--check) tells the truth; an image that is not on the host yet (it would be built or
    loaded first) is then reported with I(proven=false) instead of failing.
options:
  image:
    description: The image reference to prove (repository:tag or id).
    type: str
    required: true
  components:
    description: The pins (C(kunlun_stack_components)); every entry with a C(version) is checked.
    type: dict
    required: true
  known_bad:
    description: Known-bad combinations (C(kunlun_stack_known_bad)), judged on what the image holds.
    type: list
    elements: dict
    default: []
  device_count:
    description: Accelerators torch_xmlir and C(torch.cuda.device_count()) must count (C(kunlun_stack_device_count)).
    type: int
    default: 8
  device_memory_min_gib:
    description:
      - Lowest C(torch.cuda.get_device_properties(0).total_memory) accepted, in GiB. A P800 has 96 GB of HBM
        (C(xpu-smi) shows 98304 MiB); the range leaves room for what the runtime keeps for itself.
    type: float
    default: 80
  device_memory_max_gib:
    description: Highest C(torch.cuda.get_device_properties(0).total_memory) accepted, in GiB.
    type: float
    default: 100
  platform_fields:
    description:
      - What the platform class that vllm-kunlun registers must say. vLLM reads these fields from it. In
        CUDA-compatible mode they are C(device_name=cuda) and C(dist_backend=nccl), with XCCL behind the
        nccl name. Only the keys given are checked (add C(dispatch_key) to check it too).
    type: dict
    default: {device_name: cuda, dist_backend: nccl}
  python:
    description:
      - The interpreter inside the image. Default C(<components.python.venv>/bin/python).
    type: str
  python_match:
    description:
      - How the interpreter is compared with the C(python) pin. C(exact) compares the full version;
        C(minor) only major.minor (the ABI the pinned cp310 wheels need), for a base image whose
        Python is a different patch release of the same minor version.
    type: str
    choices: [exact, minor]
    default: exact
  env:
    description: Environment of the probe's container (the serving environment, e.g. C(XPU_VISIBLE_DEVICES)).
    type: dict
    default: {}
  devices:
    description:
      - Device nodes to pass. Default every C(/dev/xpuN) node of the host and C(/dev/xpuctrl), so a
        missing card shows as a wrong count in the table.
    type: list
    elements: path
  quantization:
    description: The serving C(--quantization) method to load in the image; empty to skip that check.
    type: str
    default: ""
  shm_size:
    description: The container's C(/dev/shm) size (C(--shm-size)), as the serving container has it; empty for Docker's.
    type: str
    default: ""
  cap_add:
    description: Capabilities added to the container (C(--cap-add)), as the serving container has them.
    type: list
    elements: str
    default: []
  security_opt:
    description: Security options of the container (C(--security-opt)), as the serving container has them.
    type: list
    elements: str
    default: []
  volumes:
    description: Bind mounts (C(--volume host:container[:ro])), as the serving container has them.
    type: list
    elements: str
    default: []
author:
  - kunlun-fleet contributors (@kunlun-fleet)
"""

EXAMPLES = r"""
- name: Prove the serving image on the builder
  stack_proof:
    image: "kunlun-serving:{{ image_tag }}"
    components: "{{ kunlun_stack_components }}"
    known_bad: "{{ kunlun_stack_known_bad }}"
    device_count: "{{ kunlun_stack_device_count }}"
    env: "{{ kunlun_stack_serving_env_effective }}"
    quantization: "{{ kunlun_stack_serving_effective.quantization }}"
    shm_size: 32g
    cap_add: [SYS_PTRACE]
    security_opt: [seccomp=unconfined]
    volumes: ["/usr/local/bin/xpu-smi:/usr/local/bin/xpu-smi:ro"]
  register: image_proof

- name: Prove it with a narrower memory range (GiB of device 0) and the platform fields spelled out
  stack_proof:
    image: "kunlun-serving:{{ image_tag }}"
    components: "{{ kunlun_stack_components }}"
    device_memory_min_gib: 90
    device_memory_max_gib: 96
    platform_fields: {device_name: cuda, dist_backend: nccl}
"""

RETURN = r"""
proven:
  description: Whether the probe ran and every check passed.
  returned: always
  type: bool
rows:
  description: Every check as C({component, expected, found, ok, layer}); I(layer) is one of C(driver),
    C(torch), C(plugin), C(image).
  returned: when the probe ran
  type: list
  elements: dict
  sample: [{component: torch.cuda.device_count(), expected: "8", found: "8", ok: true, layer: driver}]
table:
  description: The rows as a text table C(layer | component | expected | found).
  returned: when the probe ran
  type: str
layers:
  description: The layers with a failed check, lowest first (empty when proven).
  returned: when the probe ran
  type: list
  elements: str
  sample: [driver]
cuda:
  description: What torch.cuda showed in the image. I(total_memory_bytes) and I(device_name) come from
    C(torch.cuda.get_device_properties(0)); a value the probe could not read is null.
  returned: when the probe ran
  type: dict
  sample: {available: true, device_count: 8, tensor_ok: true, total_memory_bytes: 103079215104,
           device_name: P800 OAM}
platform:
  description: The platform class that vllm-kunlun registers, and its fields. The values are null when the
    class could not be loaded.
  returned: when the probe ran
  type: dict
  sample: {class: vllm_kunlun.platforms.kunlun.KunlunPlatform, device_name: cuda, dispatch_key: CUDA,
           dist_backend: nccl}
summary:
  description: One line with the torch.cuda and platform findings.
  returned: when the probe ran
  type: str
  sample: "torch.cuda: available, 8 devices, cuda:0 tensor ok, device 0 96.0 GiB; platform cuda/CUDA/nccl"
report:
  description: The probe's raw findings (versions, devices, paths, errors).
  returned: when the probe ran
  type: dict
devices:
  description: The device nodes passed to the container.
  returned: always
  type: list
  elements: str
"""

import glob
import os
import re

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.kunlun_stack import check_known_bad
from ansible.module_utils.stack_proof import (
    LAYER_FIX,
    PROBE_SOURCE,
    broken_layers,
    findings,
    found_versions,
    format_table,
    judge,
    parse_probe_output,
    probe_request,
    summary,
)

_XPU_NODE = re.compile(r"^xpu(\d+)$")


def host_devices(dev_dir="/dev"):
    """The host's accelerator nodes, /dev/xpu0.. in numeric order, then /dev/xpuctrl."""
    nodes = []
    for path in glob.glob(os.path.join(dev_dir, "xpu*")):
        match = _XPU_NODE.match(os.path.basename(path))
        if match:
            nodes.append((int(match.group(1)), path))
    paths = [path for _index, path in sorted(nodes)]
    ctrl = os.path.join(dev_dir, "xpuctrl")
    if os.path.exists(ctrl):
        paths.append(ctrl)
    return paths


def interpreter(params):
    """The image's Python: the option, else <venv>/bin/python from the python pin."""
    if params.get("python"):
        return params["python"]
    python = params["components"].get("python")
    venv = python.get("venv") if isinstance(python, dict) else None
    return venv.rstrip("/") + "/bin/python" if venv else None


def probe_command(docker, image, python, devices, env, request, shm_size="", cap_add=(), security_opt=(), volumes=()):
    """The docker run command line of the probe (a list; never privileged, no network), with
    the serving container's shm size, capabilities, security options and mounts."""
    cmd = [
        docker,
        "run",
        "--rm",
        "--network",
        "none",
        "--workdir",
        "/",
        "--label",
        "org.kunlun-fleet.stack-proof=1",
        "--entrypoint",
        python,
    ]
    if shm_size:
        cmd += ["--shm-size", str(shm_size)]
    for cap in cap_add or ():
        cmd += ["--cap-add", str(cap)]
    for opt in security_opt or ():
        cmd += ["--security-opt", str(opt)]
    for volume in volumes or ():
        cmd += ["--volume", str(volume)]
    for node in devices:
        cmd += ["--device", "%s:%s" % (node, node)]
    for key in sorted(env):
        cmd += ["--env", "%s=%s" % (key, env[key])]
    return cmd + [image, "-c", PROBE_SOURCE, request]


def evaluate(report, params):
    """(rows, failed rows) of a probe report against the module's parameters."""
    problems = check_known_bad(found_versions(report), params["known_bad"] or [])
    rows = judge(
        report,
        params["components"],
        params["device_count"],
        params["python_match"],
        problems,
        memory_gib=(params["device_memory_min_gib"], params["device_memory_max_gib"]),
        platform_fields=params["platform_fields"],
        quantization=params.get("quantization") or None,
    )
    return rows, [r for r in rows if not r["ok"]]


def main():
    module = AnsibleModule(
        argument_spec=dict(
            image=dict(type="str", required=True),
            components=dict(type="dict", required=True),
            known_bad=dict(type="list", elements="dict", default=[]),
            device_count=dict(type="int", default=8),
            device_memory_min_gib=dict(type="float", default=80.0),
            device_memory_max_gib=dict(type="float", default=100.0),
            platform_fields=dict(type="dict", default=dict(device_name="cuda", dist_backend="nccl")),
            python=dict(type="str"),
            python_match=dict(type="str", choices=["exact", "minor"], default="exact"),
            env=dict(type="dict", default={}),
            devices=dict(type="list", elements="path"),
            quantization=dict(type="str", default=""),
            shm_size=dict(type="str", default=""),
            cap_add=dict(type="list", elements="str", default=[]),
            security_opt=dict(type="list", elements="str", default=[]),
            volumes=dict(type="list", elements="str", default=[]),
        ),
        supports_check_mode=True,
    )
    params = module.params
    image = params["image"]
    python = interpreter(params)
    if not python:
        module.fail_json(
            msg="stack_proof: no interpreter to run the probe with: components.python.venv is not "
            "set. Fix: set kunlun_stack_components.python.venv (the base image's venv, "
            "/opt/vllm_kunlun) or pass python=<path inside the image>."
        )
    devices = params["devices"] if params["devices"] is not None else host_devices()
    docker = module.get_bin_path("docker", required=True)

    rc, out, err = module.run_command([docker, "image", "inspect", "--format", "{{.Id}}", image])
    if rc != 0:
        if module.check_mode:
            module.exit_json(
                changed=False,
                proven=False,
                devices=devices,
                msg="image %s is not on this host yet (check mode: it would be built or "
                "loaded first); not proven" % image,
            )
        module.fail_json(
            msg="stack_proof: image %s is not on this host (%s). Fix: build it with "
            "playbooks/image.yml, or docker load it, before proving it." % (image, (err or out).strip()),
            devices=devices,
            proven=False,
        )

    env = dict((str(k), str(v)) for k, v in (params["env"] or {}).items())
    cmd = probe_command(
        docker,
        image,
        python,
        devices,
        env,
        probe_request(params["components"], params["quantization"] or None),
        params["shm_size"],
        params["cap_add"],
        params["security_opt"],
        params["volumes"],
    )
    rc, out, err = module.run_command(cmd)
    try:
        report = parse_probe_output(out)
    except ValueError as exc:
        module.fail_json(
            msg="stack_proof: the probe did not run in image %s with %s (rc=%d): %s %s. Fix: the "
            "image must hold the base image's venv (its Python at %s); check that the "
            "devices %s exist and docker can start containers on this host."
            % (image, python, rc, exc, (err or "").strip()[-1500:], python, ", ".join(devices)),
            devices=devices,
            proven=False,
            rc=rc,
            stdout=out,
            stderr=err,
        )

    rows, failed = evaluate(report, params)
    table = format_table(rows)
    layers = broken_layers(rows)
    cuda, platform = findings(report)
    line = summary(report)
    result = dict(
        rows=rows,
        table=table,
        report=report,
        devices=devices,
        layers=layers,
        cuda=cuda,
        platform=platform,
        summary=line,
    )
    if failed:
        module.fail_json(
            msg="stack_proof: image %s does not hold the validated combination (%d of %d checks failed; "
            "broken layer%s, lowest first: %s):\n%s\n%s\nFix:\n%s"
            % (
                image,
                len(failed),
                len(rows),
                "s" if len(layers) > 1 else "",
                ", ".join(layers),
                format_table(failed),
                line,
                "\n".join("- %s: %s" % (layer, LAYER_FIX[layer]) for layer in layers),
            ),
            proven=False,
            **result,
        )
    module.exit_json(changed=False, proven=True, msg="image %s proven: %s" % (image, line), **result)


if __name__ == "__main__":
    main()
