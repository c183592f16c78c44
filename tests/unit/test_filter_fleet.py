"""plugins/filter/fleet.py: the effective configuration's addresses, URLs and merges."""

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("filter_fleet", ROOT / "plugins/filter/fleet.py")
fleet = importlib.util.module_from_spec(spec)
spec.loader.exec_module(fleet)


def test_serving_address_then_ansible_host_then_the_name():
    hostvars = {
        "a": {"ansible_host": "gw-a.mgmt", "kunlun_stack_serving_address": "10.20.1.11"},
        "b": {"ansible_host": "10.20.1.12", "kunlun_stack_serving_address": ""},
        "c": {},
    }
    addresses = fleet.fleet_serving_addresses(["a", "b", "c"], hostvars)
    assert addresses == {"a": "10.20.1.11", "b": "10.20.1.12", "c": "c"}
    assert fleet.fleet_worker_urls(addresses, 8000) == {
        "a": "http://10.20.1.11:8000",
        "b": "http://10.20.1.12:8000",
        "c": "http://c:8000",
    }


def test_worker_urls_in_the_workers_scheme():
    addresses = {"a": "10.20.1.11", "b": "p800-a02.serving"}
    assert fleet.fleet_worker_urls(addresses, 8000, "https") == {
        "a": "https://10.20.1.11:8000",
        "b": "https://p800-a02.serving:8000",
    }
    with pytest.raises(ValueError, match="the scheme is 'ftp'; it must be http or https"):
        fleet.fleet_worker_urls(addresses, 8000, "ftp")


def test_certificate_names_ip_or_dns_each_once():
    # A serving host's: its address, then loopback for its own checks.
    assert fleet.fleet_cert_sans(["10.20.1.11", "127.0.0.1", "localhost"]) == [
        "IP:10.20.1.11",
        "IP:127.0.0.1",
        "DNS:localhost",
    ]
    assert fleet.fleet_cert_sans("p800-a01.serving.example") == ["DNS:p800-a01.serving.example"]
    # IPv6, bracketed or not, in its canonical form; a name given twice once.
    assert fleet.fleet_cert_sans(["[fd00::0011]", "fd00::11", "localhost", "localhost"]) == [
        "IP:fd00::11",
        "DNS:localhost",
    ]
    # Not an address: a DNS name (the registry's old rule took 10.0.0 for an IP).
    assert fleet.fleet_cert_sans("10.0.0") == ["DNS:10.0.0"]
    with pytest.raises(ValueError, match="an empty address"):
        fleet.fleet_cert_sans(["10.0.0.1", " "])


def test_the_endpoint_is_the_first_gateway_or_nothing():
    addresses = {"gw1": "10.0.0.1", "gw2": "10.0.0.2"}
    assert fleet.fleet_endpoint_url(["gw1", "gw2"], addresses, 8080) == "http://10.0.0.1:8080"
    assert fleet.fleet_endpoint_url(["gw2"], addresses, 8443, "https") == "https://10.0.0.2:8443"
    assert fleet.fleet_endpoint_url([], addresses, 8080) == ""
    with pytest.raises(ValueError, match="gw3 has no serving address"):
        fleet.fleet_endpoint_url(["gw3"], addresses, 8080)


def test_env_overrides_add_change_and_remove():
    base = {"A": "1", "B": "2"}
    assert fleet.fleet_env_merge(base, {"B": "3", "C": "4", "A": None}) == {"B": "3", "C": "4"}
    assert fleet.fleet_env_merge(base, {}) == base and base == {"A": "1", "B": "2"}


def test_bundle_files_by_pin_key():
    index = {
        "format": 1,
        "artifacts": {"driver": {"path": "drivers/x.run", "version": "5"}, "vllm": {"path": "w/v.whl"}},
    }
    assert fleet.fleet_bundle_files(index) == {"driver": "drivers/x.run", "vllm": "w/v.whl"}
    assert fleet.fleet_bundle_files({}) == {} and fleet.fleet_bundle_files(None) == {}
