"""The certificates of the fleet CA are issued again when they near their end - the fleet
registry's (roles/image/tasks/registry_pki.yml) and every serving host's
(roles/serve/tasks/tls.yml), after the CA itself (roles/kunlun_stack/tasks/fleet_ca.yml) -
run for real by ansible-playbook on this machine with community.crypto: a certificate with
fewer than the renewal margin's days left is re-issued by the next run, one far from its
end is left alone, and the CA stays."""

import json
import os
import ssl
import subprocess
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DAY = 86400

pytestmark = pytest.mark.skipif(
    not (ROOT / ".venv" / "bin" / "ansible-playbook").exists(), reason="no .venv/bin/ansible-playbook"
)

PLAY = """
- name: The fleet CA, then the registry's and the serving hosts' certificates (on the controller)
  hosts: localhost
  gather_facts: false
  tasks:
    - name: Fleet CA
      ansible.builtin.import_tasks: {ca}
    - name: Registry PKI
      ansible.builtin.import_tasks: {registry}
    - name: Serving TLS
      ansible.builtin.import_tasks: {serving}
"""


def run(tmp_path, cert_days):
    play = tmp_path / "play.yml"
    play.write_text(
        PLAY.format(
            ca=ROOT / "roles" / "kunlun_stack" / "tasks" / "fleet_ca.yml",
            registry=ROOT / "roles" / "image" / "tasks" / "registry_pki.yml",
            serving=ROOT / "roles" / "serve" / "tasks" / "tls.yml",
        )
    )
    extra = {
        "kunlun_stack_fleet_pki_dir": str(tmp_path / "pki"),
        "serve_tls_hosts": ["p800-a01"],
        "kunlun_stack_serving_addresses": {"p800-a01": "10.0.0.11"},
        "kunlun_stack_fleet_cert_days": cert_days,
        "kunlun_stack_fleet_cert_renew_days": 30,
        "image_fleet_registry_clients": ["p800-a01"],
        "image_fleet_registry_address": "10.0.0.1",
        "image_fleet_registry_san": "IP:10.0.0.1",
        "image_fleet_registry_cert_days": cert_days,
        "image_fleet_registry_cert_renew_days": 30,
    }
    proc = subprocess.run(
        [str(ROOT / ".venv" / "bin" / "ansible-playbook"), "-i", "localhost,", "-c", "local", str(play)]
        + ["-e", json.dumps(extra)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        # ansible.cfg's strategy (mitogen_linear), as the roles run: about 3 CPU-s a run here,
        # 9 under linear, which spawned a Python per task. The bytecode where tests/conftest.py
        # keeps it (not beside plugins/strategy/mitogen_linear.py).
        env={
            "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
            "PATH": "/usr/bin:/bin",
            "PYTHONPYCACHEPREFIX": os.environ["PYTHONPYCACHEPREFIX"],
        },
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    return proc.stdout


def cert(tmp_path, name):
    """(serial, seconds left) of an issued certificate."""
    out = subprocess.run(
        ["openssl", "x509", "-noout", "-serial", "-enddate", "-in", str(tmp_path / "pki" / (name + ".crt"))],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    fields = dict(line.split("=", 1) for line in out.strip().splitlines())
    return fields["serial"], ssl.cert_time_to_seconds(fields["notAfter"]) - time.time()


def test_a_certificate_near_its_end_is_issued_again_and_one_far_from_it_is_not(tmp_path):
    run(tmp_path, 10)
    first = {name: cert(tmp_path, name) for name in ("ca", "registry", "client-p800-a01", "serving-p800-a01")}
    assert all(abs(first[name][1] - 10 * DAY) < DAY for name in ("registry", "client-p800-a01", "serving-p800-a01"))

    # 10 days left < 30: both issued again, for the validity asked now; the CA untouched.
    out = run(tmp_path, 825)
    second = {name: cert(tmp_path, name) for name in ("ca", "registry", "client-p800-a01", "serving-p800-a01")}
    for name in ("registry", "client-p800-a01", "serving-p800-a01"):
        assert second[name][0] != first[name][0], name
        assert abs(second[name][1] - 825 * DAY) < DAY, name
        assert "%s (renewed: ends" % name in out, out[-3000:]
    assert second["ca"][0] == first["ca"][0]

    # A serving host's names: its serving address, and loopback for its own checks.
    sans = subprocess.run(
        ["openssl", "x509", "-noout", "-ext", "subjectAltName", "-in", str(tmp_path / "pki" / "serving-p800-a01.crt")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "IP Address:10.0.0.11, IP Address:127.0.0.1, DNS:localhost" in sans, sans
    verify = [
        "openssl",
        "verify",
        "-CAfile",
        str(tmp_path / "pki" / "ca.crt"),
        str(tmp_path / "pki" / "serving-p800-a01.crt"),
    ]
    assert subprocess.run(verify, capture_output=True, text=True).returncode == 0

    # 825 days left: nothing is issued.
    out = run(tmp_path, 825)
    third = {name: cert(tmp_path, name)[0] for name in ("ca", "registry", "client-p800-a01", "serving-p800-a01")}
    assert third == {name: value[0] for name, value in second.items()}
    assert "renewed" not in out
    assert "changed=0" in out, out[-3000:]
