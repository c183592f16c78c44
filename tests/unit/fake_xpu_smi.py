"""A fake xpu-smi for tests that run the xpu_info module through Ansible: a shell script
that prints recorded outputs (tests/unit/fixtures/xpu) for the table, -q and -L."""

from pathlib import Path

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "xpu"

SCRIPT = """#!/bin/sh
case "$1" in
  -q) cat '{q}' ;;
  -L) cat '{l}' ;;
  '') cat '{t}' ;;
  *) echo "bad option $1" >&2; exit 2 ;;
esac
"""


def write_fake_smi(tmp_path, table, query, listing="xpu-smi-L_8.txt"):
    """tmp_path/bin/xpu-smi printing the named fixtures; returns its path."""
    smi = tmp_path / "bin" / "xpu-smi"
    smi.parent.mkdir(exist_ok=True)
    smi.write_text(SCRIPT.format(q=FIXTURES / query, l=FIXTURES / listing, t=FIXTURES / table))
    smi.chmod(0o755)
    return smi
