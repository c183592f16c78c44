"""kunlun-fleet --version: the release and the checkout's commit, exit 0."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_version_names_the_release_and_the_commit():
    proc = subprocess.run(
        [sys.executable, "-c", "import sys; from kunlun_fleet.cli import main; sys.exit(main())", "--version"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    out = proc.stdout.strip()
    assert out.startswith("kunlun-fleet 0."), out
    assert head.stdout.strip()[:7] in out, out
