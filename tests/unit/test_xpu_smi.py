"""Unit tests of module_utils/xpu_smi.py on recorded outputs (tests/unit/fixtures/xpu)."""

from pathlib import Path

import pytest

from ansible.module_utils import xpu_smi as x

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "xpu"


def fx(name):
    return (FIXTURES / name).read_text()


# ------------------------------------------------------------------ versions


@pytest.mark.parametrize(
    "version, expected",
    [
        ("5.0.21.26", (5, 0, 21, 26)),
        ("515.58", (515, 58)),
        ("1.0.2.14.1.54", (1, 0, 2, 14, 1, 54)),
        (" 5.0.21 ", (5, 0, 21)),
        ("5.0.21-rc1", (5, 0, 21)),
    ],
)
def test_version_tuple(version, expected):
    assert x.version_tuple(version) == expected


@pytest.mark.parametrize("bad", ["", "N/A", "abc", None])
def test_version_tuple_rejects_non_versions(bad):
    with pytest.raises(ValueError):
        x.version_tuple(bad)


@pytest.mark.parametrize(
    "a, b, expected",
    [
        ("5.0.21.26", "5.0.21.26", 0),
        ("5.0.21.27", "5.0.21.26", 1),
        ("5.0.21.9", "5.0.21.26", -1),  # numeric, not string, comparison
        ("5.0.22", "5.0.21.26", 1),
        ("5.0.21", "5.0.21.26", -1),
        ("1.48", "1.48.0", 0),
        ("515.58", "5.0.21.26", 1),
    ],
)
def test_compare_versions(a, b, expected):
    assert x.compare_versions(a, b) == expected


def test_driver_floor():
    assert x.version_at_least("5.0.21.26", "5.0.21.26")
    assert x.version_at_least("5.0.22.1", "5.0.21.26")
    assert not x.version_at_least("5.0.21.9", "5.0.21.26")
    assert not x.version_at_least(None, "5.0.21.26")
    assert not x.version_at_least("N/A", "5.0.21.26")


@pytest.mark.parametrize(
    "firmware, release",
    [
        ("1.0.2.14.1.54", "1.54"),
        ("1.0.2.14.1.48", "1.48"),
        ("1.48", "1.48"),
        ("1.40.0.0", "1.40.0.0"),
        (None, None),
    ],
)
def test_firmware_release(firmware, release):
    assert x.firmware_release(firmware) == release


@pytest.mark.parametrize(
    "firmware, ok",
    [
        ("1.0.2.14.1.54", True),  # release 1.54 >= 1.48
        ("1.0.2.14.1.48", True),  # equal
        ("1.0.2.14.1.40", False),  # release 1.40 < 1.48, although 1.0.2.14 ... looks "new"
        ("2.0.0.0.1.47", False),  # only the release fields count
        ("1.0.2.14.2.1", True),  # 2.1 > 1.48
        ("1.40.0.0", False),  # other shapes compare whole: 1.40 < 1.48
        ("1.50", True),
        ("N/A", False),
        (None, False),
    ],
)
def test_firmware_at_least_148(firmware, ok):
    assert x.firmware_at_least(firmware, "1.48") is ok


@pytest.mark.parametrize(
    "part, variant",
    [
        ("B00100300110312", "VD"),
        ("B00100300110112", "VC"),
        (" B00100300110112 ", "VC"),
        ("B00100300110999", None),
        (None, None),
        ("", None),
    ],
)
def test_card_variant(part, variant):
    assert x.card_variant(part) == variant


@pytest.mark.parametrize(
    "raw, norm",
    [
        ("00000000:52:00.0", "0000:52:00.0"),
        ("0000:5D:00.0", "0000:5d:00.0"),
        ("d1:00.0", "0000:d1:00.0"),
        ("nonsense", None),
        (None, None),
    ],
)
def test_normalize_bus_id(raw, norm):
    assert x.normalize_bus_id(raw) == norm


# ------------------------------------------------------------------ table


