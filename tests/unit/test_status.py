"""kunlun-fleet status: library/host_status.py's readers against fixture files under a tmp
root (the OS, the data volume, the driver facts, the serving unit rendered from the serve
role's own template, systemctl and docker answers, the local /metrics), the status
document built from a run's events (kunlun_fleet/status.py: the gateways, the health rules,
the exit codes, the table and the JSON), playbooks/status.yml read-only by construction, and
`kunlun-fleet status` for real through the runner against local hosts with a fake
systemctl, docker, vLLM /metrics and router /list_workers."""

import base64
import http.server
import io
import json
import os
import socket
import sys
import tarfile
import threading
from pathlib import Path

import jinja2
import pytest
import yaml
from kunlun_fleet.bundle import load_pins as stack_pins

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "library"))

import host_status  # noqa: E402
from module_docs import documented_spec  # noqa: E402

from kunlun_fleet import cli, runner, status, support  # noqa: E402
from plugins.filter.serving import FilterModule  # noqa: E402
from plugins.filter.systemd import systemd_quote  # noqa: E402

PINS = stack_pins()
SERVE = yaml.safe_load((ROOT / "roles/serve/defaults/main.yml").read_text())
GATEWAY = yaml.safe_load((ROOT / "roles/gateway/defaults/main.yml").read_text())
MODEL = PINS["kunlun_stack_model"]["name"]
CURRENT = "sha256:" + "9f1c" * 16
PREVIOUS = "sha256:" + "41ab" * 16


# ---------------------------------------------------------------- fixtures
class FakeModule:
    """get_bin_path and run_command from tables (argv without the `timeout N` prefix)."""

    def __init__(self, answers=None, bins=("systemctl", "docker", "timeout")):
        self.answers, self.calls = answers or {}, []
        self.bins = {name: "/usr/bin/" + name for name in bins}

    def get_bin_path(self, name, required=False):
        return self.bins.get(name)

    def run_command(self, argv, environ_update=None):
        self.calls.append(argv)
        if argv[0] == "/usr/bin/timeout":
            argv = argv[2:]
        key = tuple(a.replace("/usr/bin/", "") if i == 0 else a for i, a in enumerate(argv))
        return self.answers.get(key, (1, "", "no answer for %s" % " ".join(key)))


def systemctl_show(active="active", sub="running", load="loaded", mono="1000000000"):
    text = (
        "LoadState=%s\nActiveState=%s\nSubState=%s\nActiveEnterTimestamp=Tue 2026-12-01 06:12:03 UTC\n"
        "ActiveEnterTimestampMonotonic=%s\n" % (load, active, sub, mono)
    )
    props = "LoadState,ActiveState,SubState,ActiveEnterTimestamp,ActiveEnterTimestampMonotonic"
    return {("systemctl", "show", "kunlun-serve.service", "--property", props): (0, text, "")}


def docker(tags=None, container=None):
    tags = {"current": CURRENT, "previous": PREVIOUS, "3e5f0a9c1d2b": CURRENT} if tags is None else tags
    answers = {
        ("docker", "images", "--no-trunc", "--format", "{{.Tag}} {{.ID}}", "kunlun-serving"): (
            0,
            "".join("%s %s\n" % kv for kv in tags.items()),
            "",
        )
    }
    inspect = ("docker", "container", "inspect", "--format", "{{.Image}} {{.State.Status}}", "kunlun-serve")
    answers[inspect] = (0, "%s %s\n" % container, "") if container else (1, "", "Error: No such container")
    # The stack label of each image (docker prints "<no value>" for an image without it).
    label = '{{ index .Config.Labels "org.kunlun-fleet.stack" }}'
    for image_id, stack in ((CURRENT, "0.15.1-4885de2"), (PREVIOUS, "<no value>")):
        answers[("docker", "image", "inspect", "--format", label, image_id)] = (0, stack + "\n", "")
    return answers


def render_serve_unit(image_id=CURRENT, **overrides):
    """/etc/systemd/system/kunlun-serve.service as the serve role writes it (its template)."""
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(ROOT / "roles/serve/templates")), extensions=["jinja2.ext.do"]
    )
    env.filters.update(FilterModule().filters(), systemd_quote=systemd_quote)
    values = dict(
        SERVE,
        ansible_managed="Ansible managed",
        serve_served_model_name=MODEL,
        serve_image_ref="kunlun-serving:current",
        serve_run_image_id=image_id,
        serve_python="/opt/vllm_kunlun/bin/python",
        serve_data_dir="/home/newdata",
        serve_log_dir="/home/newdata/logs/serve",
        serve_model_path="/home/newdata/models/" + PINS["kunlun_stack_model"]["directory"],
        kunlun_stack_serving_effective=PINS["kunlun_stack_serving"],
        serve_devices=["/dev/xpu%d" % i for i in range(8)],
    )
    values.update(overrides)
    return env.get_template("kunlun-serve.service.j2").render(**values)


def test_the_serving_unit_names_its_image_by_id_not_by_the_tag_that_chose_it():
    """An upgrade's canary step runs the serve stage on the stack's tag; the promotion then tags
    that image `current` and runs it again. The unit (the serve role's template) must be the same
    both times, or the canary is drained and restarted for nothing; another image ID is another unit."""
    by_stack_tag = render_serve_unit(serve_image_ref="kunlun-serving:0.15.1-7c1e0a2")
    assert by_stack_tag == render_serve_unit(serve_image_ref="kunlun-serving:current")
    assert render_serve_unit(image_id=PREVIOUS) != by_stack_tag
    assert CURRENT in by_stack_tag and "kunlun-serving:" not in by_stack_tag


def render_gateway_unit(workers):
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(ROOT / "roles/gateway/templates")))
    env.filters["systemd_quote"] = systemd_quote
    values = dict(
        GATEWAY, ansible_managed="Ansible managed", gateway_router_version="0.1.17", gateway_worker_urls=workers
    )
    return env.get_template("kunlun-gateway.service.j2").render(**values)


def facts(count=8, states=None, caps=None):
    states = states or {}
    caps = caps or {}
    return {
        "driver": "5.0.21.26",
        "runtime": "5.0.21",
        "pin": "5.0.21.26",
        "count": count,
        "card_variants": ["VC"],
        "modules_loaded": True,
        "devices": [
            {
                "index": i,
                "name": "P800 OAM",
                "serial": "02K0A3A00%02d" % i,
                "state": states.get(i, "ok"),
                "power_cap_w": caps.get(i, 400),
            }
            for i in range(count)
        ],
    }


@pytest.fixture
def host_root(tmp_path):
    """A serving host's files under tmp_path: os-release, mountinfo, uptime, the facts
    file, the serving unit and the pinned image."""
    (tmp_path / "etc/ansible/facts.d").mkdir(parents=True)
    (tmp_path / "etc/systemd/system").mkdir(parents=True)
    (tmp_path / "etc/kunlun-serve").mkdir(parents=True)
    (tmp_path / "proc").mkdir()
    (tmp_path / "home").mkdir()
    (tmp_path / "etc/os-release").write_text(
        'PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"\nNAME="Debian GNU/Linux"\nVERSION_ID="12"\nID=debian\n'
    )
    (tmp_path / "proc/mountinfo").write_text(
        "22 1 259:2 / / rw,relatime shared:1 - ext4 /dev/nvme0n1p2 rw\n"
        "40 22 259:3 / /home rw,relatime shared:20 - ext4 /dev/nvme0n1p3 rw\n"
        "41 40 253:0 / /home rw,noatime shared:21 - xfs /dev/mapper/data-home rw,attr2,inode64\n"
        "42 22 0:50 / /mnt/with\\040space rw - tmpfs tmpfs rw\n"
    )
    (tmp_path / "proc/uptime").write_text("4600.25 9000.00\n")
    (tmp_path / "etc/fstab").write_text(
        "# /etc/fstab\nUUID=4d2a / ext4 errors=remount-ro 0 1\n"
        "UUID=0b9c /home xfs defaults,nofail,x-systemd.device-timeout=90s 0 0\n"
        "UUID=77aa /data\\040set xfs defaults 0 0\n"
    )
    (tmp_path / "etc/ansible/facts.d/xpu.fact").write_text(json.dumps(facts()))
    (tmp_path / "etc/systemd/system/kunlun-serve.service").write_text(render_serve_unit())
    (tmp_path / "etc/kunlun-serve/image").write_text(CURRENT + "\n")
    return tmp_path


def params(root, **over):
    p = {
        "mount_point": "/home",
        "fstab": str(root / "etc/fstab"),
        "service": "kunlun-serve",
        "unit_file": str(root / "etc/systemd/system/kunlun-serve.service"),
        "config_dir": str(root / "etc/kunlun-serve"),
        "image": "kunlun-serving:current",
        "previous_tag": "previous",
        "facts_file": str(root / "etc/ansible/facts.d/xpu.fact"),
        "expected_devices": 8,
        "full_power_cap_w": 400,
        "port": 8000,
        "worker_url": "http://10.20.1.11:8000",
        "metrics_timeout": 1.0,
        "command_timeout": 10,
    }
    p.update(over)
    return p


class Stat:
    f_frsize, f_blocks, f_bavail = 4096, 1000, 250


# ---------------------------------------------------------------- OS and volume
def test_os_release(host_root):
    found = host_status.read_os(str(host_root / "etc/os-release"), kernel="6.1.0-25-amd64")
    assert found == {"pretty_name": "Debian GNU/Linux 12 (bookworm)", "kernel": "6.1.0-25-amd64", "error": ""}
    (host_root / "etc/os-release").write_text('NAME="Ubuntu"\nVERSION="22.04.4 LTS (Jammy Jellyfish)"\n')
    assert (
        host_status.read_os(str(host_root / "etc/os-release"), "k")["pretty_name"]
        == "Ubuntu 22.04.4 LTS (Jammy Jellyfish)"
    )
    missing = host_status.read_os(str(host_root / "nope"), "k")
    assert missing["pretty_name"] is None and missing["error"].startswith("unreadable: No such file or directory")


