#!/usr/bin/env python3
"""Stage and build the kunlun.fleet collection from the playbook project (no network).

The project keeps the layout its operators use (roles/, library/, module_utils/, plugins/,
ansible.cfg pointing at them). This script copies that into a collection's layout under
DEST/ansible_collections/kunlun/fleet and runs `ansible-galaxy collection build` on it:

  roles/*                 -> roles/*
  library/*.py            -> plugins/modules/*.py
  module_utils/*.py       -> plugins/module_utils/*.py
  plugins/<type>/*        -> plugins/<type>/*  (strategy, filter, ... whatever exists)
  collection/galaxy.yml, meta/, README.md, CHANGELOG.md -> the same names
  collection/tests/sanity/ignore-*.txt -> tests/sanity/ignore-*.txt (comment-only lines dropped)

The collection's own files live in collection/, not at the project's root, so the
playbook project does not look like a collection to ansible-lint or ansible-galaxy.

One rewrite makes the copy collection-safe, the sources stay as they are: in modules,
module_utils and plugins, `ansible.module_utils.<ours>` (the files of module_utils/) becomes
`ansible_collections.kunlun.fleet.plugins.module_utils.<ours>`; ansible-core's own
module_utils (basic, ...) are left alone. A role that ships one of our module_utils to a host
finds it with the `module_util_file` lookup (plugins/lookup), which knows both layouts.

Roles call our modules by short name (`xpu_info:`). A role inside a collection searches
its own collection first, so those names resolve to kunlun.fleet.<module> without a
rewrite.

Usage: scripts/build_collection.py [--dest .cache/collection] [--output-dir dist] [--no-build]
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NAMESPACE = "kunlun"
NAME = "fleet"
COLLECTION_UTILS = "ansible_collections.%s.%s.plugins.module_utils" % (NAMESPACE, NAME)
IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc", "*.pyo")


def own_module_utils(root: Path) -> list[str]:
    """The names of the project's module_utils (module_utils/*.py)."""
    return sorted(p.stem for p in (root / "module_utils").glob("*.py") if p.stem != "__init__")


def rewrite_imports(text: str, names: list[str]) -> str:
    """`ansible.module_utils.<name>` -> the collection's path, for our names only, in
    `from ... import` and `import ...` statements."""
    if not names:
        return text
    alt = "|".join(re.escape(n) for n in names)
    pattern = re.compile(r"^(\s*(?:from|import)\s+)ansible\.module_utils\.(%s)\b" % alt, re.MULTILINE)
    return pattern.sub(lambda m: "%s%s.%s" % (m.group(1), COLLECTION_UTILS, m.group(2)), text)


def strip_comments(text: str) -> str:
    """An ansible-test ignore file as ansible-test reads it: the checked-in copy's comment
    lines and blank lines (which ansible-test refuses) are dropped; an entry keeps its
    trailing `# why` (ansible-test strips that itself)."""
    out = [line.rstrip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    return "\n".join(out) + "\n" if out else ""


def copy_python(src_dir: Path, dest_dir: Path, names: list[str]) -> list[Path]:
    dest_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for src in sorted(src_dir.glob("*.py")):
        dest = dest_dir / src.name
        dest.write_text(rewrite_imports(src.read_text(encoding="utf-8"), names), encoding="utf-8")
        shutil.copymode(src, dest)
        written.append(dest)
    return written


def stage(root: Path, dest: Path) -> Path:
    """Write the collection's tree under dest/ansible_collections/kunlun/fleet (replacing
    what a previous run left there) and return that directory."""
    coll = dest / "ansible_collections" / NAMESPACE / NAME
    if coll.exists():
        shutil.rmtree(coll)
    coll.mkdir(parents=True)
    names = own_module_utils(root)

    meta = root / "collection"
    for name in ("galaxy.yml", "README.md", "CHANGELOG.md"):
        shutil.copy2(meta / name, coll / name)
    shutil.copytree(meta / "meta", coll / "meta", ignore=IGNORE)

    shutil.copytree(root / "roles", coll / "roles", ignore=IGNORE)

    copy_python(root / "library", coll / "plugins" / "modules", names)
    copy_python(root / "module_utils", coll / "plugins" / "module_utils", names)
    for plugin_dir in sorted(p for p in (root / "plugins").iterdir() if p.is_dir() and p.name != "__pycache__"):
        if plugin_dir.name in ("modules", "module_utils"):
            raise SystemExit("plugins/%s would shadow library/ or module_utils/" % plugin_dir.name)
        shutil.copytree(plugin_dir, coll / "plugins" / plugin_dir.name, ignore=IGNORE)
        for src in (coll / "plugins" / plugin_dir.name).rglob("*.py"):
            text = src.read_text(encoding="utf-8")
            new = rewrite_imports(text, names)
            if new != text:
                src.write_text(new, encoding="utf-8")

    sanity_src = meta / "tests" / "sanity"
    for ignore in sorted(sanity_src.glob("ignore-*.txt")):
        target = coll / "tests" / "sanity" / ignore.name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(strip_comments(ignore.read_text(encoding="utf-8")), encoding="utf-8")
    return coll


def galaxy_bin() -> str:
    """ansible-galaxy beside this Python (the project's .venv), else the one on PATH."""
    here = Path(sys.executable).parent / "ansible-galaxy"
    return str(here) if here.exists() else "ansible-galaxy"


def build(coll: Path, output_dir: Path) -> Path:
    output_dir.mkdir(parents=True, exist_ok=True)
    import yaml

    version = yaml.safe_load((coll / "galaxy.yml").read_text(encoding="utf-8"))["version"]
    tarball = output_dir / ("%s-%s-%s.tar.gz" % (NAMESPACE, NAME, version))
    subprocess.run(
        [galaxy_bin(), "collection", "build", "--force", "--output-path", str(output_dir), str(coll)],
        check=True,
    )
    if not tarball.exists():
        raise SystemExit("ansible-galaxy did not write %s" % tarball)
    return tarball


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dest", type=Path, default=ROOT / ".cache" / "collection", help="staging root")
    parser.add_argument("--output-dir", type=Path, default=ROOT / "dist", help="where the tarball goes")
    parser.add_argument("--no-build", action="store_true", help="stage only, no ansible-galaxy build")
    args = parser.parse_args(argv)
    coll = stage(ROOT, args.dest.resolve())
    print("staged %s" % coll)
    if not args.no_build:
        print("built %s" % build(coll, args.output_dir.resolve()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
