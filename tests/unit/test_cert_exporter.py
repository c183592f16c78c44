"""kunlun-cert-exporter (roles/monitoring/files), run as the role installs it, against
certificates made here by the real openssl with known lifetimes: the expiry it exports is
the certificate's, a HAProxy PEM (chain then key) reads as its first certificate, an absent
file is "not in use" and a broken one is reported without stopping the others. Each output is read by the
strict exposition parser of test_xpu_exporter and by `promtool check metrics`."""

import shutil
import ssl
import subprocess
import sys
import time

import pytest

from test_xpu_exporter import FILES, parse_exposition, promtool

DAY = 86400


@pytest.fixture
def installed(tmp_path):
    lib = tmp_path / "lib"
    lib.mkdir()
    for name in ("kunlun-cert-exporter", "kunlun_textfile.py"):
        shutil.copy(FILES / name, lib / name)
    return lib


def make_cert(tmp_path, name, days):
    key, crt = tmp_path / (name + ".key"), tmp_path / (name + ".crt")
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", str(days), "-subj", "/CN=" + name]
        + ["-keyout", str(key), "-out", str(crt)],
        check=True,
        capture_output=True,
        timeout=60,
    )
    end = subprocess.run(
        ["openssl", "x509", "-noout", "-enddate", "-in", str(crt)], check=True, capture_output=True, text=True
    ).stdout.strip()
    return key, crt, ssl.cert_time_to_seconds(end.split("=", 1)[1])


def run_exporter(installed, out_dir, *certs):
    out_dir.mkdir(exist_ok=True)
    args = [sys.executable, str(installed / "kunlun-cert-exporter"), "--output-dir", str(out_dir)]
    for name, path in certs:
        args += ["--cert", "%s=%s" % (name, path)]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=60)
    text = (out_dir / "kunlun_cert.prom").read_text() if (out_dir / "kunlun_cert.prom").exists() else ""
    return proc, text


def samples(text, name):
    fams = parse_exposition(text)
    return {labels["cert"]: value for labels, value in fams.get(name, {"samples": []})["samples"]}


def test_each_certificate_exports_its_own_expiry(installed, tmp_path):
    _, soon, soon_end = make_cert(tmp_path, "gateway", 10)
    _, later, later_end = make_cert(tmp_path, "registry", 400)
    proc, text = run_exporter(installed, tmp_path / "out", ("gateway", soon), ("registry", later))
    assert proc.returncode == 0, proc.stderr
    expiry = samples(text, "kunlun_cert_not_after_timestamp_seconds")
    assert expiry == {"gateway": soon_end, "registry": later_end}, text
    # The lifetimes asked for, seen from now (a day's slack for the clock between steps).
    assert abs(expiry["gateway"] - time.time() - 10 * DAY) < DAY
    assert abs(expiry["registry"] - time.time() - 400 * DAY) < DAY
    assert samples(text, "kunlun_cert_read_ok") == {"gateway": 1, "registry": 1}
    check = subprocess.run([promtool(), "check", "metrics"], input=text, capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr


def test_haproxy_pem_chain_then_key_reads_as_the_first_certificate(installed, tmp_path):
    key, leaf, leaf_end = make_cert(tmp_path, "leaf", 30)
    _, other, _ = make_cert(tmp_path, "ca", 3650)
    pem = tmp_path / "kunlun-gateway.pem"
    pem.write_text(leaf.read_text() + other.read_text() + key.read_text())
    proc, text = run_exporter(installed, tmp_path / "out", ("gateway", pem))
    assert proc.returncode == 0, proc.stderr
    assert samples(text, "kunlun_cert_not_after_timestamp_seconds") == {"gateway": leaf_end}


def test_an_absent_file_is_not_in_use_and_a_broken_one_is_reported(installed, tmp_path):
    _, good, good_end = make_cert(tmp_path, "registry", 90)
    broken = tmp_path / "broken.pem"
    broken.write_text("-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n")
    proc, text = run_exporter(
        installed, tmp_path / "out", ("gateway", tmp_path / "absent.pem"), ("bad", broken), ("registry", good)
    )
    assert proc.returncode == 0, proc.stderr
    assert samples(text, "kunlun_cert_read_ok") == {"bad": 0, "registry": 1}
    assert samples(text, "kunlun_cert_not_after_timestamp_seconds") == {"registry": good_end}
    assert "bad" in proc.stderr and "gateway" not in proc.stderr


def test_bad_arguments_are_refused(installed, tmp_path):
    proc, _ = run_exporter(installed, tmp_path / "out", ("gateway", "relative.pem"))
    assert proc.returncode == 2 and "NAME=/absolute/path.pem" in proc.stderr


def test_an_unwritable_directory_exits_1(installed, tmp_path):
    _, crt, _ = make_cert(tmp_path, "gateway", 10)
    args = [sys.executable, str(installed / "kunlun-cert-exporter"), "--output-dir", str(tmp_path / "no" / "dir")]
    proc = subprocess.run(args + ["--cert", "gateway=%s" % crt], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "cannot write" in proc.stderr


def test_the_default_files_are_where_the_gateway_and_image_roles_put_them():
    """monitoring_cert_files falls back to literal paths when the gateway's and image's
    variables are not set in the inventory: they must be those roles' own defaults."""
    import yaml

    root = FILES.parents[2]
    load = lambda role: yaml.safe_load((root / "roles" / role / "defaults" / "main.yml").read_text())  # noqa: E731
    files = load("monitoring")["monitoring_cert_files"]
    pem = load("gateway")["gateway_proxy_pem"]
    registry_dir = load("image")["image_fleet_registry_config_dir"]
    assert "default('%s')" % pem in files["gateway"], files
    assert "default('%s')" % registry_dir in files["registry"] and files["registry"].endswith("/registry.crt"), files
    server_config = (root / "roles" / "image" / "templates" / "registry-config.yml.j2").read_text()
    assert "certificate: {{ image_fleet_registry_config_dir }}/registry.crt" in server_config
