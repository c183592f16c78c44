"""Every repository path the documentation cites exists (docs/*.md, README.md, roles/*/README.md).

A citation is a path in backticks (`docs/image.md`, `roles/serve/tasks/ready.yml`), a bare
path that starts with one of the repository's top-level entries (docs/storage.md in a
sentence) or a relative markdown link target. Only paths into this repository are judged:
the first component must be a top-level entry of the checkout that is not ignored by
.gitignore; a role-relative path (`tasks/worker.yml`, `templates/haproxy.cfg.j2`) is judged
in the role a README belongs to (roles/<role>/README.md, docs/<role>.md), and elsewhere must
exist in the checkout or in some role. Not judged: paths
on the target host (/etc/..., /home/...), what a run generates (anything .gitignore names:
reports/, .cache/, inventories/sim/hosts.yml), and other projects' files a doc names as
theirs (EXTERNAL below). A placeholder (`playbooks/<stage>.yml`, `playbooks/NAME.yml`)
needs the directory before it; a glob (`tests/unit/test_engine_*.py`) needs one match.
"""

import fnmatch
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

DOCS = sorted(ROOT.glob("docs/*.md")) + [ROOT / "README.md"] + sorted(ROOT.glob("roles/*/README.md"))

# Files of other projects that a doc names by their own path (the doc says whose they are).
EXTERNAL = {
    ("docs/image.md", "docs/source/installation.md"): "vLLM-Kunlun's installation guide",
    ("docs/target.md", "docs/devices/README_XPU.md"): "PaddlePaddle/ERNIE's device notes",
    ("docs/target.md", "docs/hardware_support/xpu/xpu-p800_install_cn.md"): "PaddlePaddle/docs' P800 guide",
}

# Example names the docs use for what an operator makes (not in the repository).
EXAMPLES = {
    "inventories/site-a": "the operator's inventory: cp -r inventories/example inventories/site-a",
}

# The directories of a role, for role-relative citations.
ROLE_PARTS = {"tasks", "templates", "defaults", "meta", "vars", "files", "handlers"}
ROLES = sorted(p for p in (ROOT / "roles").iterdir() if p.is_dir())

BACKTICKED = re.compile(r"`([^`\n]+)`")
LINK = re.compile(r"\]\(([^)\s]+)\)")
PATH_CHARS = r"[\w.<>*{}$@+/-]"


def gitignore_patterns():
    lines = (ROOT / ".gitignore").read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


IGNORED = gitignore_patterns()


def ignored(path):
    """Whether .gitignore names the path or a directory above it (the subset of its rules used here)."""
    parts = path.strip("/").split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    for pattern in IGNORED:
        anchored = pattern.strip("/")
        if "/" in pattern.rstrip("/"):
            if any(fnmatch.fnmatch(p, anchored) for p in prefixes):
                return True
        elif any(fnmatch.fnmatch(part, anchored) for part in parts):
            return True
    return False


TOP = sorted(p.name for p in ROOT.iterdir() if p.name != ".git" and not ignored(p.name))
TOP_DIRS = "|".join(re.escape(t) for t in TOP if (ROOT / t).is_dir())
BARE = re.compile(r"(?<![\w./<>*{}$@+-])((?:%s)/%s*)" % (TOP_DIRS, PATH_CHARS))


# Upper-case names that are real files, not placeholders like NAME or INV.
UPPER_FILES = {"README", "MANIFEST", "LICENSE", "CHANGELOG", "NOTICE"}


def placeholder(part):
    stem = part.split(".")[0]
    upper = re.fullmatch(r"[A-Z][A-Z0-9_]*", stem) is not None and stem not in UPPER_FILES
    return "<" in part or "{" in part or "$" in part or upper


def exists(base, path):
    """A path exists under base; a glob matches something; a placeholder's directory exists."""
    parts = path.rstrip("/").split("/")
    if any(placeholder(p) for p in parts):
        fixed = []
        for p in parts:
            if placeholder(p):
                break
            fixed.append(p)
        return (base.joinpath(*fixed)).is_dir()
    if "*" in path:
        return any(base.glob(path.rstrip("/")))
    return (base / path).exists()


