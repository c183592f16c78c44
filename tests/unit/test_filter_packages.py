"""plugins/filter/packages.py: which of a role's packages a host lacks, from dpkg-query's lines,
pinned against the Jinja the role computed it with before (rendered by Ansible's own
templar)."""

import pytest
from ansible.template import Templar, trust_as_template

from plugins.filter.packages import packages_missing


def jinja(expr, **variables):
    return Templar(variables=variables).template(trust_as_template(expr))


# roles/kunlun_stack/tasks/packages.yml, as it was.
MISSING_JINJA = """{{ kunlun_stack_packages | reject('in', kunlun_stack_packages_state.stdout_lines
   | select('search', ' installed$') | map('split', ' ') | map('first') | list) | list }}"""

DPKG = [
    "docker.io installed",
    "containerd not-installed",
    "runc config-files",
    "tini half-installed",
    "git installed",
    "",
]


@pytest.mark.parametrize(
    "packages, lines",
    [
        (["docker.io", "containerd", "runc", "tini", "git", "jq"], DPKG),
        (["docker.io", "git"], DPKG),
        (["jq", "docker.io", "jq"], DPKG),
        ([], DPKG),
        (["docker.io"], []),
    ],
)
def test_missing_is_every_package_dpkg_does_not_call_installed(packages, lines):
    expected = jinja(
        MISSING_JINJA, kunlun_stack_packages=packages, kunlun_stack_packages_state={"rc": 1, "stdout_lines": lines}
    )
    got = packages_missing(packages, lines)
    assert got == expected and type(got) is list


def test_missing_in_plain_words():
    assert packages_missing(["docker.io", "containerd", "runc", "tini", "git", "jq"], DPKG) == [
        "containerd",
        "runc",
        "tini",
        "jq",
    ]
