"""`kunlun-fleet inventory` (kunlun_fleet/inventory_gen.py): the CSV read and refused line by
line, hosts.yml and group_vars written in the example inventory's shape (read back as Ansible
reads it), nothing replaced without --force (the old file kept first), nothing written
unconfirmed, no secret written; the discovery's choices from a host's report (the module's
result: library/data_disk_candidates.py) and the host_vars they make, the foreign disk never
taken, discovery refused until the hosts' SSH keys are known. Against the sim hosts' real
disks: tests/inventory/test_inventory_discover_sim.py."""

import io
import types
from pathlib import Path

import pytest
import yaml

from kunlun_fleet import cli, hostkeys, inventory_gen, runner

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE_CSV = ROOT / "inventories" / "example-hosts.csv"
TIB = 1024**4


def write_csv(tmp_path, text, name="hosts.csv"):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def run(*args):
    return cli.main(["inventory"] + [str(a) for a in args])


class Terminal(io.StringIO):
    """stdin on a terminal, with the operator's answer."""

    def isatty(self):
        return True


# ---------------------------------------------------------------- the CSV


def test_the_example_csv_is_the_example_inventory(tmp_path, capsys):
    """inventories/example-hosts.csv makes inventories/example/hosts.yml: the same groups, hosts
    and addresses, read as Ansible reads them; group_vars/all as the example's."""
    site = tmp_path / "site-a"
    assert run("-i", site, "--csv", EXAMPLE_CSV, "--yes") == runner.OK
    out = capsys.readouterr().out
    assert inventory_gen.read_groups(site) == inventory_gen.read_groups(ROOT / "inventories" / "example")
    example = ROOT / "inventories" / "example" / "group_vars" / "all"
    written = site / "group_vars" / "all"
    assert sorted(p.name for p in written.iterdir()) == sorted(p.name for p in example.glob("*.yml"))
    for path in example.glob("*.yml"):
        assert (written / path.name).read_text() == path.read_text(), path.name
    # No secret: the vault is api-key's, and the next steps say so.
    assert not (site / "group_vars" / "all" / "vault.yml").exists() and not (site / ".vault-password").exists()
    assert "kunlun-fleet api-key -i %s" % site in out and "writes no secret" in out
    assert "kunlun-fleet hostkeys -i %s --accept" % site in out
    assert "kunlun-fleet inventory -i %s --discover" % site in out
    # The table of the choices.
    assert "p800-a01  10.20.1.11  xpu_servers, image_builders" in out
    hosts = yaml.safe_load((site / "hosts.yml").read_text())
    assert hosts["all"]["children"]["image_builders"]["hosts"] == {"p800-a01": None}


def test_csv_variants_are_read(tmp_path):
    text = (
        "\ufeff# our servers\n"
        "NAME, Address ,Roles\n"
        "\n"
        "p800-b01, 10.30.1.11 , XPU_SERVER ; image_builder,,\n"
        "p800-b02,p800-b02.dc1.example.net,xpu_servers\n"
        "gw-b1,fd00::5,gateway;gateways\n"
    )
    hosts = inventory_gen.parse_csv(text)
    assert [(h.name, h.address, h.groups) for h in hosts] == [
        ("p800-b01", "10.30.1.11", ["xpu_servers", "image_builders"]),
        ("p800-b02", "p800-b02.dc1.example.net", ["xpu_servers"]),
        ("gw-b1", "fd00::5", ["gateways"]),
    ]
    text = inventory_gen.render_hosts(hosts)
    inventory_gen.check_hosts(text, hosts)  # read back as Ansible reads it
    assert "# (no host has the role monitoring)" in text