def test_table_8_vc():
    t = x.parse_table(fx("xpu-smi_8_vc.txt"))
    assert t["driver_version"] == "5.0.21.26"
    assert t["runtime_version"] == "5.0.21"
    assert [d["index"] for d in t["devices"]] == list(range(8))
    assert [d["bus_id"] for d in t["devices"]][:2] == ["00000000:52:00.0", "00000000:56:00.0"]
    d0 = t["devices"][0]
    assert d0["name"] == "P800 OAM"
    assert d0["memory_total_mib"] == 98304
    assert d0["memory_used_mib"] == 0
    assert d0["power_cap"] == "400W"
    assert d0["temperature"] == "36C"
    assert d0["sriov_mode"] == "Disabled"
    assert all(d["state"] == "ok" and d["err_fields"] == [] for d in t["devices"])
    assert t["processes"] == []


def test_table_7_of_8():
    t = x.parse_table(fx("xpu-smi_7.txt"))
    assert len(t["devices"]) == 7
    assert t["devices"][-1]["index"] == 6


def test_table_515_na_header():
    t = x.parse_table(fx("xpu-smi_515_na.txt"))
    assert t["driver_version"] == "515.58"
    assert t["runtime_version"] is None
    assert len(t["devices"]) == 8


def test_header_as_in_the_facts():
    line = "| XPU-SMI               Driver Version: 5.0.21.26    XPU-RT Version: 5.0.21   |"
    assert x.parse_header(line) == {"driver_version": "5.0.21.26", "runtime_version": "5.0.21"}
    assert x.parse_header("Driver Version: 515.58  XPU-RT Version: N/A") == {
        "driver_version": "515.58",
        "runtime_version": None,
    }
    assert x.parse_header("nothing here") == {"driver_version": None, "runtime_version": None}


def test_table_rows_as_in_the_facts():
    text = "\n".join(
        [
            "| XPU-SMI               Driver Version: 5.0.21.26    XPU-RT Version: 5.0.21   |",
            "|   0  P800 OAM           N/A   | 00000000:52:00.0 N/A |                    0 |",
            "| N/A   38C  N/A     85W / 400W |      0MiB / 98304MiB |      0%      Default |",
            "|                               |      0MiB /    96MiB |             Disabled |",
        ]
    )
    t = x.parse_table(text)
    assert len(t["devices"]) == 1
    d = t["devices"][0]
    assert (d["index"], d["bus_id"], d["memory_total_mib"], d["temperature"], d["power_draw"]) == (
        0,
        "00000000:52:00.0",
        98304,
        "38C",
        "85W",
    )
    assert d["state"] == "ok"


def test_table_device_in_error():
    t = x.parse_table(fx("xpu-smi_error3.txt"))
    states = [d["state"] for d in t["devices"]]
    assert states == ["ok"] * 3 + ["error"] + ["ok"] * 4
    bad = t["devices"][3]
    assert bad["bus_id"] == "00000000:61:00.0"
    assert "temp" in bad["err_fields"] and "mem_used" in bad["err_fields"]
    assert bad["memory_used_mib"] is None
    assert bad["memory_total_mib"] == 98304


def test_table_processes():
    t = x.parse_table(fx("xpu-smi_busy3.txt"))
    assert len(t["processes"]) == 1
    proc = t["processes"][0]
    assert proc["xpu"] == 3 and proc["name"] == "sleep" and proc["pid"] > 0
    assert proc["memory_mib"] is None


def test_table_of_nothing():
    t = x.parse_table("")
    assert t == {"driver_version": None, "runtime_version": None, "devices": [], "processes": []}


# ------------------------------------------------------------------ -q


def test_query_8_vc():
    q = x.parse_query(fx("xpu-smi-q_8_vc.txt"))
    assert q["driver_version"] == "5.0.21.26"
    assert q["runtime_version"] == "5.0.21"
    assert q["attached"] == 8
    assert len(q["devices"]) == 8
    d = q["devices"][5]
    assert d["index"] == 5
    assert d["name"] == "P800 OAM"
    assert d["brand"] == "KUNLUNXIN"
    assert d["architecture"] == "KL3"
    assert d["part_number"] == "B00100300110112"
    assert d["card_variant"] == "VC"
    assert d["firmware_version"] == "1.0.2.14.1.54"
    assert d["device_id"] == "0x36862057"
    assert d["bus_id"] == "00000000:d5:00.0"
    assert d["memory_total_mib"] == 98304
    assert d["uuid"].startswith("XPU-")
    assert d["serial"]
    assert len(set(dev["uuid"] for dev in q["devices"])) == 8


