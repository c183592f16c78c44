"""plugins/filter/storage.py: whether the storage stage adopts the logical volume mounted at the mount point,
pinned against the Jinja the role computed it with before (rendered by Ansible's own
templar)."""

import pytest
from ansible.template import Templar, trust_as_template

from plugins.filter.storage import storage_adopt


def jinja(expr, **variables):
    return Templar(variables=variables).template(trust_as_template(expr))


# roles/storage/tasks/disks.yml, as it was.
ADOPT_JINJA = """{{ storage_volume.mounted_lv.vg is defined and
   (storage_data_disks | length == 0 or
    storage_volume.mounted_lv.vg ~ '/' ~ storage_volume.mounted_lv.lv != storage_vg_name ~ '/' ~ storage_lv_name) }}"""

LV = {"vg": "vg0", "lv": "lv_home", "path": "/dev/vg0/lv_home", "size_bytes": 15393162788864, "pvs": ["/dev/sda3"]}
OWN = dict(LV, vg="data", lv="home", path="/dev/data/home")


@pytest.mark.parametrize(
    "mounted_lv",
    [
        {},  # the mount point is not on a logical volume (or not mounted)
        LV,  # the delivered server's volume
        OWN,  # kunlun-fleet's own volume
        dict(LV, vg="data"),  # another volume in a group of the same name
        dict(LV, lv="home"),
    ],
)
@pytest.mark.parametrize("disks", [[], ["/dev/nvme1n1"], ["/dev/nvme1n1", "/dev/nvme2n1"]])
def test_adopt_a_mounted_volume_unless_it_is_our_own_on_listed_disks(mounted_lv, disks):
    expected = jinja(
        ADOPT_JINJA,
        storage_volume={"mounted_lv": mounted_lv, "mount": {}},
        storage_data_disks=disks,
        storage_vg_name="data",
        storage_lv_name="home",
    )
    got = storage_adopt(mounted_lv, disks, "data", "home")
    assert got is expected  # a bool: when: and the assertions read it


def test_adopt_in_plain_words():
    assert storage_adopt({}, [], "data", "home") is False
    assert storage_adopt({}, ["/dev/sdb"], "data", "home") is False
    assert storage_adopt(LV, ["/dev/sdb"], "data", "home") is True
    assert storage_adopt(OWN, ["/dev/sdb"], "data", "home") is False
    # no disk listed: the mounted volume is adopted whatever its names
    assert storage_adopt(OWN, [], "data", "home") is True