def test_mountinfo_takes_the_top_mount_and_unescapes():
    assert host_status.parse_mountinfo("22 1 259:2 / / rw - ext4 /dev/sda2 rw\nnot a mountinfo line\n", "/home") == {}
    info = (
        "40 22 259:3 / /home rw - ext4 /dev/sda3 rw\n"
        "41 40 253:0 / /home rw shared:2 - xfs /dev/mapper/data-home rw\n"
        "42 22 0:50 / /mnt/with\\040space rw - tmpfs tmp\\040fs rw\n"
    )
    assert host_status.parse_mountinfo(info, "/home/") == {"fstype": "xfs", "source": "/dev/mapper/data-home"}
    assert host_status.parse_mountinfo(info, "/mnt/with space") == {"fstype": "tmpfs", "source": "tmp fs"}


def volume(host_root, mount_point, **kw):
    kw.setdefault("statvfs", lambda p: Stat)
    return host_status.read_volume(
        mount_point, str(host_root / "proc/mountinfo"), fstab=str(host_root / "etc/fstab"), **kw
    )


def test_volume_size_and_free(host_root):
    assert volume(host_root, "/home") == {
        "mount_point": "/home",
        "mounted": True,
        "source": "/dev/mapper/data-home",
        "fstype": "xfs",
        "size_bytes": 4096000,
        "free_bytes": 1024000,
        "free_pct": 25.0,
        "fstab": "UUID=0b9c /home xfs defaults,nofail,x-systemd.device-timeout=90s 0 0",
        "mount_unit": "home.mount",
        "error": "",
    }


def test_volume_not_mounted_or_missing(host_root):
    # No fstab line either: the storage stage never ran.
    found = volume(host_root, "/srv")
    assert not found["mounted"] and found["size_bytes"] == 4096000 and found["fstab"] is None
    assert found["error"] == "nothing mounted at /srv and no fstab line for it (it is on the filesystem below it)"

    def gone(path):
        raise FileNotFoundError(2, "No such file or directory", path)

    found = volume(host_root, "/srv", statvfs=gone)
    assert found["size_bytes"] is None and found["error"] == "unreadable: No such file or directory (/srv)"


def test_volume_in_fstab_but_not_mounted_names_its_line(host_root):
    """A data disk that failed at boot: fstab mounts the volume (nofail let the host boot),
    nothing is mounted there. The line, and where to look, are named."""
    (host_root / "proc/mountinfo").write_text(
        "22 1 259:2 / / rw,relatime shared:1 - ext4 /dev/nvme0n1p2 rw\n42 22 0:50 / /data\\040set rw - tmpfs tmpfs rw\n"
    )
    found = volume(host_root, "/home")
    assert not found["mounted"] and found["source"] is None
    assert found["fstab"] == "UUID=0b9c /home xfs defaults,nofail,x-systemd.device-timeout=90s 0 0"
    assert found["error"] == (
        "nothing mounted at /home: fstab mounts it (UUID=0b9c /home xfs defaults,nofail,x-systemd.device-timeout=90s "
        "0 0) but it is not mounted; its device did not appear at boot (a data disk failed or missing?): check pvs, "
        "lvs -a -o +devices and journalctl -b -u home.mount"
    )
    # The last line for a mount point counts (mount -a takes them in order); escapes read.
    assert host_status.fstab_line("/dev/sdb1 /home ext4 defaults 0 2\nUUID=1 /home/ xfs defaults 0 0\n", "/home") == (
        "UUID=1 /home/ xfs defaults 0 0"
    )
    assert volume(host_root, "/data set")["fstab"] == "UUID=77aa /data\\040set xfs defaults 0 0"
    assert volume(host_root, "/data set")["mounted"] is True


@pytest.mark.parametrize(
    "path, unit",
    [
        ("/home", "home.mount"),
        ("/", "-.mount"),
        ("/srv/data-1", "srv-data\\x2d1.mount"),
        ("/mnt/.x", "mnt-.x.mount"),
        ("/.hidden", "\\x2ehidden.mount"),
        ("/a b/", "a\\x20b.mount"),
    ],
)
def test_mount_unit_names_as_systemd_escape_gives_them(path, unit):
    assert host_status.mount_unit_name(path) == unit


# ---------------------------------------------------------------- driver facts
def test_driver_facts_all_ok(host_root):
    found = host_status.read_driver(str(host_root / "etc/ansible/facts.d/xpu.fact"), 8, 400)
    assert found["state"] == "present" and found["version"] == "5.0.21.26" and found["error"] == ""
    assert (found["devices"], found["devices_ok"], found["expected"], found["bad_devices"]) == (8, 8, 8, [])
    assert found["power_caps_w"] == [400] * 8 and found["low_power"] == [] and found["power_ok"] is True


def test_driver_facts_a_card_in_error_and_one_in_low_power(host_root):
    path = host_root / "etc/ansible/facts.d/xpu.fact"
    path.write_text(json.dumps(facts(count=7, states={3: "error"}, caps={5: 120})))
    found = host_status.read_driver(str(path), 8, 400)
    assert (found["devices"], found["devices_ok"], found["bad_devices"]) == (7, 6, [3])
    assert found["low_power"] == [5] and found["power_ok"] is False
    path.write_text(json.dumps(facts(caps={2: None})))
    found = host_status.read_driver(str(path), 8, 400)
    assert found["power_ok"] is None and found["low_power"] == []
    assert host_status.read_driver(str(path), 8, None)["power_ok"] is None


@pytest.mark.parametrize(
    "content, state, error",
    [
        (None, "absent", "no driver facts ({path} is missing: the driver stage has not completed here)"),
        ("{not json", "unreadable", "unreadable: {path} is not JSON ("),
        ("[1, 2]", "unreadable", "unreadable: {path} is not a JSON object"),
        ("dir", "unreadable", "unreadable: Is a directory"),
    ],
)
def test_driver_facts_missing_or_unreadable(tmp_path, content, state, error):
    path = tmp_path / "xpu.fact"
    if content == "dir":
        path.mkdir()
    elif content is not None:
        path.write_text(content)
    found = host_status.read_driver(str(path), 8, 400)
    assert found["state"] == state and found["error"].startswith(error.format(path=path)), found["error"]
    assert found["devices"] is None and found["version"] is None


# ---------------------------------------------------------------- the serving unit
def test_the_serve_roles_unit_gives_image_model_and_port(host_root):
    found = host_status.read_unit(str(host_root / "etc/systemd/system/kunlun-serve.service"))
    assert found == {
        "image": CURRENT,
        "model": MODEL,
        "port": PINS["kunlun_stack_serving"]["port"],
        "tls": False,
        "error": "",
    }


def test_unit_with_another_port_and_an_added_flag(tmp_path):
    # As a site's kunlun_stack_serving_overrides {port: 8100, disable_log_requests: true} merges.
    args = dict(PINS["kunlun_stack_serving"], port=8100, disable_log_requests=True)
    unit = tmp_path / "u.service"
    unit.write_text(render_serve_unit(image_id="kunlun-serving:current", kunlun_stack_serving_effective=args))
    assert "--disable-log-requests" in unit.read_text()
    assert host_status.read_unit(str(unit)) == {
        "image": "kunlun-serving:current",
        "model": MODEL,
        "port": 8100,
        "tls": False,
        "error": "",
    }


def test_unit_serving_tls_is_read_over_https_with_the_ca_file(tmp_path):
    """A unit whose flags name a certificate (kunlun_stack_serving_tls) serves TLS: the
    requests are read from https://127.0.0.1:<port>/metrics, verified with ca_file alone."""
    import ssl

    sys.path.insert(0, str(ROOT / "tests" / "artifacts"))
    from standin_helpers import issue_cert, make_ca

    tls = {"ssl_keyfile": "/etc/kunlun-serve/tls/server.key", "ssl_certfile": "/etc/kunlun-serve/tls/server.crt"}
    unit = tmp_path / "u.service"
    unit.write_text(render_serve_unit(kunlun_stack_serving_effective=dict(PINS["kunlun_stack_serving"], **tls)))
    assert host_status.read_unit(str(unit))["tls"] is True
    ca = make_ca(tmp_path / "ca")
    key, cert = issue_cert(ca, tmp_path / "ca")
    server, port = serve_http({"/metrics": (200, METRICS)})
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(str(cert), str(key))
    server.socket = context.wrap_socket(server.socket, server_side=True)
    try:
        found = host_status.read_requests(port, 5, tls=True, ca_file=str(ca["file"]))
        assert found == {"requests_running": 5, "requests_waiting": 1, "error": ""}, found
        # Without the CA (the system's store alone) the read says why it failed.
        found = host_status.read_requests(port, 5, tls=True)
        assert found["error"].startswith("unreadable: https://127.0.0.1:%d/metrics: " % port), found
        assert "CERTIFICATE_VERIFY_FAILED" in found["error"], found
    finally:
        server.shutdown()


def test_unit_missing_or_not_docker(tmp_path):
    assert host_status.read_unit(str(tmp_path / "none.service"))["error"].startswith("no unit ")
    unit = tmp_path / "u.service"
    unit.write_text("[Service]\nExecStart=/usr/bin/sleep infinity\n")
    assert host_status.read_unit(str(unit))["error"].endswith("ExecStart is not a docker run")


def test_docker_run_parsing():
    argv = [
        "/usr/bin/docker",
        "run",
        "--rm",
        "--name",
        "x",
        "--net=host",
        "-v",
        "/a:/a",
        "-it",
        "img:1",
        "python",
        "--served-model-name=m",
        "--port",
        "9",
    ]
    run = host_status.parse_docker_run(argv)
    assert run["image"] == "img:1" and host_status.flag_value(run["args"], "--served-model-name") == "m"
    assert host_status.flag_value(run["args"], "--port") == "9"
    assert host_status.parse_docker_run(["/bin/true"]) == {"image": None, "args": []}


# ---------------------------------------------------------------- systemctl
def test_service_active_and_for_how_long(host_root):
    found = host_status.read_service(
        FakeModule(systemctl_show(mono="600000000")), "kunlun-serve", 10, uptime=str(host_root / "proc/uptime")
    )
    assert found == {
        "unit": "kunlun-serve.service",
        "active": "active",
        "sub": "running",
        "since": "Tue 2026-12-01 06:12:03 UTC",
        "active_for_s": 4000.2,
        "error": "",
    }


