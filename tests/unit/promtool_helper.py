"""promtool for the monitoring tests: scripts/install-system-deps.sh puts Debian's in
/usr/local/bin (no Prometheus server on the controller). Missing, a test fails with the fix;
it never skips."""

import os
import shutil

import pytest

PROMTOOL_FIX = "promtool is missing: run `make system-deps` (scripts/install-system-deps.sh, as root) to install it"


def promtool():
    path = shutil.which("promtool", path="/usr/local/bin:" + os.environ.get("PATH", ""))
    if not path:
        pytest.fail(PROMTOOL_FIX)
    return path
