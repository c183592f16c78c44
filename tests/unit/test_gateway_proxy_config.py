"""The gateway's HAProxy configuration as the template module renders it (Ansible's
templar, trim_blocks): the allow-list, the router on loopback, TLS only with a certificate.
What HAProxy makes of it is tested for real by the gateway's molecule scenario (TLS, from
another host) and the e2e (plain HTTP)."""

from pathlib import Path

import yaml

from kunlun_fleet import monitoring
from kunlun_fleet.bundle import load_pins as stack_pins

ROOT = Path(__file__).resolve().parents[2]
ROLE = ROOT / "roles/gateway"


def render(**extra):
    variables = {"ansible_managed": "Ansible managed"}
    variables.update(stack_pins())
    variables.update(yaml.safe_load((ROLE / "defaults/main.yml").read_text()))
    variables.update(yaml.safe_load((ROOT / "roles/kunlun_stack/vars/main.yml").read_text()))
    variables.update(yaml.safe_load((ROLE / "vars/main.yml").read_text()))
    variables.update(monitoring.default_inventory(addresses={"kf-node-1": "10.9.0.11"}))
    variables.update(extra)
    return monitoring.render(ROLE / "templates/haproxy.cfg.j2", variables)


def lines(text):
    return [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("#")]


def test_plain_http_allow_list_and_the_router_on_loopback():
    cfg = lines(render())
    assert "bind 0.0.0.0:8080" in cfg and not any("ssl" in line for line in cfg)
    # every directive on its own line (trim_blocks must not join them)
    assert "maxconn 20000" in cfg
    assert "acl monitoring src 127.0.0.1 ::1 10.9.0.11" in cfg
    assert cfg.index("http-request deny deny_status 403 if odd_path") < cfg.index(
        "http-request deny deny_status 403 unless api or health or metrics"
    )
    assert "http-request deny deny_status 403 if metrics !monitoring" in cfg
    assert "acl api path_beg /v1/" in cfg and "acl health path /health" in cfg
    assert "server router 127.0.0.1:8081 maxconn 20000" in cfg
    assert "server router_metrics 127.0.0.1:29000" in cfg
    # long generations are not cut on the way
    assert "timeout server 3600s" in cfg and "timeout client 3600s" in cfg
    assert "option http-no-delay" in cfg


def test_tls_only_with_a_certificate_and_key():
    cfg = lines(
        render(
            gateway_tls_cert="-----BEGIN CERTIFICATE-----\nx\n-----END CERTIFICATE-----",
            gateway_tls_key="-----BEGIN PRIVATE KEY-----\nx\n-----END PRIVATE KEY-----",
            gateway_port=8443,
        )
    )
    assert "bind 0.0.0.0:8443 ssl crt /etc/haproxy/kunlun-gateway.pem alpn http/1.1" in cfg
    assert any(line.startswith("ssl-default-bind-options ssl-min-ver TLSv1.2") for line in cfg)
    # the key itself is never in the configuration, only the 0600 file's path
    assert not any("PRIVATE KEY" in line for line in cfg)


def test_metrics_sources_are_the_monitoring_hosts():
    cfg = lines(
        render(
            groups={
                "all": ["a", "b", "m"],
                "xpu_servers": ["a", "b"],
                "gateways": ["a"],
                "monitoring": ["m"],
                "ungrouped": [],
            },
            hostvars={
                "a": {"ansible_host": "10.0.0.1"},
                "b": {"ansible_host": "10.0.0.2"},
                "m": {"ansible_host": "10.0.0.9"},
            },
        )
    )
    assert "acl monitoring src 127.0.0.1 ::1 10.0.0.9" in cfg
