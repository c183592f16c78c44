"""library/data_disk_info.py: classifying what a data disk holds (module_utils/data_disks.py, which
library/data_disk_candidates.py shares)."""

import pytest
from ansible.module_utils import data_disks


def entry(**over):
    base = {
        "path": "/dev/vdb",
        "exists": True,
        "block": True,
        "size_bytes": 1,
        "signatures": [],
        "partitions": [],
        "vg": None,
    }
    base.update(over)
    return base


def sig(kind):
    return {"offset": "0x0", "type": kind, "source": "wipefs"}


@pytest.mark.parametrize(
    "disk, state, words",
    [
        (entry(exists=False, block=False), "missing", "does not exist"),
        (entry(block=False), "not_block", "not a block device"),
        (entry(), "empty", "empty"),
        (entry(signatures=[sig("LVM2_member")], vg="data"), "ours", "volume group data"),
        (entry(signatures=[sig("LVM2_member")], vg="vg_other"), "foreign", "another volume group vg_other"),
        (entry(signatures=[sig("LVM2_member")]), "foreign", "in no volume group"),
        (entry(signatures=[sig("xfs")]), "foreign", "holds xfs"),
        (entry(signatures=[sig("gpt"), sig("PMBR")]), "foreign", "holds PMBR, gpt"),
        (entry(partitions=["vdb1"], signatures=[sig("gpt")]), "foreign", "partitions vdb1"),
    ],
)
def test_classify(disk, state, words):
    got_state, summary = data_disks.classify(disk, "data")
    assert got_state == state
    assert words in summary