def test_query_sections_do_not_mix():
    d = x.parse_query(fx("xpu-smi-q_8_vc.txt"))["devices"][0]
    # "Utilization/Memory" and "Memory Usage/Total" are different keys
    assert d["raw"]["Utilization/Memory"] == "0 %"
    assert d["raw"]["Memory Usage/Total"] == "98304 MiB"
    assert d["raw"]["Power Readings/Power Limit"] == "400.00 W"


def test_query_variants():
    mixed = x.parse_query(fx("xpu-smi-q_mixed.txt"))
    assert [d["card_variant"] for d in mixed["devices"]] == ["VC"] * 4 + ["VD"] * 4
    vd = x.parse_query(fx("xpu-smi-q_8_vd.txt"))
    assert set(d["part_number"] for d in vd["devices"]) == {"B00100300110312"}


def test_query_one_device():
    q = x.parse_query(fx("xpu-smi-q_id2.txt"))
    assert q["attached"] == 8
    assert [d["index"] for d in q["devices"]] == [2]


def test_query_device_in_error_keeps_identity():
    d = x.parse_query(fx("xpu-smi-q_error3.txt"))["devices"][3]
    assert d["raw"]["Memory Usage/Used"] == "Unknown Error"
    assert d["memory_used_mib"] is None
    assert d["part_number"] == "B00100300110112"


def test_query_old_firmware():
    q = x.parse_query(fx("xpu-smi-q_old_firmware.txt"))
    assert {d["firmware_version"] for d in q["devices"]} == {"1.0.2.14.1.40"}
    assert not x.firmware_at_least(q["devices"][0]["firmware_version"], "1.48")


# ------------------------------------------------------------------ -L


def test_list():
    devs = x.parse_list(fx("xpu-smi-L_8.txt"))
    assert [d["index"] for d in devs] == list(range(8))
    assert devs[0]["name"] == "P800 OAM"
    assert devs[0]["uuid"].startswith("XPU-")
    assert len(x.parse_list(fx("xpu-smi-L_7.txt"))) == 7
    assert x.parse_list("XPU 3: P800 PCIe") == [{"index": 3, "name": "P800 PCIe", "uuid": None}]
    assert x.parse_list("No XPU device found") == []


# ------------------------------------------------------------------ lspci


def test_lspci_dn_and_dnn():
    dn = x.parse_lspci(fx("lspci-Dn_8.txt"))
    dnn = x.parse_lspci(fx("lspci-Dnn_8.txt"))
    assert len(dn) == len(dnn) == 8
    assert dn == dnn
    assert dn[0] == {"slot": "0000:52:00.0", "vendor": "2057", "device": "3686", "rev": "01"}
    assert len(x.parse_lspci(fx("lspci-Dn_7.txt"))) == 7


def test_lspci_vendors_and_device_ids():
    found = x.parse_lspci(fx("lspci-Dnn_mixed_vendors.txt"))
    assert [(f["vendor"], f["device"]) for f in found] == [
        ("1d22", "3686"),
        ("1d22", "3688"),
        ("2057", "3689"),
        ("2057", "3687"),
    ]
    everything = x.parse_lspci(fx("lspci-Dnn_mixed_vendors.txt"), vendors=None, devices=None)
    assert len(everything) == 7


# ------------------------------------------------------------------ lsmod, /proc


def test_lsmod():
    assert x.kunlun_modules_loaded(fx("lsmod_kunlun.txt")) == ["kunlun", "kunlun_peermem"]
    assert x.kunlun_modules_loaded(fx("lsmod_none.txt")) == []
    mods = x.parse_lsmod(fx("lsmod_host.txt"))
    assert mods["kunlun"] == {"size": 1658880, "used": 1, "used_by": ["kunlun_peermem"]}
    assert mods["ib_uverbs"]["used_by"] == ["kunlun_peermem", "rdma_ucm"]
    assert mods["overlay"]["used_by"] == []
    assert x.parse_lsmod(fx("lsmod_busy.txt"))["kunlun"]["used"] == 2