def test_service_inactive_not_found_and_unreadable(host_root):
    found = host_status.read_service(FakeModule(systemctl_show("inactive", "dead", mono="0")), "kunlun-serve", 10)
    assert (found["active"], found["sub"], found["active_for_s"]) == ("inactive", "dead", None)
    found = host_status.read_service(
        FakeModule(systemctl_show("inactive", "dead", load="not-found")), "kunlun-serve", 10
    )
    assert found["active"] == "not-found" and found["error"] == ""
    found = host_status.read_service(FakeModule({}), "kunlun-serve", 10)
    assert found["active"] is None and found["error"].startswith("unreadable: systemctl show kunlun-serve.service:")
    timed = {k: (124, "", "") for k in systemctl_show()}
    found = host_status.read_service(FakeModule(timed), "kunlun-serve", 7)
    assert found["error"] == "unreadable: systemctl show kunlun-serve.service: no answer within 7 s"
    found = host_status.read_service(FakeModule(bins=()), "kunlun-serve", 10)
    assert found["error"] == "unreadable: no systemctl on the host"


# ---------------------------------------------------------------- the image
def read_image(answers, unit=CURRENT, pinned=CURRENT, bins=("docker", "timeout")):
    return host_status.read_image(
        FakeModule(answers, bins), "kunlun-serving:current", "previous", "kunlun-serve", unit, pinned, 10
    )


def test_image_current():
    found = read_image(docker(container=(CURRENT, "running")))
    assert found["state"] == "current" and found["error"] == ""
    assert (found["current_id"], found["previous_id"], found["runs_id"]) == (CURRENT, PREVIOUS, CURRENT)
    assert found["runs_tags"] == ["3e5f0a9c1d2b", "current"] and found["container"] == "running"


def test_image_stale_the_running_container_counts_over_the_unit():
    found = read_image(docker(container=(PREVIOUS, "running")))
    assert found["state"] == "stale" and found["runs_id"] == PREVIOUS and found["runs_tags"] == ["previous"]
    # Stopped: the unit's image is what it runs at its next start.
    found = read_image(docker(container=(PREVIOUS, "exited")), unit=PREVIOUS)
    assert found["state"] == "stale" and found["runs_id"] == PREVIOUS
    found = read_image(docker(), unit=None, pinned=CURRENT)
    assert found["state"] == "current" and found["container"] == "absent"


def test_image_by_tag_in_the_unit_is_resolved():
    assert read_image(docker(), unit="kunlun-serving:previous")["state"] == "stale"
    assert read_image(docker(), unit="kunlun-serving:current")["runs_id"] == CURRENT


def test_image_none_unknown_and_unreadable():
    assert read_image(docker(), unit=None, pinned=None)["state"] == "none"
    found = read_image(docker(tags={"previous": PREVIOUS}))
    assert (
        found["state"] == "unknown"
        and found["error"] == "no kunlun-serving:current on the host (the image stage has not run here)"
    )
    found = read_image({})
    assert found["state"] == "unknown" and found["error"].startswith("unreadable: docker images kunlun-serving:")
    found = read_image({}, bins=())
    assert found["state"] == "unknown" and found["error"] == "unreadable: no docker on the host"


def test_image_reference_with_a_registry_port():
    assert host_status.split_ref("reg.example:5000/kunlun-serving:current") == (
        "reg.example:5000/kunlun-serving",
        "current",
    )
    assert host_status.split_ref("reg.example:5000/kunlun-serving") == ("reg.example:5000/kunlun-serving", "latest")


# ---------------------------------------------------------------- /metrics
METRICS = """# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_running{engine="1",model_name="m"} 2.0
vllm:num_requests_waiting{engine="0",model_name="m"} 1.0
vllm:num_requests_running_total_not_this 9.0
"""


def test_metrics_sum_over_engines():
    assert host_status.parse_metrics(METRICS) == (5.0, 1.0)
    assert host_status.parse_metrics("# nothing\n") == (None, None)


