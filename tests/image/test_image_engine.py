"""The rendered Dockerfile built for real (classic builder, no buildx) on the sim fleet's
engine from the stand-in bundle and base image, then proved from the inside with the
probe of stack_proof: 8 accelerator nodes pass (torch.cuda sees 8 devices, a cuda:0 tensor
reads back, 96 GiB on device 0, the platform says cuda/CPU/nccl), 7 fail on the count (the
driver layer). The sim_fleet fixture starts the engine and builds the bundle (base image
archive included)."""

import os
import shutil
import subprocess
import sys

import pytest

from image_helpers import PINS, ROOT

from kunlun_fleet.sim import base_python

# The stand-in base image's Python: this machine's CPython 3.10, or Debian's 3.11 where it
# has none (what the proof then expects instead of the pin, as the sim inventory's machine.yml).
BASE_PYTHON = base_python.resolve()

pytestmark = [pytest.mark.sim, pytest.mark.slow]

SOCK = os.path.join(os.environ.get("KUNLUN_SIM_HOME", "/var/lib/kunlun-sim"), "docker.sock")
BUNDLE = os.path.join(os.environ.get("KUNLUN_SIM_HOME", "/var/lib/kunlun-sim"), "bundle")
ENV = dict(os.environ, DOCKER_HOST="unix://" + SOCK, DOCKER_API_VERSION="1.41", DOCKER_BUILDKIT="0")
TAG = "kunlun-serving:pytest-engine"


def docker(*args, **kw):
    return subprocess.run(["docker", *args], env=ENV, capture_output=True, text=True, **kw)


@pytest.fixture(scope="module")
def built_image(sim_fleet, tmp_path_factory):
    info = docker("info")
    assert info.returncode == 0, "the sim engine does not answer after sim-up: %s" % info.stderr
    import yaml

    from kunlun_fleet import bundle as product

    # The sim bundle's files, as its index (bundle.yml) names them.
    with open(os.path.join(BUNDLE, "bundle.yml")) as fh:
        files = {key: entry["path"] for key, entry in yaml.safe_load(fh)["artifacts"].items()}
    if docker("image", "inspect", PINS["kunlun_stack_base_image"]).returncode != 0:
        archive = os.path.join(BUNDLE, files["base_image"])
        assert os.path.exists(archive), "sim-up built no stand-in base image archive at %s" % archive
        assert docker("load", "-i", archive).returncode == 0
    from image_helpers import Site

    site = Site(tmp_path_factory.mktemp("engine"))
    site.bundle = type(site.bundle)(BUNDLE)
    site.vars = {
        "kunlun_stack_bundle_dir": BUNDLE,
        "image_registry": PINS["kunlun_stack_base_image"].split("/")[0],
        # the sim inventory's: its vllm is a stand-in, not the index's file
        "kunlun_stack_index_sha256": product.load_pins(ROOT / "inventories/sim")["kunlun_stack_index_sha256"],
    }
    ctx = site.tmp / "ctx"
    (ctx / "artifacts").mkdir(parents=True)
    for key in PINS["kunlun_stack_components"]:
        if key != "python":
            shutil.copy(os.path.join(BUNDLE, files[key]), ctx / "artifacts")
    playbook = site.tmp / "render.yml"
    playbook.write_text(
        "- hosts: image_builders[0]\n  gather_facts: false\n  tasks:\n"
        "    - ansible.builtin.include_role: {name: image, tasks_from: validate.yml}\n"
        "    - ansible.builtin.copy: {content: '{{ image_dockerfile }}', dest: '%s/Dockerfile', mode: '0644'}\n"
        "      delegate_to: localhost\n" % ctx
    )
    rc, out = site.run(playbook, "-e", "ansible_python_interpreter=%s" % sys.executable)
    assert rc == 0, out[-3000:]
    proc = docker("build", "--no-cache", "-t", TAG, str(ctx), timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    # the patch script's own results line, and which quantization module the build kept
    assert "  Results: 11 applied  |  0 skipped  |  0 failed  |  11 total" in proc.stdout
    assert (
        "vllm-kunlun quantization: vllm_kunlun/ops/quantization/__init__.py is no replacement of vllm's "
        "quantization module" in proc.stdout
    )
    yield TAG
    docker("rmi", TAG)


def probe(image, nodes, tmp_path, error_node=None, quantization=None):
    """stack_proof's probe in the image with `nodes` accelerator nodes; error_node gets a
    node no driver serves (61:N, as the kit makes for a device in error: open gives ENXIO)."""
    sys.path.insert(0, str(ROOT / "library"))
    import stack_proof as mod
    from ansible.module_utils import stack_proof as sp
    from ansible.module_utils.kunlun_stack import check_known_bad

    devdir = tmp_path / "dev"
    devdir.mkdir()
    for name in ["xpu%d" % i for i in range(nodes)] + ["xpuctrl"]:
        major, minor = ("61", str(error_node)) if name == "xpu%s" % error_node else ("1", "3")
        subprocess.run(["mknod", str(devdir / name), "c", major, minor], check=True)
    comps = PINS["kunlun_stack_components"]
    if BASE_PYTHON["proof_python_version"]:
        comps = dict(comps, python=dict(comps["python"], version=BASE_PYTHON["proof_python_version"]))
    devices = ["/dev/xpu%d" % i for i in range(nodes)] + ["/dev/xpuctrl"]
    cmd = mod.probe_command(
        "docker",
        image,
        comps["python"]["venv"] + "/bin/python",
        devices,
        PINS["kunlun_stack_serving_env"],
        sp.probe_request(comps, quantization),
        "32g",
        ["SYS_PTRACE"],
        ["seccomp=unconfined"],
    )
    # the module passes /dev/xpuN:/dev/xpuN; here the host side is a scratch node
    cmd = ["%s/%s:%s" % (devdir, a.split(":")[0][5:], a.split(":")[1]) if a.startswith("/dev/xpu") else a for a in cmd]
    proc = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=120)
    report = sp.parse_probe_output(proc.stdout)
    problems = check_known_bad(sp.found_versions(report), PINS["kunlun_stack_known_bad"])
    rows = sp.judge(report, comps, PINS["kunlun_stack_device_count"], "minor", problems, quantization=quantization)
    return report, [r for r in rows if not r["ok"]]


