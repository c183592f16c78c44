"""xpu_info's driver and firmware floors (added for the driver role), on recorded outputs.

Reuses the recorded-host harness of tests/unit/test_xpu_info.py.
"""

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("unit_test_xpu_info", str(ROOT / "tests" / "unit" / "test_xpu_info.py"))
harness = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(harness)

FLOORS = {"driver_minimum": "5.0.21.26", "firmware_minimum": "1.48"}


def test_pinned_driver_and_firmware_1_54_pass(tmp_path):
    result, _ = harness.run(tmp_path, harness.host(), args=FLOORS)
    facts = result["ansible_facts"]
    assert facts["xpu_driver_at_least_minimum"] is True
    assert [d["firmware_release"] for d in facts["xpu_devices"]] == ["1.54"] * 8
    assert all(d["firmware_ok"] is True for d in facts["xpu_devices"])


def test_firmware_1_40_is_below_1_48(tmp_path):
    result, _ = harness.run(tmp_path, harness.host(query="xpu-smi-q_old_firmware.txt"), args=FLOORS)
    devices = result["ansible_facts"]["xpu_devices"]
    assert devices[0]["firmware_version"] == "1.0.2.14.1.40"
    assert devices[0]["firmware_release"] == "1.40"
    assert len(devices) == 8
    assert all(d["firmware_ok"] is False for d in devices)


def test_driver_below_floor(tmp_path):
    result, _ = harness.run(tmp_path, harness.host(), args={"driver_minimum": "5.0.21.30"})
    assert result["ansible_facts"]["xpu_driver_at_least_minimum"] is False


def test_no_driver_is_not_at_least_the_floor(tmp_path):
    result, _ = harness.run(tmp_path, {}, args=FLOORS, bins={})
    facts = result["ansible_facts"]
    assert facts["xpu_driver_version"] is None
    assert facts["xpu_driver_at_least_minimum"] is False


def test_without_floors_nothing_is_judged(tmp_path):
    result, _ = harness.run(tmp_path, harness.host())
    facts = result["ansible_facts"]
    assert facts["xpu_driver_at_least_minimum"] is None
    assert all(d["firmware_ok"] is None for d in facts["xpu_devices"])
    assert facts["xpu_devices"][0]["firmware_release"] == "1.54"