def serve_http(routes):
    """A local HTTP server answering GET path -> (status, body); returns (server, port)."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            status_code, body = routes.get(self.path, (404, "not found"))
            data = body() if callable(body) else body
            self.send_response(status_code)
            if data.startswith("{"):
                self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data.encode())))
            self.end_headers()
            self.wfile.write(data.encode())

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, server.server_address[1]


def closed_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def dead_host():
    """Inventory variables of a host whose SSH port refuses connections (fails fast)."""
    return {
        "ansible_connection": "ssh",
        "ansible_host": "127.0.0.1",
        "ansible_port": closed_port(),
        "ansible_ssh_timeout": 3,
        "ansible_ssh_retries": 0,
    }


def test_requests_from_the_local_metrics():
    server, port = serve_http({"/metrics": (200, METRICS)})
    try:
        assert host_status.read_requests(port, 2) == {"requests_running": 5, "requests_waiting": 1, "error": ""}
    finally:
        server.shutdown()
    port = closed_port()
    found = host_status.read_requests(port, 2)
    assert found["requests_running"] is None
    assert found["error"].startswith("unreadable: http://127.0.0.1:%d/metrics: " % port)
    assert "refused" in found["error"].lower()


def test_requests_not_vllm():
    server, port = serve_http({"/metrics": (200, "# an exporter of something else\nup 1\n")})
    try:
        assert host_status.read_requests(port, 2)["error"].endswith("has no vllm:num_requests_running / _waiting")
    finally:
        server.shutdown()


# ---------------------------------------------------------------- one read
def test_one_read_of_a_serving_host(host_root):
    server, port = serve_http({"/metrics": (200, METRICS)})
    unit = host_root / "etc/systemd/system/kunlun-serve.service"
    args = dict(PINS["kunlun_stack_serving"], port=port)
    unit.write_text(render_serve_unit(kunlun_stack_serving_effective=args))
    module = FakeModule({**systemctl_show(), **docker(container=(CURRENT, "running"))})
    try:
        found = host_status.read(
            module,
            params(host_root),
            os_release=str(host_root / "etc/os-release"),
            mountinfo=str(host_root / "proc/mountinfo"),
            uptime=str(host_root / "proc/uptime"),
        )
    finally:
        server.shutdown()
    assert set(found) == {"os", "volume", "driver", "service", "image", "serving"}
    assert found["os"]["pretty_name"] == "Debian GNU/Linux 12 (bookworm)"
    assert found["volume"]["fstype"] == "xfs" and found["volume"]["source"] == "/dev/mapper/data-home"
    assert found["driver"]["devices_ok"] == 8 and found["service"]["active"] == "active"
    assert found["image"]["state"] == "current"
    assert found["image"]["stack"] == "0.15.1-4885de2"
    assert found["serving"] == {
        "model": MODEL,
        "port": port,
        "worker_url": "http://10.20.1.11:8000",
        "requests_running": 5,
        "requests_waiting": 1,
        "error": "",
        "held_out": None,
    }
    # Held out by the driver stage's rolling pass: its reason, first line, is the host's.
    (host_root / "etc/kunlun-serve").mkdir(parents=True, exist_ok=True)
    (host_root / "etc/kunlun-serve/held-out").write_text("2026-12-04T23:40:00Z driver rolling pass: card 3 in error\n")
    assert host_status.read_held_out(str(host_root / "etc/kunlun-serve")) == (
        "2026-12-04T23:40:00Z driver rolling pass: card 3 in error"
    )
    # Read-only: systemctl show, docker images, docker container and image inspect, nothing else.
    assert {tuple(c[2:4]) if c[0].endswith("timeout") else tuple(c[:2]) for c in module.calls} == {
        ("/usr/bin/systemctl", "show"),
        ("/usr/bin/docker", "images"),
        ("/usr/bin/docker", "container"),
        ("/usr/bin/docker", "image"),
    }
    assert all("inspect" in c or "images" in c or "show" in c for c in module.calls)


def test_one_read_of_a_bare_host(tmp_path):
    """Nothing deployed: every section says what it lacks, nothing raises."""
    module = FakeModule({}, bins=())
    found = host_status.read(
        module,
        params(tmp_path),
        os_release=str(tmp_path / "os-release"),
        mountinfo=str(tmp_path / "mountinfo"),
        uptime=str(tmp_path / "uptime"),
    )
    assert found["driver"]["state"] == "absent" and found["driver"]["error"].startswith("no driver facts")
    assert found["service"]["error"] == "unreadable: no systemctl on the host"
    assert found["image"]["state"] == "unknown" and found["os"]["error"].startswith("unreadable:")
    assert found["serving"]["requests_running"] is None
    assert "requests not read: kunlun-serve.service is unknown" in found["serving"]["error"]


def test_a_reader_that_breaks_is_a_value_not_a_failure(host_root, monkeypatch):
    def boom(*args, **kwargs):
        raise RuntimeError("the unexpected")

    monkeypatch.setattr(host_status, "read_driver", boom)
    found = host_status.read(
        FakeModule(systemctl_show()),
        params(host_root),
        os_release=str(host_root / "x"),
        mountinfo=str(host_root / "proc/mountinfo"),
        uptime=str(host_root / "proc/uptime"),
    )
    assert found["driver"]["error"] == "unreadable: the unexpected" and found["driver"]["state"] == "unreadable"


@pytest.mark.parametrize(
    "over, problem",
    [
        ({"service": "kunlun serve"}, "service 'kunlun serve' is not a unit name"),
        ({"image": ""}, "image '' is not an image reference"),
        ({"expected_devices": 0}, "expected_devices must be 1 or more"),
        ({"port": 70000}, "port must be 1 to 65535"),
        ({"metrics_timeout": 0}, "metrics_timeout and command_timeout must be above 0"),
    ],
)
def test_bad_parameters_are_the_only_failures(tmp_path, over, problem):
    assert host_status.check_params(params(tmp_path)) == []
    assert any(p.startswith(problem) for p in host_status.check_params(params(tmp_path, **over)))


def test_the_documentation_matches_the_argument_spec(monkeypatch):
    documented_spec(monkeypatch, host_status)
    assert set(yaml.safe_load(host_status.RETURN)) == {"os", "volume", "driver", "service", "image", "serving"}
    assert yaml.safe_load(host_status.EXAMPLES)


# ---------------------------------------------------------------- the run's events -> the document
def ok_result(active="active", image_state="current", devices_ok=8, worker="http://10.0.0.1:8000", low=()):
    return {
        "os": {"pretty_name": "Debian GNU/Linux 12 (bookworm)", "kernel": "6.1.0-25-amd64", "error": ""},
        "volume": {
            "mount_point": "/home",
            "mounted": True,
            "source": "/dev/mapper/data-home",
            "fstype": "xfs",
            "size_bytes": 15393162788864,
            "free_bytes": 14983105024000,
            "free_pct": 97.3,
            "error": "",
        },
        "driver": {
            "state": "present",
            "version": "5.0.21.26",
            "devices": 8,
            "devices_ok": devices_ok,
            "expected": 8,
            "bad_devices": list(range(devices_ok, 8)),
            "low_power": list(low),
            "power_ok": not low,
            "error": "",
        },
        "service": {
            "unit": "kunlun-serve.service",
            "active": active,
            "sub": "running" if active == "active" else "dead",
            "since": "Tue 2026-12-01 06:12:03 UTC",
            "active_for_s": 93784.0 if active == "active" else None,
            "error": "",
        },
        "image": {
            "ref": "kunlun-serving:current",
            "state": image_state,
            "current_id": CURRENT,
            "runs_id": CURRENT if image_state == "current" else PREVIOUS,
            "runs_tags": ["current"] if image_state == "current" else ["previous"],
            "error": "",
        },
        "serving": {
            "model": MODEL,
            "port": 8000,
            "worker_url": worker,
            "requests_running": 3 if active == "active" else None,
            "requests_waiting": 0 if active == "active" else None,
            "error": "",
        },
        "changed": False,
    }


def event(kind, host, action, res, **data):
    return {"event": kind, "event_data": dict(data, host=host, task_action=action, res=res)}


def gateway_events(workers, configured=None, answering=True, gw="gw-1"):
    item = {"status_gateway": gw, "status": 200 if answering else -1, "changed": False}
    if answering:
        item["json"] = {"urls": workers}
    else:
        item["msg"] = "Status code was -1 and not [200]: Request failed: <urlopen error [Errno 111] Connection refused>"
    unit = {
        "status_gateway": gw,
        "content": base64.b64encode(render_gateway_unit(configured or []).encode()).decode(),
        "encoding": "base64",
    }
    return [
        event("runner_on_ok", "kf-node-1", "ansible.builtin.uri", {"results": [item]}),
        event("runner_on_ok", "kf-node-1", "ansible.builtin.slurp", {"results": [unit]}),
    ]


def state_of(events):
    state = status.new_state()
    for e in events:
        status.collect(state, e)
    return state


def fleet_events(results, gateway=None):
    events = [event("runner_on_start", h, "host_status", None) for h in results]
    for host, res in results.items():
        if res == "unreachable":
            events.append(
                event(
                    "runner_on_unreachable",
                    host,
                    "host_status",
                    {"unreachable": True, "msg": "Failed to connect to the host via ssh: refused"},
                )
            )
        elif isinstance(res, str):
            events.append(event("runner_on_failed", host, "host_status", {"failed": True, "msg": res}))
        else:
            events.append(event("runner_on_ok", host, "host_status", res))
    return events + (gateway if gateway is not None else [])


W = {"kf-node-%d" % i: "http://10.0.0.%d:8000" % i for i in (1, 2, 3, 10)}


def test_all_healthy():
    results = {h: ok_result(worker=W[h]) for h in ("kf-node-10", "kf-node-2", "kf-node-1")}
    doc = status.document(state_of(fleet_events(results, gateway_events(list(W.values()), list(W.values())))))
    assert [r["host"] for r in doc["hosts"]] == ["kf-node-1", "kf-node-2", "kf-node-10"]
    assert doc["healthy"] is True and doc["exit_code"] == 0
    assert all(r["gateway"]["state"] == "in" and r["reasons"] == [] for r in doc["hosts"])


def test_each_rule_names_its_reason():
    results = {
        "kf-node-1": ok_result(active="inactive", worker=W["kf-node-1"]),
        "kf-node-2": ok_result(image_state="stale", worker=W["kf-node-2"]),
        "kf-node-3": ok_result(devices_ok=7, worker=W["kf-node-3"]),
        "kf-node-10": ok_result(worker=W["kf-node-10"], low=(5,)),
    }
    # kf-node-3 drained (configured, not listed); kf-node-1 still listed.
    listed = [W["kf-node-1"], W["kf-node-2"], W["kf-node-10"]]
    doc = status.document(state_of(fleet_events(results, gateway_events(listed, list(W.values())))))
    rows = {r["host"]: r for r in doc["hosts"]}
    assert rows["kf-node-1"]["reasons"] == ["kunlun-serve.service is inactive"]
    assert rows["kf-node-2"]["reasons"] == [
        "image stale: runs %s (previous), kunlun-serving:current is %s" % ("41ab" * 3, "9f1c" * 3)
    ]
    assert rows["kf-node-3"]["reasons"] == [
        "accelerators 7/8 ok (not ok: 7)",
        "not in the gateway: drained (taken out with remove_worker) on gw-1",
    ]
    assert rows["kf-node-10"]["healthy"] and rows["kf-node-10"]["warnings"] == ["cards below full power: 5"]
    assert doc["healthy"] is False and doc["exit_code"] == 2


def test_a_host_held_out_by_the_driver_pass_is_unhealthy_with_its_reason():
    held = ok_result(active="inactive", worker=W["kf-node-2"])
    held["serving"]["held_out"] = "2026-12-04T23:40:00Z driver rolling pass to XRE 5.0.21.27: xpu 3 ERR!"
    results = {"kf-node-1": ok_result(worker=W["kf-node-1"]), "kf-node-2": held}
    listed = [W["kf-node-1"]]
    doc = status.document(state_of(fleet_events(results, gateway_events(listed, [W["kf-node-1"], W["kf-node-2"]]))))
    rows = {r["host"]: r for r in doc["hosts"]}
    assert rows["kf-node-1"]["healthy"]
    assert rows["kf-node-2"]["reasons"][:2] == [
        "kunlun-serve.service is inactive",
        "held out of service: 2026-12-04T23:40:00Z driver rolling pass to XRE 5.0.21.27: xpu 3 ERR!",
    ]
    assert doc["exit_code"] == 2


def test_unreachable_wins_the_exit_code_and_a_failed_read_is_unhealthy():
    results = {
        "kf-node-1": ok_result(worker=W["kf-node-1"]),
        "kf-node-2": "unreachable",
        "kf-node-3": "host_status: port must be 1 to 65535, got 0",
    }
    doc = status.document(state_of(fleet_events(results, gateway_events([W["kf-node-1"]], [W["kf-node-1"]]))))
    rows = {r["host"]: r for r in doc["hosts"]}
    assert rows["kf-node-2"]["reachable"] is False
    assert rows["kf-node-2"]["reasons"] == ["unreachable: Failed to connect to the host via ssh: refused"]
    assert rows["kf-node-3"]["reachable"] is True
    assert rows["kf-node-3"]["reasons"] == ["state not read: host_status: port must be 1 to 65535, got 0"]
    assert doc["exit_code"] == 4


def test_a_data_volume_not_mounted_is_unhealthy_and_says_which_line():
    """A host whose data disk failed at boot: up and reachable (nofail), nothing mounted at
    /home, so nothing serves; the first reason names the fstab line and where to look."""
    res = ok_result(active="inactive", worker=W["kf-node-1"])
    line = "UUID=0b9c /home xfs defaults,nofail,x-systemd.device-timeout=90s 0 0"
    res["volume"] = dict(res["volume"], mounted=False, source=None, fstype=None, fstab=line, mount_unit="home.mount")
    # What statvfs read is the root disk's: its free space is no warning about the volume.
    res["volume"].update(error="nothing mounted at /home: ...", free_pct=3.0)
    row = status.build_row("kf-node-1", state_of(fleet_events({"kf-node-1": res})), {}, None)
    assert row["reasons"] == [
        "data volume not mounted at /home (fstab: %s): its device did not appear at boot, a data disk failed or "
        "missing? Check pvs, lvs -a -o +devices, journalctl -b -u home.mount" % line,
        "kunlun-serve.service is inactive",
    ]
    assert row["warnings"] == [], "said once, as the reason"
    assert status.cells(row)[3].startswith("(no mount) ")
    # No fstab line: the storage stage has not run there.
    res["volume"].update(fstab=None)
    row = status.build_row("kf-node-1", state_of(fleet_events({"kf-node-1": res})), {}, None)
    assert (
        row["reasons"][0]
        == "data volume not mounted at /home and no fstab line for it (the storage stage has not run here)"
    )
    # A read that failed is not a missing volume: a warning, as before.
    res["volume"].update(error="unreadable: Permission denied (/proc/self/mountinfo)", free_pct=97.3)
    row = status.build_row("kf-node-1", state_of(fleet_events({"kf-node-1": res})), {}, None)
    assert row["reasons"] == ["kunlun-serve.service is inactive"]
    assert row["warnings"] == ["/home: unreadable: Permission denied (/proc/self/mountinfo)"]


def test_no_driver_facts_is_unhealthy():
    res = ok_result(worker=W["kf-node-1"])
    res["driver"] = {"state": "absent", "error": "no driver facts (/etc/ansible/facts.d/xpu.fact is missing: ...)"}
    row = status.build_row("kf-node-1", state_of(fleet_events({"kf-node-1": res})), {}, None)
    assert row["reasons"] == ["no driver facts (/etc/ansible/facts.d/xpu.fact is missing: ...)"]


@pytest.mark.parametrize(
    "gateway, has_gateway, reason",
    [
        ({"state": "in"}, True, None),
        ({"state": "n/a"}, False, None),
        ({"state": "absent", "detail": "not listed on gw-1"}, True, "not in the gateway: not listed on gw-1"),
        ({"state": "absent", "detail": "not listed on gw-1"}, False, None),
        (
            {"state": "unknown", "detail": "gateway gw-1 not answering"},
            True,
            "not in the gateway: gateway gw-1 not answering",
        ),
    ],
)
def test_the_gateway_rule(gateway, has_gateway, reason):
    row = dict(ok_result(), host="h", reachable=True, error=None, gateway=gateway)
    assert status.health(row, has_gateway) == ([reason] if reason else [])


def test_gateway_states():
    gws = {
        "gw-1": {"answering": True, "workers": ["http://a:1"], "configured": ["http://a:1", "http://b:1"], "error": ""},
        "gw-2": {"answering": True, "workers": ["http://a:1", "http://b:1"], "configured": None, "error": ""},
    }
    assert status.gateway_state("http://a:1", gws)["state"] == "in"
    b = status.gateway_state("http://b:1", gws)
    assert b["state"] == "drained" and b["per_gateway"] == {"gw-1": "drained", "gw-2": "in"}
    assert b["detail"] == "drained (taken out with remove_worker) on gw-1"
    c = status.gateway_state("http://c:1", gws)
    assert c["state"] == "absent" and c["detail"] == "not listed on gw-1; not listed on gw-2"
    gws["gw-2"] = {"answering": False, "workers": None, "configured": None, "error": "not answering (HTTP 502)"}
    assert status.gateway_state("http://a:1", gws)["detail"] == "gateway gw-2 not answering (HTTP 502)"
    assert status.gateway_state("http://a:1", {})["state"] == "n/a"
    assert status.gateway_state("http://a:1", None)["state"] == "unknown"


def test_gateways_from_the_tasks():
    events = gateway_events([W["kf-node-1"]], [W["kf-node-1"], W["kf-node-2"]])
    view = status.gateways_view(*[state_of(events)[k] for k in ("lists", "units")])
    assert view == {
        "gw-1": {
            "answering": True,
            "workers": [W["kf-node-1"]],
            "configured": [W["kf-node-1"], W["kf-node-2"]],
            "error": "",
        }
    }
    view = status.gateways_view(*[state_of(gateway_events([], answering=False))[k] for k in ("lists", "units")])
    assert view["gw-1"]["error"] == "not answering ([Errno 111] Connection refused)"
    skipped = state_of(
        [event("runner_on_skipped", "kf-node-1", "ansible.builtin.uri", {"skipped_reason": "No items in the list"})]
    )
    assert skipped["lists"] == [] and status.gateways_view(skipped["lists"], None) == {}
    unreachable = {"status_gateway": "gw-1", "unreachable": True, "msg": "Failed to connect"}
    view = status.gateways_view([unreachable], [])
    assert view["gw-1"]["error"] == "unreachable: Failed to connect"


def test_messages_in_one_line():
    mitogen = {
        "msg": "Task failed: EOF on stream; last 100 lines received:\n"
        "ssh: connect to host 127.0.0.1 port 1: Connection refused"
    }
    assert status._message(mitogen) == "ssh: connect to host 127.0.0.1 port 1: Connection refused"
    assert status._message({"msg": "a\nb"}) == "a b" and status._message({}) == "no message"
    assert status._message({"msg": "x" * 400}).endswith("x ...")


def test_gateway_unit_worker_urls():
    urls = ["http://10.0.0.1:8000", "http://10.0.0.2:8000"]
    assert status.unit_worker_urls(render_gateway_unit(urls)) == urls
    assert status.unit_worker_urls("[Service]\nExecStart=/bin/true\n") is None


def test_acceptance_figure_read_on_the_controller(tmp_path):
    path = tmp_path / "acceptance.json"
    path.write_text(
        json.dumps(
            {
                "target_single_stream_tok_s": 30.0,
                "hosts": {"kf-node-1": {"tokens_per_s": 41.23, "ttft_s": 0.2}, "kf-node-2": {"tokens_per_s": 12.0}},
            }
        )
    )
    acceptance = status.read_acceptance(str(path))
    one = status.acceptance_of("kf-node-1", acceptance)
    assert one["tokens_per_s"] == 41.23 and one["pass"] is True and one["file"] == str(path)
    assert status.acceptance_of("kf-node-2", acceptance)["pass"] is False
    assert status.acceptance_of("kf-node-9", acceptance) is None
    assert status.read_acceptance(str(tmp_path / "none.json")) is None


# ---------------------------------------------------------------- rendering
def sample_doc():
    results = {
        "kf-node-1": ok_result(worker=W["kf-node-1"]),
        "kf-node-2": ok_result(active="failed", worker=W["kf-node-2"]),
        "kf-node-3": "unreachable",
    }
    acceptance = {
        "hosts": {"kf-node-1": {"tokens_per_s": 41.2}},
        "target": 30,
        "file": "reports/acceptance.json",
        "measured_at": "2026-12-01T09:30:00+00:00",
    }
    doc = status.document(
        state_of(fleet_events(results, gateway_events(list(W.values()), list(W.values())))), acceptance
    )
    doc["report"] = "reports/runs/20261201T100000Z-status/summary.md"
    return doc


def test_the_table():
    text = status.render_table(sample_doc())
    lines = text.splitlines()
    assert lines[0].split() == [
        "host",
        "reachable",
        "OS",
        "/home",
        "driver",
        "devices",
        "power",
        "image",
        "stack",
        "service",
        "model",
        "gateway",
        "run/wait",
        "last",
        "figure",
        "health",
    ]
    one = next(line for line in lines if line.startswith("kf-node-1 "))
    for cell in (
        "yes",
        "Debian 12 (bookworm) 6.1.0-25-amd64",
        "xfs 14.0T 97% free",
        "5.0.21.26",
        "8/8",
        " ok ",
        "current",
        "active 1d2h",
        MODEL,
        " in ",
        "3/0",
        "41.2 tok/s",
    ):
        assert cell in one, (cell, one)
    assert one.endswith("  ok")
    two = next(line for line in lines if line.startswith("kf-node-2 "))
    assert two.endswith("UNHEALTHY: kunlun-serve.service is failed") and " failed " in two
    three = next(line for line in lines if line.startswith("kf-node-3 "))
    assert " NO " in three and three.endswith("UNHEALTHY: unreachable: Failed to connect to the host via ssh: refused")
    assert "3 host(s): 1 healthy, 1 unhealthy, 1 unreachable (exit 4)" in text
    assert "gateway gw-1: 4 worker(s) listed" in text
    assert "last figure: single-stream tok/s from reports/acceptance.json (2026-12-01T09:30:00+00:00)" in text
    assert "report: reports/runs/20261201T100000Z-status/summary.md" in text


def test_the_json_document():
    doc = json.loads(status.render_json(sample_doc()))
    assert doc["healthy"] is False and doc["exit_code"] == 4 and len(doc["hosts"]) == 3
    row = doc["hosts"][0]
    assert row["host"] == "kf-node-1" and row["healthy"] is True and row["acceptance"]["tokens_per_s"] == 41.2
    assert {
        "reachable",
        "os",
        "volume",
        "driver",
        "service",
        "image",
        "serving",
        "gateway",
        "reasons",
        "warnings",
    } <= set(row)


def test_human_sizes_and_ages():
    assert status.human_bytes(15393162788864) == "14.0T" and status.human_bytes(512) == "512B"
    assert status.human_age(93784) == "1d2h" and status.human_age(3700) == "1h01m" and status.human_age(59) == "59s"


# ---------------------------------------------------------------- the playbook reads only
# The project's own read-only modules (never changed, check mode supported) and the two
# builtins the gateway reads use.
OWN_MODULES = ("host_status", "collect_outputs")
READ_ONLY = {*OWN_MODULES, "ansible.builtin.uri", "ansible.builtin.slurp", "ansible.builtin.find"}


def test_the_playbook_only_reads():
    plays = yaml.safe_load((ROOT / "playbooks/status.yml").read_text())
    assert [r["role"] for p in plays for r in p.get("roles", [])] == ["kunlun_stack"]
    # kunlun_stack's tasks: the stack's name checked and one set_fact, each run once (the
    # fleet's worker URLs), nothing on a host.
    stack = yaml.safe_load((ROOT / "roles/kunlun_stack/tasks/main.yml").read_text())
    assert [next(k for k in t if "." in k) for t in stack] == ["ansible.builtin.assert", "ansible.builtin.set_fact"]
    assert all(t["run_once"] is True for t in stack)
    for play in plays:
        assert play.get("gather_facts") is False
        for task in play["tasks"]:
            action = next(k for k in task if k in READ_ONLY or k.startswith("ansible.") or k in OWN_MODULES)
            assert action in READ_ONLY, task["name"]
            if action == "ansible.builtin.uri":
                assert task[action].get("method", "GET") == "GET" and task["changed_when"] is False
                # the router on the gateway host itself (the gateway role keeps it on loopback),
                # and Prometheus's alerts on the monitoring host
                assert task[action]["url"] in (
                    "http://{{ status_router }}/list_workers",
                    "http://{{ status_prometheus }}/api/v1/alerts",
                ), task[action]["url"]
                assert play["vars"]["status_router"].startswith("{{ gateway_router_host | default('127.0.0.1') }}:")
                # Prometheus listens on the monitoring host's loopback (the monitoring role's default).
                assert play["vars"]["status_prometheus"].startswith(
                    "{{ (monitoring_listen_host | default('127.0.0.1'))"
                )
            if action in ("ansible.builtin.slurp", "ansible.builtin.find"):
                assert task["changed_when"] is False
            if task["name"].startswith("Status | The watchdog's evidence"):
                # Only for a support bundle.
                assert task["when"] == "status_support | default(false) | bool", task["name"]
            if action == "collect_outputs":
                # Only with --collect (kunlun-fleet status passes status_collect=true) or for a
                # support bundle (status_support=true, which also turns its diagnostics on).
                assert task["when"] == (
                    "(status_collect | default(false) | bool) or (status_support | default(false) | bool)"
                ), task.get("when")
                assert task[action]["diagnostics"] == "{{ status_support | default(false) | bool }}"
            if action not in OWN_MODULES:
                assert task["run_once"] is True and task["failed_when"] is False and task["ignore_unreachable"]


@pytest.mark.parametrize("module", OWN_MODULES)
def test_the_module_never_changes_and_reads_no_key(module):
    source = (ROOT / "library" / (module + ".py")).read_text()
    assert "changed=False" in source and "changed=True" not in source
    # collect_outputs names --api-key only to mask it, and the key file only to say it is not read.
    allowed = ("the serving API key file", "--api-key", "(api-keys.yaml) is never read")
    for phrase in allowed:
        source = source.replace(phrase, "")
    assert "api-key" not in source
    assert "supports_check_mode=True" in source


# ---------------------------------------------------------------- kunlun-fleet status, for real on local hosts
FAKE_SYSTEMCTL = """#!/bin/sh
# systemctl show UNIT --property ...: the unit's state from $FAKE/<unit>
[ "$1" = show ] || { echo "fake systemctl: only show" >&2; exit 2; }
state=$(cat "{fake}/$2" 2>/dev/null || echo inactive)
echo "LoadState=loaded"; echo "ActiveState=$state"; echo "SubState=running"
echo "ActiveEnterTimestamp=Tue 2026-12-01 06:12:03 UTC"; echo "ActiveEnterTimestampMonotonic=1000000"
"""
FAKE_DOCKER = """#!/bin/sh
echo "$@" >> "{fake}/docker.calls"
case "$1 $2" in
  "images --no-trunc") printf 'current {current}\\nprevious {previous}\\n3e5f0a9c1d2b {current}\\n' ;;
  "container inspect")
    cat "{fake}/container-$5" 2>/dev/null || {{ echo "Error: No such container: $5" >&2; exit 1; }} ;;
  "image inspect")
    [ "$5" = {current} ] && echo 0.15.1-4885de2 || echo '<no value>' ;;
  *) echo "fake docker: not a read: $*" >&2; exit 2 ;;