def test_proc_modules():
    mods = x.parse_lsmod(fx("proc_modules.txt"))
    assert x.kunlun_modules_loaded(fx("proc_modules.txt")) == ["kunlun", "kunlun_peermem"]
    assert mods["kunlun"]["used_by"] == ["kunlun_peermem"]
    assert mods["kunlun_peermem"]["used_by"] == []


def test_proc_version():
    assert x.parse_proc_version(fx("proc_kunlun_version.txt")) == "5.0.21.26"
    assert x.parse_proc_version("") is None
    assert x.parse_proc_version(None) is None


# The file's format is not public: invented lines, one per rule of parse_proc_version.
@pytest.mark.parametrize(
    "text, version",
    [
        # the tenth field of a KUNLUN line wins over another release-shaped number (firmware)
        ("KUNLUN XPU driver for P800 cards, firmware 1.0.2.14.1.54, release 5.0.21.26\n", "5.0.21.26"),
        # a kernel release is not a dotted number, "version" before it takes nothing
        ("Linux version 5.10.0-1.0.0.39 kunlun 5.0.21.26\n", "5.0.21.26"),
        ("kunlun driver version=5.0.21.21\n", "5.0.21.21"),
        # two candidates and nothing to choose by: none
        ("kunlun 5.0.21.26 firmware 1.0.2.14.1.54\n", None),
        ("kunlun loaded\n", None),
    ],
)
def test_proc_version_rules(text, version):
    assert x.parse_proc_version(text) == version


# ------------------------------------------------------------------ the XRE release


@pytest.mark.parametrize(
    "value, release",
    [
        ("5.0.21.26", "5.0.21.26"),
        (" 5.0.21.21 ", "5.0.21.21"),
        ("5.0.21.24.4", "5.0.21.24.4"),
        ("5.19.0.0", "5.19.0.0"),
        ("515.58", None),  # the other xpu-smi form's Driver Version
        ("5.0", None),
        ("5.0.21.26-rc1", None),
        ("N/A", None),
        ("", None),
        (None, None),
    ],
)
def test_xre_release(value, release):
    assert x.xre_release(value) == release


def test_first_form_release_is_the_header():
    r = x.driver_release(fx("xpu-smi_8_vc.txt"), fx("xpu-smi-q_8_vc.txt"), None)
    assert r == {
        "version": "5.0.21.26",
        "source": "xpu-smi",
        "error": None,
        "read": {
            "xpu-smi": "Driver Version: 5.0.21.26 XPU-RT Version: 5.0.21",
            "xpu-smi -q": "Driver Version : 5.0.21.26",
            "/proc/kunlun/version": None,
        },
    }


def test_second_form_release_is_read_from_proc():
    """515.58 / N/A in the header and in -q: the release is /proc/kunlun/version's."""
    r = x.driver_release(fx("xpu-smi_515_na.txt"), fx("xpu-smi-q_515_na.txt"), fx("proc_kunlun_version.txt"))
    assert (r["version"], r["source"], r["error"]) == ("5.0.21.26", "/proc/kunlun/version", None)
    assert r["read"] == {
        "xpu-smi": "Driver Version: 515.58 XPU-RT Version: N/A",
        "xpu-smi -q": "Driver Version : 515.58",
        "/proc/kunlun/version": "Kunlun XPU driver version: 5.0.21.26 (built Nov 12 2025)",
    }


def test_second_form_header_with_a_release_in_query():
    r = x.driver_release(fx("xpu-smi_515_na.txt"), fx("xpu-smi-q_8_vc.txt"), fx("proc_kunlun_version.txt"))
    assert (r["version"], r["source"]) == ("5.0.21.26", "xpu-smi -q")


def test_second_form_header_spaced_as_the_public_output():
    line = "| XPU-SMI               Driver Version: 515.58       XPU-RT Version: N/A      |"
    assert x.parse_header(line) == {"driver_version": "515.58", "runtime_version": None}
    r = x.driver_release(line, None, "KUNLUN kernel module of XRE for KL3 P800 cards, loaded: 5.0.21.26\n")
    assert (r["version"], r["source"]) == ("5.0.21.26", "/proc/kunlun/version")


