"""site.yml's stages: which plays each holds, the stages chosen with --from/--only, and the
playbook that runs only those."""

from pathlib import Path

from kunlun_fleet.runner.checkout import root
from kunlun_fleet.runner.exit_codes import Refused


def playbook_plays(path):
    """The play names of a playbook, following its import_playbook lines."""
    import yaml

    path = Path(path)
    names = []
    for entry in yaml.safe_load(path.read_text()) or []:
        imported = entry.get("ansible.builtin.import_playbook") or entry.get("import_playbook")
        if imported:
            names += playbook_plays(path.parent / imported)
        elif entry.get("name"):
            names.append(entry["name"])
    return names


def site_stages(base=None):
    """site.yml's stages in its order: [{stage, name, import, when, plays}], the stage
    named after its playbook (playbooks/<stage>.yml)."""
    import yaml

    base = Path(base or root())
    stages = []
    for entry in yaml.safe_load((base / "site.yml").read_text()) or []:
        imported = entry.get("ansible.builtin.import_playbook") or entry.get("import_playbook")
        if not imported:
            continue
        stage = {
            "stage": Path(imported).stem,
            "name": entry.get("name", Path(imported).stem),
            "import": str((base / imported).resolve()),
            "plays": playbook_plays(base / imported),
        }
        if "when" in entry:
            stage["when"] = entry["when"]
        stages.append(stage)
    return stages


def select_stages(stages, start=None, only=None):
    """The stages to run, in site.yml's order: all of them, those from `start` on, or
    those named in `only` (a comma-separated list). An unknown name is refused."""
    names = [s["stage"] for s in stages]
    wanted = [start] if start else [n.strip() for n in (only or "").split(",") if n.strip()]
    unknown = [n for n in wanted if n not in names]
    if unknown:
        raise Refused(
            "no stage %s; the stages of site.yml, in order: %s"
            % (", ".join(repr(n) for n in unknown), ", ".join(names))
        )
    if start:
        return stages[names.index(start) :]
    if only is not None:
        if not wanted:
            raise Refused("--only needs one stage or more; the stages: %s" % ", ".join(names))
        return [s for s in stages if s["stage"] in wanted]
    return list(stages)


def write_selection(stages, path):
    """A playbook of site.yml's import lines for the chosen stages (absolute paths, so it
    runs from the run's directory; each imported play keeps its playbook_dir)."""
    import yaml

    plays = []
    for s in stages:
        entry = {"name": s["name"], "ansible.builtin.import_playbook": s["import"]}
        if "when" in s:
            entry["when"] = s["when"]
        plays.append(entry)
    Path(path).write_text(
        "---\n# Written by kunlun-fleet deploy --from/--only: site.yml's stages %s.\n%s"
        % (", ".join(s["stage"] for s in stages), yaml.safe_dump(plays, sort_keys=False))
    )
    return path