esac
"""


@pytest.fixture
def local_fleet(tmp_path, monkeypatch):
    """A checkout of its own (this one's playbooks, roles, library and ansible.cfg) and an
    inventory of two local serving hosts (kf-a healthy; kf-b: its service stopped, on the
    previous image, a card in error, not in the gateway), one unreachable host (kf-far) and
    a local gateway (gw); a fake systemctl and docker on PATH and a local HTTP server for
    vLLM's /metrics and the router's /list_workers."""
    tree = tmp_path / "tree"
    tree.mkdir()
    for name in ("playbooks", "roles", "library", "module_utils", "plugins"):
        (tree / name).symlink_to(ROOT / name)
    (tree / "ansible.cfg").write_text((ROOT / "ansible.cfg").read_text())
    fake = tmp_path / "fake"
    (fake / "bin").mkdir(parents=True)
    (fake / "bin/systemctl").write_text(FAKE_SYSTEMCTL.replace("{fake}", str(fake)))
    (fake / "bin/docker").write_text(FAKE_DOCKER.format(fake=fake, current=CURRENT, previous=PREVIOUS))
    for tool in ("systemctl", "docker"):
        (fake / "bin" / tool).chmod(0o755)
    (fake / "kunlun-serve.service").write_text("active\n")
    (fake / "kunlun-serve-b.service").write_text("inactive\n")
    (fake / "container-kunlun-serve").write_text("%s running\n" % CURRENT)
    (fake / "container-kunlun-serve-b").write_text("%s exited\n" % PREVIOUS)
    (fake / "a.fact").write_text(json.dumps(facts()))
    (fake / "b.fact").write_text(json.dumps(facts(states={6: "error"})))
    # One local server is both kf-a's vLLM (/metrics) and the router (/list_workers, which
    # lists kf-a at the serving port: kf-b is not listed).
    box = {}
    workers = lambda: json.dumps({"urls": ["https://10.9.0.1:%d" % box["port"]]})  # noqa: E731
    server, port = serve_http({"/metrics": (200, METRICS), "/list_workers": (200, workers)})
    box["port"] = port
    inv = tmp_path / "inv"
    (inv / "group_vars/all").mkdir(parents=True)
    local = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable, "ansible_become": False}
    hosts = {
        "all": {
            "children": {
                "xpu_servers": {
                    "hosts": {
                        "kf-a": dict(
                            local, kunlun_stack_serving_address="10.9.0.1", driver_facts_file=str(fake / "a.fact")
                        ),
                        "kf-b": dict(
                            local,
                            kunlun_stack_serving_address="10.9.0.2",
                            driver_facts_file=str(fake / "b.fact"),
                            serve_service_name="kunlun-serve-b",
                        ),
                        "kf-far": dead_host(),
                    }
                },
                "gateways": {"hosts": {"gw": local}},
            }
        }
    }
    (inv / "hosts.yml").write_text(yaml.safe_dump(hosts))
    # The engine watchdog's state directory of the local gateway: empty (no watchdog) unless a test writes it.
    (tmp_path / "watchdog").mkdir()
    (inv / "group_vars/all/serving.yml").write_text(
        yaml.safe_dump(
            {
                "kunlun_stack_serving": dict(PINS["kunlun_stack_serving"], port=port),
                "gateway_router_port": port,
                "gateway_watchdog_state_dir": str(tmp_path / "watchdog"),
                # The data volume: a mount point this machine has (its /home may be no mount).
                "storage_mount_point": "/",
            }
        )
    )
    monkeypatch.setenv("PATH", "%s:%s" % (fake / "bin", os.environ["PATH"]))
    monkeypatch.delenv("ANSIBLE_VAULT_PASSWORD_FILE", raising=False)
    (tree / "reports").mkdir()
    (tree / "reports/acceptance.json").write_text(
        json.dumps({"target_single_stream_tok_s": 30, "hosts": {"kf-a": {"tokens_per_s": 41.2}}})
    )
    yield {"tree": tree, "inv": str(inv), "fake": fake, "port": port, "watchdog": tmp_path / "watchdog"}
    server.shutdown()


def run_status(fleet, *args):
    out = io.StringIO()
    code = status.run(fleet["inv"], *args, out=out, base=fleet["tree"])
    return code, out.getvalue()


def summary_of_last_run(fleet):
    runs = sorted((fleet["tree"] / "reports" / "runs").iterdir())
    return json.loads((runs[-1] / "summary.json").read_text())


# A healthy fleet's exit 0, end to end: tests/status/test_status_sim.py (the served sim
# fleet) and test_all_healthy above; the healthy host's row and the read-only run: the
# table of the run below (kf-a beside kf-b), one status run less (about 3 CPU-s).


def test_status_on_local_hosts_unhealthy_and_unreachable(local_fleet):
    code, text = run_status(local_fleet, None, True)
    doc = json.loads(text)
    rows = {r["host"]: r for r in doc["hosts"]}
    assert code == 4 and doc["exit_code"] == 4 and doc["healthy"] is False
    assert rows["kf-a"]["healthy"] is True, rows["kf-a"]["reasons"]
    assert rows["kf-b"]["reasons"] == [
        "kunlun-serve-b.service is inactive",
        "image stale: runs %s (previous), kunlun-serving:current is %s" % ("41ab" * 3, "9f1c" * 3),
        "accelerators 7/8 ok (not ok: 6)",
        "not in the gateway: not listed on gw",
    ]
    assert rows["kf-far"]["reachable"] is False and rows["kf-far"]["reasons"][0].startswith("unreachable: ")
    assert doc["gateways"]["gw"]["answering"] is True
    summary = summary_of_last_run(local_fleet)
    assert all(c["changed"] == 0 for c in summary["hosts"].values()), summary["hosts"]
    # Without the unreachable host: unhealthy, exit 2.
    code, text = run_status(local_fleet, "kf-a,kf-b")
    assert code == 2 and "kf-b " in text and "UNHEALTHY: kunlun-serve-b.service is inactive" in text
    # The healthy host's row in the table, and a run in check mode that changed nothing.
    summary = summary_of_last_run(local_fleet)
    assert summary["check_mode"] is True and summary["command"] == "status"
    assert {h: c["changed"] for h, c in summary["hosts"].items()} == {"kf-a": 0, "kf-b": 0}, summary["hosts"]
    row = next(line for line in text.splitlines() if line.startswith("kf-a "))
    for cell in ("5.0.21.26", "8/8", "current", " 0.15.1-4885de2 ", "active", " in ", "5/1", "41.2 tok/s"):
        assert cell in row, (cell, row)
    assert row.endswith("  ok")
    # Only reads reached docker.
    calls = (local_fleet["fake"] / "docker.calls").read_text().splitlines()
    assert calls and all(
        c.split()[:2] in (["images", "--no-trunc"], ["container", "inspect"], ["image", "inspect"]) for c in calls
    )


def test_status_cli_refuses_a_missing_inventory_and_extra_arguments(tmp_path, capsys):
    assert cli.main(["status", "-i", str(tmp_path / "none")]) == runner.REFUSED
    assert "no inventory" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        cli.main(["status", "-i", str(tmp_path), "--check"])
    assert exc.value.code == runner.REFUSED


# ---------------------------------------------------------------- the alerts
def alerts_events(alerts, answering=True, monitor="kf-node-1"):
    item = {"status_monitor": monitor, "status": 200 if answering else -1, "changed": False}
    if answering:
        item["json"] = {"status": "success", "data": {"alerts": alerts}}
    else:
        item["msg"] = "Status code was -1 and not [200]: Request failed: <urlopen error [Errno 111] Connection refused>"
    return [
        event(
            "runner_on_ok",
            "kf-node-1",
            "ansible.builtin.uri",
            {"results": [item]},
            task=status.ALERTS_TASK + " (Prometheus on each monitoring host)",
        )
    ]


def prom_alert(name, state, host, severity="critical", device=None):
    labels = {"alertname": name, "severity": severity, "host": host, "job": "vllm"}
    if device is not None:
        labels["device"] = device
    return {
        "labels": labels,
        "annotations": {"summary": "%s on %s" % (name, host), "description": "..."},
        "state": state,
        "activeAt": "2026-12-01T17:00:00Z",
        "value": "0e+00",
    }


def test_alerts_from_the_task_are_not_taken_for_gateway_lists():
    events = gateway_events([W["kf-node-1"]]) + alerts_events(
        [
            prom_alert("KunlunXpuDeviceError", "firing", "kf-node-2", device="3"),
            prom_alert("KunlunThroughputLow", "firing", "kf-node-10", severity="warning"),
            prom_alert("KunlunServingHostDown", "firing", "kf-node-3"),
            prom_alert("KunlunKvCacheNearlyFull", "pending", "kf-node-1", severity="warning"),
        ]
    )
    state = state_of(events)
    assert [r["status_gateway"] for r in state["lists"]] == ["gw-1"]
    view = status.alerts_view(state["alerts"])
    assert view["monitors"] == {"kf-node-1": ""} and view["pending"] == 1
    # critical first, then by name and host
    assert [(a["alert"], a["host"], a["device"]) for a in view["firing"]] == [
        ("KunlunServingHostDown", "kf-node-3", ""),
        ("KunlunXpuDeviceError", "kf-node-2", "3"),
        ("KunlunThroughputLow", "kf-node-10", ""),
    ]


def test_alerts_in_the_table():
    doc = dict(
        sample_doc(),
        alerts=status.alerts_view(
            state_of(
                alerts_events(
                    [
                        prom_alert("KunlunServingHostDown", "firing", "kf-node-3"),
                        prom_alert("KunlunXpuDeviceError", "firing", "kf-node-2", device="3"),
                    ]
                )
            )["alerts"]
        ),
    )
    text = status.render_table(doc)
    assert "alerts firing: 2 (Prometheus on kf-node-1)" in text
    assert "  KunlunServingHostDown [critical] kf-node-3: KunlunServingHostDown on kf-node-3" in text
    assert "  KunlunXpuDeviceError [critical] kf-node-2 device 3: KunlunXpuDeviceError on kf-node-2" in text
    quiet = dict(sample_doc(), alerts=status.alerts_view(state_of(alerts_events([]))["alerts"]))
    assert "alerts firing: none (Prometheus on kf-node-1)" in status.render_table(quiet)
    down = dict(sample_doc(), alerts=status.alerts_view(state_of(alerts_events([], answering=False))["alerts"]))
    text = status.render_table(down)
    assert "monitoring kf-node-1: not answering ([Errno 111] Connection refused)" in text
    assert "alerts firing" not in text
    # no monitoring group: the task's loop is empty, nothing is said
    skipped = state_of(
        [
            event(
                "runner_on_skipped",
                "kf-node-1",
                "ansible.builtin.uri",
                {"skipped_reason": "No items in the list"},
                task=status.ALERTS_TASK,
            )
        ]
    )
    assert skipped["alerts"] == [] and skipped["lists"] is None
    assert "alerts" not in status.render_table(dict(sample_doc(), alerts=status.alerts_view([])))
    assert json.loads(status.render_json(doc))["alerts"]["firing"][0]["alert"] == "KunlunServingHostDown"


def test_status_with_its_gateway_and_monitoring_host_unreachable(local_fleet):
    """The gateway host and the monitoring host do not answer SSH: the status playbook's
    delegated reads (the router's list, the gateway's unit, Prometheus's alerts) fail on a
    dead connection. The run still reads the serving host and prints its document: the
    gateway is a value (not answering, the host not known to be in it), the monitor is
    named with its error, and the exit code says unhealthy, not that the run broke."""
    inv = Path(local_fleet["inv"])
    hosts = yaml.safe_load((inv / "hosts.yml").read_text())
    hosts["all"]["children"]["gateways"]["hosts"] = {"gw": dead_host()}
    hosts["all"]["children"]["monitoring"] = {"hosts": {"mon": dead_host()}}
    (inv / "hosts.yml").write_text(yaml.safe_dump(hosts))
    code, text = run_status(local_fleet, "kf-a", True)
    doc = json.loads(text)
    row = {r["host"]: r for r in doc["hosts"]}["kf-a"]
    assert code == 2 and doc["exit_code"] == 2, (code, text[-3000:])
    assert row["reachable"] and row["service"]["active"] == "active", row
    assert row["gateway"]["state"] == "unknown", row["gateway"]
    assert row["gateway"]["detail"].startswith("gateway gw unreachable: "), row["gateway"]
    assert row["reasons"] == ["not in the gateway: %s" % row["gateway"]["detail"]]
    assert doc["gateways"]["gw"]["answering"] is False, doc["gateways"]
    assert doc["alerts"]["monitors"]["mon"].startswith("unreachable: "), doc["alerts"]
    assert doc["alerts"]["firing"] == []
    summary = summary_of_last_run(local_fleet)
    assert all(c["changed"] == 0 for c in summary["hosts"].values()), summary["hosts"]


# ---------------------------------------------------------------- the engine watchdog
def watchdog_state(**workers):
    """A watchdog state.json (version 1) of the given workers {host: (state, kind, reason, hold)},
    each at W[host]."""
    entries = {}
    for host, (state, kind, reason, hold) in workers.items():
        entries[W[host]] = {
            "host": host,
            "state": state,
            "kind": kind,
            "reason": reason,
            "since": 1764866380.1,
            "evidence": "/var/lib/kunlun-watchdog/evidence/%s-20261204T170000Z.tar.gz" % host if kind else "",
            "hold": hold,
            "readmissions": [],
            "decode_tok_s": None if state == "quarantined" else 30.9,
            "fleet_decode_tok_s": 31.5,
        }
    return {"version": 1, "updated": 1764866400.5, "interval_s": 10, "workers": entries}


def watchdog_events(states):
    """The slurp of each gateway's state.json: {gateway: a state dict, text, or None (no file)}."""
    items = []
    for gw, state in states.items():
        item = {"status_gateway": gw, "changed": False}
        if state is None:
            item.update(failed=False, msg="File not found: /var/lib/kunlun-watchdog/state.json")
        else:
            text = state if isinstance(state, str) else json.dumps(state)
            item.update(content=base64.b64encode(text.encode()).decode(), encoding="base64")
        items.append(item)
    return [
        event(
            "runner_on_ok",
            "kf-node-1",
            "ansible.builtin.slurp",
            {"results": items},
            task=status.WATCHDOG_TASK + " on each gateway",
        )
    ]


STUCK = "stuck: 2 rounds with requests running (3) and vllm:generation_tokens_total not moving"
NOW = 1764866412.5  # 12 s after the state's last round


def quarantine_doc(hold=False, states=None, listed=None):
    """kf-node-2 drained from gw-1's router by the watchdog (stuck), the others serving."""
    results = {h: ok_result(worker=W[h]) for h in ("kf-node-1", "kf-node-2", "kf-node-3")}
    listed = listed if listed is not None else [W["kf-node-1"], W["kf-node-3"]]
    configured = [W["kf-node-1"], W["kf-node-2"], W["kf-node-3"]]
    state = watchdog_state(
        **{
            "kf-node-1": ("serving", "", "", False),
            "kf-node-2": ("quarantined", "stuck", STUCK, hold),
            "kf-node-3": ("serving", "", "", False),
        }
    )
    events = fleet_events(results, gateway_events(listed, configured)) + watchdog_events(states or {"gw-1": state})
    return status.document(state_of(events), now=NOW)


def test_a_quarantined_host_reads_quarantined_and_unhealthy():
    doc = quarantine_doc()
    rows = {r["host"]: r for r in doc["hosts"]}
    two = rows["kf-node-2"]
    assert two["gateway"]["state"] == "quarantined" and two["gateway"]["per_gateway"] == {"gw-1": "quarantined"}
    assert two["gateway"]["detail"] == "quarantined by the engine watchdog on gw-1"
    # One reason: the quarantine, with its kind and the watchdog's reason (not "drained").
    assert two["reasons"] == ["quarantined by the engine watchdog on gw-1 (stuck): " + STUCK]
    assert two["healthy"] is False and doc["exit_code"] == 2 and doc["healthy"] is False
    assert two["watchdog"]["state"] == "quarantined" and two["watchdog"]["kind"] == "stuck"
    assert two["watchdog"]["evidence"].endswith("/kf-node-2-20261204T170000Z.tar.gz")
    assert rows["kf-node-1"]["healthy"] and rows["kf-node-1"]["watchdog"]["state"] == "serving"
    assert rows["kf-node-1"]["watchdog"]["decode_tok_s"] == 30.9


def test_a_quarantined_host_in_the_table_and_the_json():
    doc = quarantine_doc()
    text = status.render_table(doc)
    line = next(x for x in text.splitlines() if x.startswith("kf-node-2 "))
    assert " quarantined (stuck) " in line and " drained " not in line
    assert line.endswith("UNHEALTHY: quarantined by the engine watchdog on gw-1 (stuck): " + STUCK)
    assert "3 host(s): 2 healthy, 1 unhealthy, 0 unreachable (exit 2)" in text
    assert "watchdog gw-1: 3 worker(s), quarantined: kf-node-2 (stuck); last round 2025-12-04T16:40:00+00:00" in text
    assert "is kunlun-watchdog running" not in text
    row = next(r for r in json.loads(status.render_json(doc))["hosts"] if r["host"] == "kf-node-2")
    assert row["gateway"]["state"] == "quarantined"
    assert {k: row["watchdog"][k] for k in ("state", "kind", "reason", "hold", "gateway")} == {
        "state": "quarantined",
        "kind": "stuck",
        "reason": STUCK,
        "hold": False,
        "gateway": "gw-1",
    }
    assert json.loads(status.render_json(doc))["watchdog"]["gw-1"]["state"] == "read"


def test_a_held_host_says_it_flaps_and_how_to_release_it():
    doc = quarantine_doc(hold=True)
    two = next(r for r in doc["hosts"] if r["host"] == "kf-node-2")
    assert two["reasons"] == [
        "quarantined by the engine watchdog on gw-1 (stuck): %s; held: flapping, it is not re-admitted by itself "
        "(kunlun-fleet watchdog -i INV release kf-node-2)" % STUCK
    ]
    text = status.render_table(doc)
    assert " quarantined (stuck, held) " in next(x for x in text.splitlines() if x.startswith("kf-node-2 "))
    assert "quarantined: kf-node-2 (stuck, held)" in text


def test_quarantined_even_when_the_router_still_lists_it():
    """The watchdog's state says quarantined: that gateway counts as quarantined whatever its
    list said a moment before or after."""
    doc = quarantine_doc(listed=[W["kf-node-1"], W["kf-node-2"], W["kf-node-3"]])
    two = next(r for r in doc["hosts"] if r["host"] == "kf-node-2")
    assert two["gateway"]["state"] == "quarantined" and not two["healthy"]


def test_quarantined_on_one_gateway_drained_on_another_says_both():
    results = {"kf-node-2": ok_result(worker=W["kf-node-2"])}
    gws = gateway_events([], [W["kf-node-2"]], gw="gw-1") + gateway_events([], [W["kf-node-2"]], gw="gw-2")
    # Two gateway tasks' events: each loop's result holds one gateway here; merge them.
    lists = [e for e in gws if e["event_data"]["task_action"].endswith("uri")]
    units = [e for e in gws if e["event_data"]["task_action"].endswith("slurp")]
    merged = [
        event(
            "runner_on_ok",
            "kf-node-1",
            "ansible.builtin.uri",
            {"results": [i for e in lists for i in e["event_data"]["res"]["results"]]},
        ),
        event(
            "runner_on_ok",
            "kf-node-1",
            "ansible.builtin.slurp",
            {"results": [i for e in units for i in e["event_data"]["res"]["results"]]},
        ),
    ]
    quarantined = watchdog_state(**{"kf-node-2": ("quarantined", "slow", "slow: 9.0 tok/s", False)})
    serving = watchdog_state(**{"kf-node-2": ("out", "", "", False)})
    doc = status.document(
        state_of(fleet_events(results, merged) + watchdog_events({"gw-1": quarantined, "gw-2": serving})), now=NOW
    )
    row = doc["hosts"][0]
    assert row["gateway"]["per_gateway"] == {"gw-1": "quarantined", "gw-2": "drained"}
    assert row["reasons"] == [
        "quarantined by the engine watchdog on gw-1 (slow): slow: 9.0 tok/s",
        "not in the gateway: quarantined by the engine watchdog on gw-1; "
        "drained (taken out with remove_worker) on gw-2",
    ]
    assert row["watchdog"]["per_gateway"] == {"gw-1": "quarantined", "gw-2": "out"}


@pytest.mark.parametrize(
    "states",
    [
        {"gw-1": None},  # no state file: no watchdog there
        {"gw-1": "all serving"},
    ],
)
def test_a_served_fleet_with_or_without_a_watchdog_is_healthy(states):
    results = {h: ok_result(worker=W[h]) for h in ("kf-node-1", "kf-node-2", "kf-node-3")}
    every = [W[h] for h in results]
    if states["gw-1"] == "all serving":
        states = {"gw-1": watchdog_state(**{h: ("serving", "", "", False) for h in results})}
    doc = status.document(
        state_of(fleet_events(results, gateway_events(every, every)) + watchdog_events(states)), now=NOW
    )
    assert doc["healthy"] is True and doc["exit_code"] == 0
    assert all(r["gateway"]["state"] == "in" and r["reasons"] == [] and r["warnings"] == [] for r in doc["hosts"])
    text = status.render_table(doc)
    if states["gw-1"] is None:
        assert doc["watchdog"]["gw-1"]["state"] == "absent" and "watchdog" not in text
        assert all(r["watchdog"] is None for r in doc["hosts"])
    else:
        assert "watchdog gw-1: 3 worker(s), quarantined: none; last round" in text


def test_without_the_task_or_a_gateway_nothing_is_said():
    results = {"kf-node-1": ok_result(worker=W["kf-node-1"])}
    doc = status.document(state_of(fleet_events(results, gateway_events([W["kf-node-1"]], [W["kf-node-1"]]))))
    assert doc["watchdog"] is None and doc["hosts"][0]["watchdog"] is None and doc["healthy"]
    skipped = state_of(
        [
            event(
                "runner_on_skipped",
                "kf-node-1",
                "ansible.builtin.slurp",
                {"skipped_reason": "No items in the list"},
                task=status.WATCHDOG_TASK,
            )
        ]
    )
    assert skipped["watchdog"] == [] and skipped["units"] is None
    assert status.watchdog_view([]) == {}


@pytest.mark.parametrize(
    "text, error",
    [
        ("{not json", "not JSON"),
        ("[]", "not a JSON object"),
        (json.dumps({"version": 2, "updated": 1, "workers": {}}), "version 2, kunlun-fleet reads version 1"),
        (json.dumps({"version": 1, "updated": "now", "workers": {}}), '"updated" is not a number'),
        (json.dumps({"version": 1, "updated": 1, "workers": []}), 'no "workers" object'),
        (
            json.dumps({"version": 1, "updated": 1, "workers": {"http://a:1": {"host": "a"}}}),
            'worker http://a:1 has no "state"',
        ),
    ],
)
def test_a_garbled_state_is_said_and_judges_nothing(text, error):
    results = {"kf-node-1": ok_result(worker=W["kf-node-1"])}
    events = fleet_events(results, gateway_events([W["kf-node-1"]], [W["kf-node-1"]])) + watchdog_events({"gw-1": text})
    doc = status.document(state_of(events), now=NOW)
    assert doc["watchdog"]["gw-1"]["state"] == "unreadable" and doc["watchdog"]["gw-1"]["error"].startswith(error)
    assert doc["healthy"] and doc["hosts"][0]["watchdog"] is None
    assert "watchdog gw-1: state unreadable: " + error in status.render_table(doc)


def test_an_unreadable_or_unreachable_state_file():
    view = status.watchdog_view(
        [
            {
                "status_gateway": "gw-1",
                "failed": False,
                "msg": "File is not readable: /var/lib/kunlun-watchdog/state.json",
            },
            {"status_gateway": "gw-2", "unreachable": True, "msg": "Failed to connect to the host via ssh"},
        ]
    )
    assert view["gw-1"] == dict(
        view["gw-1"], state="unreadable", error="File is not readable: /var/lib/kunlun-watchdog/state.json"
    )
    assert view["gw-2"]["state"] == "unreachable" and status.watchdog_line("gw-2", view["gw-2"]) is None


def test_a_suspect_host_is_a_warning_and_a_stale_watchdog_is_said():
    results = {h: ok_result(worker=W[h]) for h in ("kf-node-1", "kf-node-2")}
    every = [W[h] for h in results]
    state = watchdog_state(
        **{
            "kf-node-1": ("serving", "", "", False),
            "kf-node-2": ("suspect", "slow", "slow: 12.1 tok/s against 31.5", False),
        }
    )
    events = fleet_events(results, gateway_events(every, every)) + watchdog_events({"gw-1": state})
    doc = status.document(state_of(events), now=state["updated"] + 3 * 3600)
    two = next(r for r in doc["hosts"] if r["host"] == "kf-node-2")
    assert two["healthy"] and two["warnings"] == [
        "the engine watchdog on gw-1 suspects it (slow): slow: 12.1 tok/s against 31.5"
    ]
    text = status.render_table(doc)
    assert "quarantined: none, 1 suspect; last round" in text and "(3h00m ago: is kunlun-watchdog running?)" in text


def test_a_worker_is_found_by_its_host_name_when_its_url_differs():
    state = watchdog_state(**{"kf-node-2": ("quarantined", "stuck", STUCK, False)})
    state["workers"] = {"http://kf-node-2.example:8000": state["workers"][W["kf-node-2"]]}
    view = status.watchdog_view(state_of(watchdog_events({"gw-1": state}))["watchdog"], now=NOW)
    assert status.watchdog_of("kf-node-2", W["kf-node-2"], view)["state"] == "quarantined"
    assert status.watchdog_of("kf-node-1", W["kf-node-1"], view) is None


def test_the_watchdog_slurp_is_not_taken_for_the_gateways_units():
    events = gateway_events([W["kf-node-1"]], [W["kf-node-1"]]) + watchdog_events({"gw-1": None})
    state = state_of(events)
    assert [u["status_gateway"] for u in state["units"]] == ["gw-1"] and "content" in state["units"][0]
    assert [w["status_gateway"] for w in state["watchdog"]] == ["gw-1"] and "content" not in state["watchdog"][0]


def test_status_on_local_hosts_reads_the_watchdogs_state(local_fleet):
    """The local gateway's watchdog quarantined kf-a: the playbook reads its state.json (and
    a missing file elsewhere is no failure: the other local tests have none)."""
    url = "http://10.9.0.1:%d" % local_fleet["port"]
    state = {
        "version": 1,
        "updated": 1764866400.5,
        "interval_s": 10,
        "workers": {
            url: {
                "host": "kf-a",
                "state": "quarantined",
                "kind": "slow",
                "reason": "slow: 9.1 tok/s per sequence against the fleet's 31.5",
                "since": 1764866380.1,
                "evidence": "",
                "hold": True,
                "readmissions": [1764860000.0],
                "decode_tok_s": 9.1,
                "fleet_decode_tok_s": 31.5,
            }
        },
    }
    (local_fleet["watchdog"] / "state.json").write_text(json.dumps(state))
    code, text = run_status(local_fleet, "kf-a", True)
    doc = json.loads(text)
    row = doc["hosts"][0]
    assert code == 2 and doc["exit_code"] == 2, text[-3000:]
    assert row["gateway"]["state"] == "quarantined" and row["watchdog"]["hold"] is True
    assert row["reasons"] == [
        "quarantined by the engine watchdog on gw (slow): slow: 9.1 tok/s per sequence against the fleet's 31.5; "
        "held: flapping, it is not re-admitted by itself (kunlun-fleet watchdog -i INV release kf-a)"
    ]
    summary = summary_of_last_run(local_fleet)
    assert all(c["changed"] == 0 for c in summary["hosts"].values()), summary["hosts"]


def test_support_bundle_on_local_hosts_takes_the_watchdogs_files(local_fleet, tmp_path):
    """support-bundle --limit kf-a: the local gateway's state.json and its evidence archive of
    kf-a (found, read and unpacked through the status playbook), not kf-b's; read-only."""
    evidence = local_fleet["watchdog"] / "evidence"
    evidence.mkdir()
    for host in ("kf-a", "kf-b"):
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w:gz") as tar:
            data = json.dumps({"host": host, "kind": "stuck"}).encode()
            info = tarfile.TarInfo("%s-20261204T170000Z/verdict.json" % host)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        (evidence / ("%s-20261204T170000Z.tar.gz" % host)).write_bytes(buf.getvalue())
    (local_fleet["watchdog"] / "state.json").write_text(
        json.dumps({"version": 1, "updated": 1764866400.5, "interval_s": 10, "workers": {}})
    )
    out, bundle = io.StringIO(), tmp_path / "case.tar.gz"
    code = support.run(local_fleet["inv"], "kf-a", output=str(bundle), base=local_fleet["tree"], out=out)
    assert code == 0, out.getvalue()
    assert "engine watchdog: state of gw; 1 evidence archive(s)" in out.getvalue(), out.getvalue()
    with tarfile.open(bundle, "r:gz") as tar:
        members = {m.name: tar.extractfile(m).read().decode() for m in tar.getmembers() if m.isfile()}
    verdict = members["case/hosts/kf-a/watchdog/gw/kf-a-20261204T170000Z/verdict.json"]
    assert json.loads(verdict)["host"] == "kf-a"
    assert json.loads(members["case/watchdog/gw/state.json"])["version"] == 1
    assert not [name for name in members if "kf-b" in name]
    index = json.loads(members["case/watchdog/index.json"])
    assert [e["host"] for e in index["evidence"]] == ["kf-a"] and index["gateways"]["gw"]["state"] == "read"
    summary = summary_of_last_run(local_fleet)
    assert summary["command"] == "support-bundle" and all(c["changed"] == 0 for c in summary["hosts"].values())