def test_no_release_anywhere_names_every_reading():
    r = x.driver_release(fx("xpu-smi_515_na.txt"), fx("xpu-smi-q_515_na.txt"), None)
    assert (r["version"], r["source"]) == (None, None)
    assert r["error"].startswith(
        "no source gives the XRE release of the loaded driver: "
        "xpu-smi printed 'Driver Version: 515.58 XPU-RT Version: N/A'; "
        "xpu-smi -q printed 'Driver Version : 515.58'; /proc/kunlun/version does not exist."
    )
    assert "Fix: check that the kunlun module is loaded (lsmod | grep kunlun)" in r["error"]

    r = x.driver_release(fx("xpu-smi_515_na.txt"), None, "kunlun loaded\n")
    assert "xpu-smi -q did not answer; /proc/kunlun/version reads 'kunlun loaded'" in r["error"]
    r = x.driver_release("no header here\n", "Attached XPUs : 8\n", "")
    assert (
        "xpu-smi printed no Driver Version; xpu-smi -q printed no Driver Version; /proc/kunlun/version is empty."
    ) in r["error"]


def test_nothing_to_read_is_no_driver_not_an_error():
    assert x.driver_release(None, None, None) == {
        "version": None,
        "source": None,
        "error": None,
        "read": {"xpu-smi": None, "xpu-smi -q": None, "/proc/kunlun/version": None},
    }


@pytest.mark.parametrize(
    "text, expected",
    [
        ("RUNNING\n", ("ok", "RUNNING")),
        ("HANG\n", ("error", "HANG")),
        ("", ("error", "")),
        (None, (None, None)),
    ],
)
def test_device_state(text, expected):
    assert x.device_state(text) == expected


# ------------------------------------------------------------------ merge


def test_merge_mixed():
    devs = x.merge_devices(
        x.parse_table(fx("xpu-smi_8_vc.txt")),
        x.parse_query(fx("xpu-smi-q_mixed.txt")),
        x.parse_list(fx("xpu-smi-L_8.txt")),
    )
    assert len(devs) == 8
    assert [d["card_variant"] for d in devs] == ["VC"] * 4 + ["VD"] * 4
    assert all(d["device_id"] == "0x36862057" for d in devs)
    assert devs[7]["bus_id"] == "00000000:de:00.0"


def test_merge_without_table_uses_query():
    devs = x.merge_devices({"devices": []}, x.parse_query(fx("xpu-smi-q_7.txt")))
    assert len(devs) == 7
    assert devs[0]["memory_total_mib"] == 98304


def test_merge_error_state_survives():
    devs = x.merge_devices(x.parse_table(fx("xpu-smi_error3.txt")), x.parse_query(fx("xpu-smi-q_error3.txt")))
    assert [d["index"] for d in devs if d["state"] == "error"] == [3]


# ------------------------------------------------------------------ power


@pytest.mark.parametrize(
    "text, watts",
    [
        ("400W", 400),
        ("400 W", 400),
        ("400.00 W", 400),
        (" 120W ", 120),
        ("85.5 W", 85.5),
        ("400", 400),
        ("400 Watts", 400),
        ("N/A", None),
        ("[N/A]", None),
        ("ERR!", None),
        ("Unknown Error", None),
        ("[Not Supported]", None),
        ("-5 W", None),
        ("", None),
        (None, None),
    ],
)
def test_parse_watts(text, watts):
    got = x.parse_watts(text)
    assert got == watts
    if watts is not None and watts == int(watts):
        assert isinstance(got, int)


def test_table_power_as_in_the_facts():
    text = "\n".join(
        [
            "| XPU-SMI               Driver Version: 5.0.21.26    XPU-RT Version: 5.0.21   |",
            "|   0  P800 OAM           N/A   | 00000000:52:00.0 N/A |                    0 |",
            "| N/A   38C  N/A     85W / 400W |      0MiB / 98304MiB |      0%      Default |",
            "|                               |      0MiB /    96MiB |             Disabled |",
        ]
    )
    d = x.parse_table(text)["devices"][0]
    assert (d["power_draw_w"], d["power_cap_w"]) == (85, 400)
    assert (d["power_draw"], d["power_cap"]) == ("85W", "400W")