@pytest.mark.parametrize(
    "line, said",
    [
        ("p800 a02,10.20.1.12,xpu_server", "line 3: 'p800 a02' is not a host name Ansible can target"),
        ("p800-a0[2:3],10.20.1.12,xpu_server", "is not a host name Ansible can target"),
        ("gateways,10.20.1.12,xpu_server", "line 3: 'gateways' is the name of a group"),
        ("P800-A01,10.20.1.12,xpu_server", "line 3: the name P800-A01 is on line 2 already"),
        ("p800-a02,10.20.1.300,xpu_server", "line 3 (p800-a02): '10.20.1.300' is not an IPv4 address"),
        ("p800-a02,10.20.1.11,xpu_server", "the address 10.20.1.11 is p800-a01's (line 2) already"),
        ("p800-a02,,xpu_server", "line 3 (p800-a02): no address"),
        ("p800-a02,bad_host!,xpu_server", "'bad_host!' is neither an IP address nor a DNS name"),
        (
            "p800-a02,10.20.1.12,xpu_server;gpu_server",
            "unknown role(s) 'gpu_server'; the roles: xpu_server, image_builder",
        ),
        ("p800-a02,10.20.1.12,", "line 3: 2 field(s)"),
        ("p800-a02,10.20.1.12, ; ", "line 3 (p800-a02): no role"),
        ("p800-a02,10.20.1.12,xpu_server,gateway", "line 3: 4 field(s)"),
        ("gw-02,10.20.0.6,image_builder", "image_builder without xpu_server"),
    ],
)
def test_a_bad_line_is_refused_naming_it_and_nothing_is_written(tmp_path, capsys, line, said):
    csv_path = write_csv(
        tmp_path,
        "name,address,role\np800-a01,10.20.1.11,xpu_server;image_builder\n%s\ngw-01,10.20.0.5,gateway\n" % line,
    )
    site = tmp_path / "site"
    assert run("-i", site, "--csv", csv_path, "--yes") == runner.REFUSED
    err = capsys.readouterr().err
    assert said in err and "nothing was written" in err, err
    assert not site.exists()


def test_every_problem_is_named_at_once(tmp_path):
    text = "a b,1.2.3,xpu_server\nok-1,10.0.0.1,router\n"
    with pytest.raises(inventory_gen.Refused) as caught:
        inventory_gen.parse_csv(text, "site.csv")
    said = str(caught.value)
    assert said.startswith("site.csv: 3 problem(s)")
    assert "line 1: 'a b'" in said and "line 1 (a b): '1.2.3'" in said and "line 2 (ok-1): unknown role(s)" in said


@pytest.mark.parametrize(
    "text, said",
    [
        ("gw-01,10.20.0.5,gateway\n", "no xpu_server: preflight needs at least one host in xpu_servers"),
        ("p800-a01,10.20.1.11,xpu_server\ngw-01,10.20.0.5,gateway\n", "no image_builder"),
        ("p800-a01,10.20.1.11,xpu_server;image_builder\n", "no gateway"),
        ("# nothing\n", "no xpu_server"),
    ],
)
def test_the_groups_preflight_requires(text, said):
    with pytest.raises(inventory_gen.Refused, match=said):
        inventory_gen.parse_csv(text)


def test_command_line_refusals(tmp_path, capsys):
    assert run("-i", tmp_path / "x") == runner.REFUSED
    assert "give --csv FILE" in capsys.readouterr().err
    assert run("-i", tmp_path / "x", "--csv", EXAMPLE_CSV, "--limit", "p800-a01") == runner.REFUSED
    assert "--limit goes with --discover" in capsys.readouterr().err
    assert run("-i", tmp_path / "x", "--csv", tmp_path / "none.csv", "--yes") == runner.REFUSED
    assert "none.csv cannot be read" in capsys.readouterr().err
    (tmp_path / "afile").write_text("")
    assert run("-i", tmp_path / "afile", "--csv", EXAMPLE_CSV, "--yes") == runner.REFUSED
    assert "is a file" in capsys.readouterr().err
    assert run("-i", tmp_path / "none", "--discover", "--yes") == runner.REFUSED
    assert "no inventory directory" in capsys.readouterr().err


# ---------------------------------------------------------------- confirmation and overwrites


def test_nothing_is_written_unconfirmed(tmp_path, capsys):
    site = tmp_path / "site"
    # No terminal to ask on (a pipe, CI) and no --yes.
    assert run("-i", site, "--csv", EXAMPLE_CSV) == runner.REFUSED
    assert "Give --yes to write without asking" in capsys.readouterr().err and not site.exists()
    out = io.StringIO()
    code = inventory_gen.run(str(site), csv_path=str(EXAMPLE_CSV), stdin=Terminal("n\n"), out=out, err=out)
    assert code == runner.REFUSED and "Write 9 file(s)" in out.getvalue() and not site.exists()
    out = io.StringIO()
    code = inventory_gen.run(str(site), csv_path=str(EXAMPLE_CSV), stdin=Terminal("y\n"), out=out, err=out)
    assert code == runner.OK and (site / "hosts.yml").exists()