def test_labels_carry_every_pin(built_image):
    import json

    labels = json.loads(docker("image", "inspect", "--format", "{{json .Config.Labels}}", built_image).stdout)
    for name, comp in PINS["kunlun_stack_components"].items():
        assert labels["org.kunlun-fleet.pin.%s" % name] == comp["version"]
    assert labels["org.kunlun-fleet.pin.vllm_kunlun.commit"] == PINS["kunlun_stack_components"]["vllm_kunlun"]["commit"]


def test_the_built_image_proves(built_image, tmp_path):
    from ansible.module_utils import stack_proof as sp

    report, failed = probe(built_image, 8, tmp_path, quantization=PINS["kunlun_stack_serving"]["quantization"])
    assert failed == [], failed
    assert report["devices"] == 8 and report["kunlun_extension"].endswith(".so")
    assert report["executable"] == "/opt/vllm_kunlun/bin/python"
    # what vllm-kunlun runs on: torch in CUDA-compatible mode and the platform it registers
    assert sp.findings(report) == (
        {
            "available": True,
            "device_count": 8,
            "tensor_ok": True,
            "total_memory_bytes": 98304 * 1024 * 1024,
            "device_name": "P800 OAM",
        },
        {
            "class": "vllm_kunlun.platforms.kunlun.KunlunPlatform",
            "device_name": "cuda",
            "dispatch_key": "CPU",
            "dist_backend": "nccl",
        },
    )
    assert sp.summary(report) == (
        "torch.cuda: available, 8 devices, cuda:0 tensor ok, device 0 96.0 GiB; platform cuda/CPU/nccl"
    )
    assert report["errors"] == {}
    # the serving method loads in vllm's own module (the 0.15.1-era tree replaces nothing)
    assert report["quantization"]["config"] == "compressed-tensors" and report["quantization"]["general_plugins"]


SHORT = [("driver", "torch_xmlir._XMLIRC._xpu_get_devices_number()", "7"), ("driver", "torch.cuda.device_count()", "7")]


def test_seven_nodes_fail_the_proof(built_image, tmp_path):
    report, failed = probe(built_image, 7, tmp_path)
    assert [(r["layer"], r["component"], r["found"]) for r in failed] == SHORT
    assert report["cuda"]["tensor_ok"] is True


def test_a_device_in_error_fails_the_proof(built_image, tmp_path):
    """Eight nodes, one of them with no driver behind it: the stack counts seven."""
    _, failed = probe(built_image, 8, tmp_path, error_node=3)
    assert [(r["layer"], r["component"], r["found"]) for r in failed] == SHORT


def test_no_node_fails_every_cuda_check_on_the_driver(built_image, tmp_path):
    """No accelerator node passed: torch.cuda has no device and a tensor on cuda:0 raises."""
    report, failed = probe(built_image, 0, tmp_path)
    assert [(r["layer"], r["component"]) for r in failed] == [
        ("driver", "torch_xmlir._XMLIRC._xpu_get_devices_number()"),
        ("driver", "torch.cuda.is_available()"),
        ("driver", "torch.cuda.device_count()"),
        ("driver", 'torch.arange(4, device="cuda:0")'),
        ("driver", "torch.cuda.get_device_properties(0).total_memory"),
    ]
    assert report["errors"]["torch.cuda.tensor"] == "RuntimeError: No CUDA GPUs are available"


