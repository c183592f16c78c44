"""Pytest plugin for honest runs (loaded by tests/conftest.py).

Under `make test` and in CI (KF_STRICT_SKIPS=1, or CI=true) a test that skips because
this machine lacks something is an error that names what is missing: a suite must not
pass by not running. A skip that is right on every machine says so in its reason,
which starts with "not applicable:" (NOT_APPLICABLE) and says why; `make test-fast` on a
developer's machine may skip.
With KF_SUITE_LOG set, every test outcome is appended there as a JSON line (the suite
runner, tests/suites.py, builds its tables from them)."""

import json
import os

import pytest

NOT_APPLICABLE = "not applicable:"


def strict():
    return os.environ.get("KF_STRICT_SKIPS") == "1" or os.environ.get("CI", "").lower() == "true"


def _skip_reason(rep):
    if isinstance(rep.longrepr, tuple) and len(rep.longrepr) == 3:
        return str(rep.longrepr[2]).removeprefix("Skipped: ")
    return str(rep.longrepr)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    reason = _skip_reason(rep) if rep.skipped else ""
    if rep.skipped and strict() and not hasattr(rep, "wasxfail") and not reason.startswith(NOT_APPLICABLE):
        rep.outcome = "failed"
        rep.longrepr = (
            "environment skip under make test / CI: %s\n"
            "This machine lacks what the reason names: `make test` installs it "
            "(scripts/install-system-deps.sh); a skip that is right on every machine "
            "gives a reason that starts with %r." % (reason, NOT_APPLICABLE)
        )


def pytest_runtest_logreport(report):
    """One JSON line per test outcome in $KF_SUITE_LOG (the suite runner's tables)."""
    path = os.environ.get("KF_SUITE_LOG")
    if not path or (report.when != "call" and report.passed):
        return
    entry = {
        "nodeid": report.nodeid,
        "when": report.when,
        "outcome": report.outcome,
        "duration": round(report.duration, 3),
    }
    if report.skipped:
        entry["reason"] = _skip_reason(report)
    with open(path, "a") as fh:
        fh.write(json.dumps(entry) + "\n")