def test_no_overwrite_without_force_and_the_old_file_kept_with_it(tmp_path, capsys):
    site = tmp_path / "site"
    assert run("-i", site, "--csv", EXAMPLE_CSV, "--yes") == runner.OK
    # The operator's edits: a comment in hosts.yml, a setting in group_vars.
    hosts_yml, firewall = site / "hosts.yml", site / "group_vars" / "all" / "firewall.yml"
    hosts_yml.write_text(hosts_yml.read_text() + "# rack B from January\n")
    firewall.write_text("---\nfirewall_admin_sources: [192.0.2.0/28]\n")
    edited = hosts_yml.read_text()
    capsys.readouterr()

    other = write_csv(tmp_path, EXAMPLE_CSV.read_text().replace("p800-a03,10.20.1.13", "p800-a04,10.20.1.14"))
    assert run("-i", site, "--csv", other, "--yes") == runner.REFUSED
    err = capsys.readouterr().err
    assert "hosts.yml exists in %s and differs" % site in err and "--force" in err and "nothing was written" in err
    assert hosts_yml.read_text() == edited

    assert run("-i", site, "--csv", other, "--yes", "--force") == runner.OK
    out = capsys.readouterr().out
    assert "p800-a04" in hosts_yml.read_text() and "p800-a03" not in hosts_yml.read_text()
    [backup] = (site / inventory_gen.BACKUP_DIR).glob("*/hosts.yml")
    assert backup.read_text() == edited and "the old one kept: %s" % backup in out
    # group_vars are the site's once written: kept, even with --force.
    assert firewall.read_text() == "---\nfirewall_admin_sources: [192.0.2.0/28]\n"
    assert "keep      %s" % firewall in out
    # The same CSV again: nothing to change.
    assert run("-i", site, "--csv", other, "--yes") == runner.OK
    assert "nothing to change" in capsys.readouterr().out
    # Ansible does not read the kept copies (a hidden directory).
    assert inventory_gen.read_groups(site)[0]["xpu_servers"] == ["p800-a01", "p800-a02", "p800-a04"]


def test_a_replaced_file_keeps_its_mode_and_each_run_its_own_backup(tmp_path):
    import datetime

    (tmp_path / "hosts.yml").write_text("old\n")
    (tmp_path / "hosts.yml").chmod(0o600)
    now = datetime.datetime(2026, 12, 1, 6, 0, 0, tzinfo=datetime.timezone.utc)
    for text in ("new\n", "newer\n"):
        change = inventory_gen.plan_file(tmp_path, "hosts.yml", text)
        assert change.action == "replace"
        inventory_gen.write_changes(tmp_path, [change], now=now)
    assert (tmp_path / "hosts.yml").read_text() == "newer\n"
    assert (tmp_path / "hosts.yml").stat().st_mode & 0o777 == 0o600
    kept = tmp_path / inventory_gen.BACKUP_DIR
    assert (kept / "20261201T060000Z" / "hosts.yml").read_text() == "old\n"
    assert (kept / "20261201T060000Z-1" / "hosts.yml").read_text() == "new\n"
    assert not list(tmp_path.glob(".*.tmp"))


# ---------------------------------------------------------------- the discovery's choices


def disk(name, size, state, summary=None, by_id=None, home=False):
    return {
        "path": "/dev/%s" % name,
        "by_id": by_id,
        "name": by_id or "/dev/%s" % name,
        "by_id_links": [by_id] if by_id else [],
        "size_bytes": size,
        "state": state,
        "summary": summary or state,
        "home": home,
    }


SAMSUNG = "/dev/disk/by-id/nvme-SAMSUNG_MZWLR7T6HALA-00007_S6EWNE0T10000%d"
OS_DISK = {"path": "/dev/sda", "by_id": "/dev/disk/by-id/ata-INTEL_SSDSC2KB480G8_PHYF0", "reason": "holds /, /boot/efi"}
BLANK_HOST = {
    "mount_point": "/home",
    "disks": [
        disk("nvme0n1", 7 * TIB, "empty", by_id=SAMSUNG % 1),
        disk("nvme1n1", 7 * TIB, "empty", by_id=SAMSUNG % 2),
        disk("sdb", 3 * TIB, "foreign", "holds ext4", by_id="/dev/disk/by-id/ata-OLD_DISK_123"),
    ],
    "excluded": [OS_DISK],
    "home_volume": {},
    "home_mount": {},
    "vg_classified": "data",
}
DELIVERED_HOST = {
    "mount_point": "/home",
    "disks": [
        disk("vdb", 14 * TIB, "ours", "physical volume of volume group vg0", home=True),
        disk("vdc", 7 * TIB, "empty", by_id=SAMSUNG % 3),
    ],
    "excluded": [],
    "home_volume": {
        "vg": "vg0",
        "lv": "lv_home",
        "path": "/dev/vg0/lv_home",
        "fstype": "ext4",
        "size_bytes": 14 * TIB,
        "vg_size_bytes": 14 * TIB,
        "vg_free_bytes": 0,
        "pvs": ["/dev/vdb"],
        "disks": ["/dev/vdb"],
        "own": False,
        "adopt": True,
        "fstab": {"spec": "/dev/mapper/vg0-lv_home", "by": "path"},
    },
    "home_mount": {"source": "/dev/mapper/vg0-lv_home", "fstype": "ext4"},
    "vg_classified": "vg0",
}