def citations(doc):
    """(path, where to resolve it) for every repository path cited in doc."""
    rel = doc.relative_to(ROOT).as_posix()
    role = None
    if doc.parent.parent.name == "roles":
        role = doc.parent
    elif doc.parent.name == "docs" and (ROOT / "roles" / doc.stem).is_dir():
        role = ROOT / "roles" / doc.stem
    text = doc.read_text()
    found = set()
    for m in BACKTICKED.finditer(text):
        span = m.group(1).strip()
        if re.fullmatch(PATH_CHARS + "+", span) and "/" in span:
            found.add(span)
    for m in BARE.finditer(text):
        found.add(m.group(1))
    links = set()
    for m in LINK.finditer(text):
        target = m.group(1).split("#")[0]
        if target and not re.match(r"[a-z][a-z0-9+.-]*:", target):
            links.add(target)
    out = []
    for path in sorted(found):
        path = path.rstrip(".,:;)")
        first = path.split("/")[0]
        if (rel, path) in EXTERNAL or any(path == e or path.startswith(e + "/") for e in EXAMPLES):
            continue
        if first in ROLE_PARTS:
            # Role-relative: in the doc's own role, else in the checkout or in some role ("that
            # role's `defaults/main.yml`").
            out.append((path, role) if role is not None else (path, None))
        elif first in TOP:
            if not ignored(path):
                out.append((path, ROOT))
    for target in sorted(links):
        resolved = (doc.parent / target).resolve()
        inside = resolved.is_relative_to(ROOT)
        if not target.startswith("/") and not (inside and ignored(resolved.relative_to(ROOT).as_posix())):
            out.append((target, doc.parent))  # a link out of the checkout is judged too
    return out


def test_the_docs_are_found():
    names = [d.relative_to(ROOT).as_posix() for d in DOCS]
    assert "README.md" in names and "docs/image.md" in names
    assert any(n.startswith("roles/") for n in names)


@pytest.mark.parametrize("doc", DOCS, ids=lambda d: d.relative_to(ROOT).as_posix())
def test_every_cited_repository_path_exists(doc):
    missing = [
        "%s (from %s)" % (path, base.relative_to(ROOT).as_posix() or "." if base else "any role")
        for path, base in citations(doc)
        if not (exists(base, path) if base else any(exists(b, path) for b in [ROOT] + ROLES))
    ]
    assert not missing, "%s cites paths that do not exist: %s" % (doc.relative_to(ROOT), ", ".join(missing))


def test_the_checker_finds_what_it_should():
    """The rules themselves: a missing doc is caught, host paths, generated files, placeholders are not."""
    assert exists(ROOT, "docs/image.md") and not exists(ROOT, "docs/serve.md")
    assert exists(ROOT, "playbooks/<stage>.yml") and exists(ROOT, "playbooks/NAME.yml")
    assert exists(ROOT, "tests/unit/test_*.py") and not exists(ROOT, "tests/unit/test_no_such_*.py")
    assert ignored("reports/acceptance.txt") and ignored("inventories/sim/hosts.yml")
    assert not ignored("docs/image.md")
    doc = ROOT / "docs" / "gateway.md"
    cited = dict(citations(doc))
    assert cited.get("templates/haproxy.cfg.j2") == ROOT / "roles" / "gateway"


def test_every_doc_the_product_sends_an_operator_to_exists():
    # Error messages, comments and argument specs send the operator to docs/<page>.md; one
    # sent them to docs/stacks.md, which never existed.
    cited = set()
    for top in ("library", "module_utils", "plugins", "roles", "playbooks", "kunlun_fleet", "inventories/example"):
        for path in (ROOT / top).rglob("*"):
            if path.is_file() and path.suffix in {".py", ".yml", ".j2", ".md", ""}:
                try:
                    text = path.read_text()
                except (UnicodeDecodeError, OSError):
                    continue
                for name in re.findall(r"\bdocs/([\w.-]+\.md)\b", text):
                    cited.add((name, str(path.relative_to(ROOT))))
    missing = sorted("docs/%s (cited in %s)" % pair for pair in cited if not (ROOT / "docs" / pair[0]).exists())
    assert cited and not missing, missing