@pytest.mark.parametrize(
    "column, draw, cap",
    [
        ("  85W / 120W", 85, 120),
        ("85 W / 400 W", 85, 400),  # a build that spaces its units
        ("  N/A /  N/A", None, None),  # a build that cannot read power
        ("  85W /  N/A", 85, None),
    ],
)
def test_table_power_column_variants(column, draw, cap):
    row2 = "| N/A   38C  N/A %s |      0MiB / 98304MiB |      0%%      Default |" % column
    text = "\n".join(
        [
            "|   0  P800 OAM           N/A   | 00000000:52:00.0 N/A |                    0 |",
            row2,
            "|                               |      0MiB /    96MiB |             Disabled |",
        ]
    )
    d = x.parse_table(text)["devices"][0]
    assert (d["power_draw_w"], d["power_cap_w"]) == (draw, cap)
    # the rest of the row is still read
    assert d["memory_total_mib"] == 98304 and d["sriov_mode"] == "Disabled"
    assert d["state"] == "ok"


def test_table_power_400_120_and_na():
    full = x.parse_table(fx("xpu-smi_8_vc.txt"))["devices"]
    assert [d["power_cap_w"] for d in full] == [400] * 8
    assert [d["power_draw_w"] for d in full][:3] == [84, 85, 86]
    low = x.parse_table(fx("xpu-smi_power120.txt"))["devices"]
    assert [d["power_cap_w"] for d in low] == [120] * 8
    some = x.parse_table(fx("xpu-smi_power3_120_5_na.txt"))["devices"]
    assert [d["power_cap_w"] for d in some] == [400, 400, 400, 120, 400, None, 400, 400]
    assert some[5]["power_draw_w"] == 86 and some[5]["state"] == "ok"


def test_table_power_of_a_device_in_error_is_unknown():
    d = x.parse_table(fx("xpu-smi_error3.txt"))["devices"][3]
    assert (d["power_draw_w"], d["power_cap_w"]) == (None, None)
    assert "power_cap" in d["err_fields"]


def test_query_power_readings():
    full = x.parse_query(fx("xpu-smi-q_8_vc.txt"))["devices"]
    assert [d["power_cap_w"] for d in full] == [400] * 8
    assert [d["power_draw_w"] for d in full][:3] == [84, 85, 86]
    low = x.parse_query(fx("xpu-smi-q_power120.txt"))["devices"]
    assert [d["power_cap_w"] for d in low] == [120] * 8
    some = x.parse_query(fx("xpu-smi-q_power3_120_5_na.txt"))["devices"]
    assert [d["power_cap_w"] for d in some] == [400, 400, 400, 120, 400, None, 400, 400]
    err = x.parse_query(fx("xpu-smi-q_error3.txt"))["devices"][3]
    assert (err["power_draw_w"], err["power_cap_w"]) == (None, 400)  # 'Unknown Error' draw


def test_query_power_reading_key_variants():
    devs = x.parse_query(fx("xpu-smi-q_power_keys.txt"))["devices"]
    # Enforced Power Limit wins over Power Limit; [N/A] falls through to Current Power
    # Limit; a block without any cap figure is unknown; "XPU Power Readings" counts.
    assert [d["power_cap_w"] for d in devs] == [120, 400, None]
    assert [d["power_draw_w"] for d in devs] == [84, 85, 86.5]


def test_query_without_power_readings():
    text = "XPU 00000000:52:00.0\n    Product Name : P800 OAM\n    Power Limit : 400 W\n"
    d = x.parse_query(text)["devices"][0]
    # a "Power Limit" outside the Power Readings block is not taken for the cap
    assert (d["power_cap_w"], d["power_draw_w"]) == (None, None)