def test_blank_disks_are_data_disks_a_foreign_one_never_taken():
    choice = inventory_gen.Choice("p800-a01", BLANK_HOST)
    text = choice.text()
    data = yaml.safe_load(text)
    assert data == {"storage_data_disks": [SAMSUNG % 1, SAMSUNG % 2]}  # nothing else set, no take list
    assert "#   /dev/disk/by-id/ata-OLD_DISK_123 (3.0 TiB): holds ext4" in text
    assert "# storage_take_disks:\n#   - /dev/disk/by-id/ata-OLD_DISK_123" in text
    assert "# /home is a directory of the root filesystem:\n# its content is carried over" in text
    assert "WIPING" in text and "Left out, the system's: %s (holds /, /boot/efi)" % OS_DISK["by_id"] in text
    rows = {r[1]: r for r in choice.rows()}
    assert rows[SAMSUNG % 1][3:] == ("empty", "empty", "data disk")
    assert rows["/dev/disk/by-id/ata-OLD_DISK_123"][5].startswith("NOT taken")
    assert rows[OS_DISK["by_id"]][5] == "left out: the system's"


def test_a_delivered_volume_is_adopted_as_it_is():
    choice = inventory_gen.Choice("p800-a03", DELIVERED_HOST)
    text = choice.text()
    assert yaml.safe_load(text) == {"storage_data_disks": []}
    assert "# /home is the LVM volume vg0/lv_home (ext4, 14.0 TiB; 0 B free in vg0) on /dev/vdb:" in text
    assert "#   - %s  # 7.0 TiB, empty" % (SAMSUNG % 3) in text  # would grow it: shown, not listed
    assert "# storage_fstab_by_uuid: true" in text  # its fstab line names a path: suggested, not set
    rows = choice.rows()
    assert rows[0][1:] == (
        "vg0/lv_home",
        "14.0 TiB",
        "-",
        "the LVM volume at /home (ext4)",
        "adopted as it is: storage_data_disks []",
    )
    assert [r[5] for r in rows[1:]] == [
        "not listed: in the adopted volume group vg0",
        "not listed: it would grow vg0 (commented)",
    ]


def test_our_own_volume_stays_listed_and_a_kernel_name_is_flagged():
    result = dict(
        BLANK_HOST,
        disks=[disk("vdb", 14 * TIB, "ours", "physical volume of volume group data", home=True)],
        excluded=[],
        home_volume={"vg": "data", "lv": "home", "own": True, "adopt": False},
    )
    text = inventory_gen.Choice("kf-node-1", result).text()
    assert yaml.safe_load(text) == {"storage_data_disks": ["/dev/vdb"]}
    assert "/dev/vdb  # 14.0 TiB, ours: physical volume of volume group data (the volume at /home)" in text
    assert "# /dev/vdb: no /dev/disk/by-id/ link on this host" in text


def test_a_host_with_no_disk_is_said_so():
    result = dict(BLANK_HOST, disks=[disk("sdb", 3 * TIB, "foreign", "holds ext4")])
    choice = inventory_gen.Choice("p800-a09", result)
    assert yaml.safe_load(choice.text()) == {"storage_data_disks": []}
    assert "preflight refuses this host until its data" in choice.text()
    assert choice.rows()[-1][5] == "NO DATA DISK: preflight refuses this host"


# ---------------------------------------------------------------- --discover, without hosts


@pytest.fixture
def site(tmp_path, monkeypatch):
    """A written inventory whose discovery answers from BLANK_HOST and DELIVERED_HOST."""
    path = tmp_path / "site"
    assert run("-i", path, "--csv", EXAMPLE_CSV, "--yes") == runner.OK
    monkeypatch.setattr(inventory_gen, "key_refusal", lambda inventory, names, err: None)
    runs = []

    class FakeRun:
        def __init__(self, inventory, limit, argv=None, base=None):
            runs.append(limit)
            self.results = {"p800-a01": BLANK_HOST, "p800-a03": DELIVERED_HOST}
            self.problems = {"p800-a02": "unreachable: Failed to connect to the host via ssh"}
            self.summary, self.dir = {}, tmp_path

        def run(self):
            return runner.UNREACHABLE

    monkeypatch.setattr(inventory_gen, "DiscoverRun", FakeRun)
    return types.SimpleNamespace(path=path, runs=runs)


