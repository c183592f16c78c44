"""plugins/filter/bundle.py: the files found in a directory of the bundle, as paths in the bundle,
pinned against the Jinja the role computed it with before (rendered by Ansible's own
templar)."""

import pytest
from ansible.template import Templar, trust_as_template

from plugins.filter.bundle import bundle_paths


def jinja(expr, **variables):
    return Templar(variables=variables).template(trust_as_template(expr))


# roles/engine/tasks/checks.yml (the bundle's .debs), as it was.
DEBS_JINJA = """{{ engine_bundle_found.files | map(attribute='path') | map('basename') | sort
   | map('regex_replace', '^', engine_bundle_debs_subdir ~ '/') | list }}"""


def files(*paths):
    return {"files": [{"path": p, "mode": "0644", "size": 1} for p in paths], "matched": len(paths)}


@pytest.mark.parametrize(
    "found",
    [
        files(),
        files(
            "/srv/bundle/debs/runc_1.1.5_amd64.deb",
            "/srv/bundle/debs/docker.io_20.10.24_amd64.deb",
            "/srv/bundle/debs/containerd_1.6.20_amd64.deb",
        ),
        # Jinja's sort is case-insensitive: libX11 between libc6 and libz
        files("/b/debs/libz_1_amd64.deb", "/b/debs/libX11_1_amd64.deb", "/b/debs/libc6_1_amd64.deb"),
    ],
)
def test_the_debs_as_paths_in_the_bundle_sorted_by_name(found):
    expected = jinja(DEBS_JINJA, engine_bundle_found=found, engine_bundle_debs_subdir="debs")
    got = bundle_paths(found["files"], "debs")
    assert got == expected and type(got) is list


def test_bundle_paths_in_plain_words():
    assert bundle_paths(files("/b/debs/libz.deb", "/b/debs/libX11.deb", "/b/debs/libc6.deb")["files"], "debs") == [
        "debs/libc6.deb",
        "debs/libX11.deb",
        "debs/libz.deb",
    ]