def test_merge_power_table_first_then_query():
    table = x.parse_table(fx("xpu-smi_error3.txt"))
    query = x.parse_query(fx("xpu-smi-q_error3.txt"))
    devs = x.merge_devices(table, query)
    assert devs[3]["power_cap_w"] == 400  # ERR! in the table, 400.00 W in -q
    assert devs[3]["power_draw_w"] is None  # unknown in both
    # the table's figure is used when it has one
    devs = x.merge_devices(x.parse_table(fx("xpu-smi_power120.txt")), x.parse_query(fx("xpu-smi-q_8_vc.txt")))
    assert {d["power_cap_w"] for d in devs} == {120}
    # without -q only the table speaks; without a table only -q
    assert {d["power_cap_w"] for d in x.merge_devices(x.parse_table(fx("xpu-smi_515_na.txt")))} == {400}
    only_q = x.merge_devices({"devices": []}, x.parse_query(fx("xpu-smi-q_power120.txt")))
    assert [d["power_cap_w"] for d in only_q] == [120] * 8


def _merged(table, query):
    return x.merge_devices(x.parse_table(fx(table)), x.parse_query(fx(query)))


def test_low_power_none_at_full_cap():
    low, unknown = x.low_power_devices(_merged("xpu-smi_8_vc.txt", "xpu-smi-q_8_vc.txt"), 400)
    assert (low, unknown) == ([], [])
    assert x.low_power_message(low, 400, 8) is None


def test_low_power_every_card_at_120():
    devs = _merged("xpu-smi_power120.txt", "xpu-smi-q_power120.txt")
    low, unknown = x.low_power_devices(devs, 400)
    assert [d["index"] for d in low] == list(range(8)) and unknown == []
    assert low[0] == {
        "index": 0,
        "serial": "02KE5E61F0010",
        "bus_id": "00000000:52:00.0",
        "power_cap_w": 120,
        "label": "device 0 (serial 02KE5E61F0010)",
    }
    msg = x.low_power_message(low, 400, len(devs))
    assert msg.startswith(
        "8 of 8 cards are capped below the full 400 W: "
        "device 0 (serial 02KE5E61F0010) at 120 W, device 1 (serial 02KE5E61F0011) at 120 W,"
    )
    assert "device 7 (serial 02KE5E61F0017) at 120 W." in msg
    assert "345 TFLOPS FP16 at 400 W" in msg and "128 TFLOPS in its 120 W low-power mode" in msg
    assert msg.endswith("Fix: set each card's power limit back to 400 W with the vendor's tool (xpu-smi) and re-run.")


def test_low_power_one_card_and_one_unknown():
    devs = _merged("xpu-smi_power3_120_5_na.txt", "xpu-smi-q_power3_120_5_na.txt")
    low, unknown = x.low_power_devices(devs, 400)
    assert [(d["index"], d["power_cap_w"]) for d in low] == [(3, 120)]
    assert [(d["index"], d["label"]) for d in unknown] == [(5, "device 5 (serial 02KE5E61F0015)")]
    msg = x.low_power_message(low, 400, 8)
    assert msg.startswith("1 of 8 cards is capped below the full 400 W: device 3 (serial 02KE5E61F0013) at 120 W.")
    assert "Fix: set the card's power limit back to 400 W with the vendor's tool (xpu-smi) and re-run." in msg


def test_low_power_without_serial_names_the_bus_id():
    devs = x.merge_devices(x.parse_table(fx("xpu-smi_power3_120_5_na.txt")))  # no -q: no serial
    low, _ = x.low_power_devices(devs, 400)
    assert low[0]["label"] == "device 3 (00000000:61:00.0)"
    assert "device 3 (00000000:61:00.0) at 120 W" in x.low_power_message(low, 400)
    assert x.low_power_message(low, 400).startswith("1 card is capped")


@pytest.mark.parametrize("cap, below", [(399, True), (399.5, True), (400, False), (400.0, False), (450, False)])
def test_low_power_comparison_is_exact(cap, below):
    low, unknown = x.low_power_devices([{"index": 0, "serial": "S", "bus_id": "B", "power_cap_w": cap}], 400)
    assert bool(low) is below and unknown == []


def test_low_power_message_names_fractional_caps():
    low = [{"index": 2, "serial": None, "bus_id": "00000000:5d:00.0", "power_cap_w": 150.5}]
    assert "device 2 (00000000:5d:00.0) at 150.5 W" in x.low_power_message(low, 400, 8)