def test_discover_writes_each_host_read(site, capsys):
    assert run("-i", site.path, "--discover", "--yes") == runner.UNREACHABLE
    out, err = capsys.readouterr()
    assert site.runs == ["p800-a01,p800-a02,p800-a03"]  # the serving hosts only, not gw-01
    assert yaml.safe_load((site.path / "host_vars" / "p800-a01.yml").read_text()) == {
        "storage_data_disks": [SAMSUNG % 1, SAMSUNG % 2]
    }
    assert yaml.safe_load((site.path / "host_vars" / "p800-a03.yml").read_text()) == {"storage_data_disks": []}
    assert not (site.path / "host_vars" / "p800-a02.yml").exists()
    assert "p800-a02  -" in out and "unreachable: Failed to connect" in out
    assert "p800-a02 not read" in err
    # The inventory reads as Ansible reads it, with the host_vars.
    assert inventory_gen.read_groups(site.path)[1]["p800-a01"] == "10.20.1.11"


def test_discover_does_not_replace_an_edited_host_vars_without_force(site, capsys):
    host_vars = site.path / "host_vars" / "p800-a01.yml"
    host_vars.parent.mkdir()
    host_vars.write_text("---\nkunlun_stack_serving_address: 10.40.1.11\nstorage_data_disks: [/dev/sdz]\n")
    assert run("-i", site.path, "--discover", "--yes") == runner.REFUSED
    assert "host_vars/p800-a01.yml exists" in capsys.readouterr().err
    assert not (site.path / "host_vars" / "p800-a03.yml").exists()  # nothing written at all

    assert run("-i", site.path, "--discover", "--yes", "--force") == runner.UNREACHABLE
    out = capsys.readouterr().out
    assert "it had storage_data_disks ['/dev/sdz']; keeps kunlun_stack_serving_address" in out
    data = yaml.safe_load(host_vars.read_text())
    assert data == {"storage_data_disks": [SAMSUNG % 1, SAMSUNG % 2], "kunlun_stack_serving_address": "10.40.1.11"}
    [backup] = (site.path / inventory_gen.BACKUP_DIR).glob("*/host_vars/p800-a01.yml")
    assert "/dev/sdz" in backup.read_text()
    # Again: the same content, nothing to change.
    assert run("-i", site.path, "--discover", "--yes") == runner.UNREACHABLE
    assert "unchanged" in capsys.readouterr().out


def test_a_vaulted_host_vars_is_refused_even_with_force(site, capsys):
    host_vars = site.path / "host_vars" / "p800-a01.yml"
    host_vars.parent.mkdir()
    host_vars.write_text("secret: !vault |\n  $ANSIBLE_VAULT;1.1;AES256\n  3132\n")
    assert run("-i", site.path, "--discover", "--yes", "--force") == runner.REFUSED
    assert "cannot be read as plain YAML" in capsys.readouterr().err


def test_discover_limit_narrows_to_serving_hosts(site, capsys):
    assert run("-i", site.path, "--discover", "--limit", "p800-a01,gw-01", "--yes") == runner.OK
    assert site.runs == ["p800-a01"]
    assert run("-i", site.path, "--discover", "--limit", "gw-01", "--yes") == runner.REFUSED
    assert "no serving host (xpu_servers)" in capsys.readouterr().err


def test_discovery_waits_for_known_host_keys(tmp_path, monkeypatch, capsys):
    """New keys: refused before any login, naming hostkeys; the run never starts."""
    site = tmp_path / "site"
    assert run("-i", site, "--csv", EXAMPLE_CSV, "--yes") == runner.OK
    capsys.readouterr()
    monkeypatch.setattr(hostkeys, "scan", lambda hosts, path: [hostkeys.Result(h, hostkeys.NEW) for h in hosts])
    monkeypatch.setattr(inventory_gen, "DiscoverRun", lambda *a, **k: pytest.fail("ran without known keys"))
    assert run("-i", site, "--discover", "--yes") == runner.REFUSED
    err = capsys.readouterr().err
    assert "are not known yet" in err
    assert "kunlun-fleet hostkeys -i %s --limit p800-a01,p800-a02,p800-a03 --accept" % site in err
    assert not (site / "host_vars").exists()