def test_no_pip_in_the_venv(built_image):
    proc = docker(
        "run",
        "--rm",
        "--entrypoint",
        "/bin/sh",
        built_image,
        "-c",
        "test ! -e /opt/vllm_kunlun/bin/pip && command -v uv && ! ls /tmp/kunlun-artifacts",
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


# ------------------------------------------------------------------ bad stacks, for real
# Images built from the proved one with one part of a known-bad combination, the way an
# operator with kunlun_stack_allow_unvalidated would get them: the stand-in stack then
# fails where the real one fails (the server at start, or the proof).
SP = "/opt/vllm_kunlun/lib/python%s/site-packages" % BASE_PYTHON["minor"]
BAD = {
    "transformers-5.5.3": (
        "COPY {wheel} /tmp/\n"
        "RUN uv pip install --python /opt/vllm_kunlun/bin/python --no-deps --force-reinstall /tmp/{wheel}\n",
        "AttributeError: 'Qwen2VLImageProcessor' object has no attribute 'max_pixels'",
    ),
    "vllm-kunlun-2fda97b": (
        "COPY {tarball} /tmp/\n"
        "RUN rm -rf %s/vllm_kunlun %s/vllm_kunlun-* && mkdir /tmp/vk \\\n"
        " && tar -xzf /tmp/{tarball} -C /tmp/vk --strip-components=1 \\\n"
        " && cd /tmp/vk && /opt/vllm_kunlun/bin/python setup.py build && /opt/vllm_kunlun/bin/python setup.py install\n"
        % (SP, SP),
        "TypeError: causal_conv1d_update() got an unexpected keyword argument",
    ),
    "no-_kunlun": (
        "RUN rm %s/vllm_kunlun/_kunlun*.so\n" % SP,
        "ImportError: cannot import name '_kunlun' from 'vllm_kunlun'",
    ),
}


@pytest.fixture(scope="module")
def bad_images(built_image, tmp_path_factory):
    from kunlun_fleet.sim import bundle

    ctx = tmp_path_factory.mktemp("bad")
    wheel = os.path.basename(bundle.fetch_transformers_version("5.5.3", str(ctx)))
    shutil.move(str(ctx / "wheels" / wheel), str(ctx / wheel))
    tarball = os.path.basename(bundle.build_vllm_kunlun_variant(str(ctx), "2fda97b"))
    shutil.move(str(ctx / "src" / tarball), str(ctx / tarball))
    images = {}
    for name, (steps, _) in BAD.items():
        (ctx / "Dockerfile").write_text("FROM %s\n%s" % (built_image, steps.format(wheel=wheel, tarball=tarball)))
        tag = "kunlun-serving:pytest-bad-%s" % name.lower().replace("_", "")
        proc = docker("build", "-q", "-t", tag, str(ctx), timeout=600)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        images[name] = tag
    yield images
    docker("rmi", *images.values())


def serve_once(image, tmp_path):
    """The serving command (the product's flags) in the image, with 8 device nodes: the
    server's exit code and output, or None when it was still serving after 90 s."""
    sys.path.insert(0, str(ROOT / "tests" / "serving"))
    from serving_helpers import serving_args

    model = os.path.join(BUNDLE, "models", PINS["kunlun_stack_model"]["directory"])
    devdir = tmp_path / "dev"
    devdir.mkdir()
    args = []
    for name in ["xpu%d" % i for i in range(8)] + ["xpuctrl"]:
        subprocess.run(["mknod", str(devdir / name), "c", "1", "3"], check=True)
        args += ["--device", "%s:/dev/%s" % (devdir / name, name)]
    for key, value in dict(PINS["kunlun_stack_serving_env"], HF_HUB_OFFLINE="1", KUNLUN_SIM_LOAD_SECONDS="0").items():
        args += ["-e", "%s=%s" % (key, value)]
    proc = docker(
        "run",
        "--rm",
        *args,
        "-v",
        "%s:%s:ro" % (model, model),
        "--entrypoint",
        "timeout",
        image,
        "90",
        "/opt/vllm_kunlun/bin/python",
        "-m",
        "vllm.entrypoints.openai.api_server",
        *serving_args(PINS, model),
        "--port",
        "18555",
        "--api-key",
        "k",
        timeout=180,
    )
    return (None if proc.returncode == 124 else proc.returncode), proc.stdout + proc.stderr


@pytest.mark.parametrize("bad", sorted(BAD))
def test_a_bad_stack_fails_at_start_like_the_real_one(bad_images, bad, tmp_path):
    rc, out = serve_once(bad_images[bad], tmp_path)
    assert rc not in (None, 0), "the server with %s did not fail:\n%s" % (bad, out[-3000:])
    assert BAD[bad][1] in out, out[-3000:]


def test_the_proof_refuses_an_image_without_the_extension(bad_images, tmp_path):
    _, failed = probe(bad_images["no-_kunlun"], 8, tmp_path)
    # the platform class does not import either: its module imports _kunlun
    assert [(r["layer"], r["component"]) for r in failed] == [
        ("plugin", "from vllm_kunlun import _kunlun"),
        ("plugin", "vllm.platform_plugins class"),
    ], failed
    assert "ImportError: cannot import name '_kunlun'" in failed[1]["found"]
