"""The roles' per-OS variables (roles/<role>/vars/<OS>.yml, loaded by
roles/kunlun_stack/tasks/os_vars.yml; docs/platforms.md, "Per-OS variables"), read as data
and templated as Ansible does, without touching a host: every OS file of a role defines the
same names, every private name the role uses is defined, the lookup picks Debian.yml for
Debian 12 and Ubuntu.yml for Ubuntu 22.04 and refuses what has no file, the loaded values
reach the public defaults and pass the argument specs, and every entry point that uses them
loads them first."""

import fnmatch
import functools
import re
from pathlib import Path

import pytest
import yaml

from kunlun_fleet import monitoring

ROOT = Path(__file__).resolve().parents[2]
ROLES = ROOT / "roles"
OS_VARS_TASKS = ROLES / "kunlun_stack" / "tasks" / "os_vars.yml"
# The roles that install distribution packages or rely on the distribution's paths
# (docs/platforms.md's table). A role added to it, or losing its files, fails here.
OS_ROLES = {"storage", "engine", "driver", "ca_trust", "image", "gateway", "monitoring", "serve", "firewall"}
OS_FILES = ("Debian.yml", "Ubuntu.yml")
FACTS = {
    "debian12": {
        "distribution": "Debian",
        "distribution_major_version": "12",
        "distribution_version": "12.11",
        "os_family": "Debian",
    },
    "ubuntu2204": {
        "distribution": "Ubuntu",
        "distribution_major_version": "22",
        "distribution_version": "22.04",
        "os_family": "Debian",
    },
    "centos9": {
        "distribution": "CentOS",
        "distribution_major_version": "9",
        "distribution_version": "9",
        "os_family": "RedHat",
    },
}


def load(path):
    return yaml.safe_load(Path(path).read_text())


def os_files(role):
    return sorted(p for p in (ROLES / role / "vars").glob("*.yml") if p.name != "main.yml")


def private_names(text, role):
    return set(re.findall(r"(?<![\w])(__%s_\w+)" % role, text))


def role_texts(role):
    """Where a role may name its variables: defaults, vars/main.yml, tasks, handlers, templates."""
    base = ROLES / role
    paths = [base / "defaults" / "main.yml", base / "vars" / "main.yml"]
    paths += sorted((base / "tasks").glob("*.yml")) + sorted((base / "handlers").glob("*.yml"))
    paths += sorted((base / "templates").glob("*"))
    return {p: p.read_text() for p in paths if p.is_file()}


@functools.lru_cache(maxsize=None)
def plugins():
    """Ansible's plugin loader, once (the lookups the task file calls: first_found, fileglob)."""
    from ansible.plugins.loader import init_plugin_loader

    init_plugin_loader()


def templar(variables):
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar

    plugins()
    return Templar(loader=DataLoader(), variables=monitoring._trust(variables))


def render(variables, value):
    from ansible.template import trust_as_template

    return templar(variables).template(
        monitoring._trust(value) if not isinstance(value, str) else trust_as_template(value)
    )


# ------------------------------------------------------------------ the files


def installs_packages(role):
    """Whether a role's tasks install distribution packages (the shared task or apt/package)."""
    for path in sorted((ROLES / role / "tasks").glob("*.yml")):
        text = path.read_text()
        if "tasks_from: packages" in text or re.search(r"ansible\.builtin\.(apt|package):", text):
            return True
    return False


def test_every_role_that_installs_packages_has_its_os_files():
    found = {p.parent.parent.name for p in ROLES.glob("*/vars/Debian.yml")}
    assert found == OS_ROLES
    installing = {r.name for r in ROLES.iterdir() if (r / "tasks").is_dir() and installs_packages(r.name)}
    # kunlun_stack is the shared package task itself: it installs what the caller names.
    assert installing - {"kunlun_stack"} <= OS_ROLES, "installs packages without vars/<OS>.yml"
    for role in sorted(OS_ROLES):
        assert [p.name for p in os_files(role)] == sorted(OS_FILES), role


@pytest.mark.parametrize("role", sorted(OS_ROLES))
def test_every_os_file_defines_the_same_private_names(role):
    files = {p.name: load(p) for p in os_files(role)}
    names = {name: set(data) for name, data in files.items()}
    debian = names["Debian.yml"]
    assert debian, role
    for name, keys in names.items():
        assert keys == debian, "%s: vars/%s and vars/Debian.yml differ: %s" % (role, name, sorted(keys ^ debian))
        for key in keys:
            assert key.startswith("__%s_" % role), "%s: %s is not private to the role" % (name, key)
            assert files[name][key] not in (None, "", []), "%s: %s is empty" % (name, key)
    # Ubuntu's file says it is not tested, at its top.
    head = (ROLES / role / "vars" / "Ubuntu.yml").read_text().split("\n__")[0]
    assert "NOT TESTED" in head and "must check" in head, role


@pytest.mark.parametrize("role", sorted(OS_ROLES))
def test_every_private_name_used_is_defined_and_every_one_defined_is_used(role):
    used = {}
    for path, text in role_texts(role).items():
        for name in private_names(text, role):
            used.setdefault(name, path.relative_to(ROOT))
    for path in os_files(role):
        defined = set(load(path))
        missing = set(used) - defined
        assert not missing, "%s uses %s, not in %s" % (
            role,
            sorted("%s (%s)" % (n, used[n]) for n in missing),
            path.relative_to(ROOT),
        )
        assert defined - set(used) == set(), "%s defines unused %s" % (
            path.relative_to(ROOT),
            sorted(defined - set(used)),
        )


# ------------------------------------------------------------------ choosing the file


def os_vars_block():
    (block,) = [t for t in load(OS_VARS_TASKS) if "block" in t]
    return block


def lookup_variables(role, facts):
    variables = dict(os_vars_block()["vars"])
    variables.update(
        role_path=str(ROLES / "kunlun_stack"),
        kunlun_stack_os_vars_role=role,
        inventory_hostname="host-1",
        ansible_facts=facts,
    )
    return variables


def first_existing(role, facts):
    """The candidates rendered for the facts, and the first that exists in the role's vars/."""
    names = render(lookup_variables(role, facts), "{{ kunlun_stack_os_vars_candidates }}")
    return names, next((n for n in names if (ROLES / role / "vars" / n).is_file()), None)


@pytest.mark.parametrize("role", sorted(OS_ROLES))
def test_debian_12_reads_debian_yml_and_ubuntu_22_04_reads_ubuntu_yml(role):
    names, first = first_existing(role, FACTS["debian12"])
    assert names == ["Debian_12.yml", "Debian.yml", "Debian.yml"] and first == "Debian.yml"
    names, first = first_existing(role, FACTS["ubuntu2204"])
    # Ubuntu's family is Debian: without its own file it would read Debian's.
    assert names == ["Ubuntu_22.yml", "Ubuntu.yml", "Debian.yml"] and first == "Ubuntu.yml"
    # The task's own lookup (ansible.builtin.first_found) agrees.
    for facts, expected in (("debian12", "Debian.yml"), ("ubuntu2204", "Ubuntu.yml")):
        found = render(lookup_variables(role, FACTS[facts]), "{{ kunlun_stack_os_vars_file }}")
        assert Path(found) == ROLES / role / "vars" / expected


def test_a_version_file_wins_and_the_family_is_the_last_resort():
    """The order itself: <distribution>_<major>.yml, <distribution>.yml, <os_family>.yml."""
    mint = {"distribution": "Linuxmint", "distribution_major_version": "21", "os_family": "Debian"}
    names, first = first_existing("storage", mint)
    assert names == ["Linuxmint_21.yml", "Linuxmint.yml", "Debian.yml"] and first == "Debian.yml"
    candidates = os_vars_block()["vars"]["kunlun_stack_os_vars_candidates"]
    assert [c.count("distribution_major_version") for c in candidates] == [1, 0, 0]
    assert "os_family" in candidates[-1]


def test_a_distribution_without_a_file_is_refused_by_name():
    variables = lookup_variables("storage", FACTS["centos9"])
    assert render(variables, "{{ kunlun_stack_os_vars_file }}") == []
    block = os_vars_block()["block"]
    check = block[0]["ansible.builtin.assert"]
    assert render(variables, "{{ %s }}" % check["that"]) is False
    message = render(variables, check["fail_msg"])
    assert "host-1 runs CentOS 9" in message and "family RedHat" in message
    assert "storage role has package names and paths for Debian, Ubuntu" in message
    assert "CentOS_9.yml, CentOS.yml, RedHat.yml" in message
    # Debian 12 passes the same check, and only then is a file loaded.
    assert render(lookup_variables("storage", FACTS["debian12"]), "{{ %s }}" % check["that"]) is True
    assert block[1]["ansible.builtin.include_vars"] == {"file": "{{ kunlun_stack_os_vars_file }}"}


def test_facts_are_read_only_when_missing_and_only_the_distribution():
    (setup,) = [t for t in load(OS_VARS_TASKS) if "ansible.builtin.setup" in t]
    assert setup["ansible.builtin.setup"] == {"gather_subset": ["!all", "!min", "distribution"]}
    when = "{{ %s }}" % setup["when"]
    assert render({"ansible_facts": FACTS["debian12"]}, when) is False, "facts known: nothing gathered"
    assert render({"ansible_facts": {}}, when) is True
    assert render({"ansible_facts": {"distribution": "Debian"}}, when) is True


# ------------------------------------------------------------------ the values reach the defaults


def role_variables(role, os_file):
    variables = {"inventory_hostname": "host-1", "groups": {}, "ansible_facts": FACTS["debian12"]}
    for path in (
        ROLES / "kunlun_stack" / "defaults" / "main.yml",
        ROLES / role / "defaults" / "main.yml",
        ROLES / "kunlun_stack" / "vars" / "main.yml",
        ROLES / role / "vars" / "main.yml",
    ):
        if path.is_file():
            variables.update(load(path))
    if os_file:
        variables.update(load(ROLES / role / "vars" / os_file))
    return variables


def public_from_os(role):
    """The role's public defaults made of its private per-OS names."""
    return {k: v for k, v in load(ROLES / role / "defaults" / "main.yml").items() if private_names(str(v), role)}


def test_the_loaded_values_reach_the_defaults():
    variables = role_variables("storage", "Debian.yml")
    assert render(variables, "{{ storage_packages }}") == ["lvm2", "xfsprogs", "rsync", "acl"]
    variables = role_variables("monitoring", "Debian.yml")
    assert render(variables, "{{ monitoring_textfile_dir }}") == "/var/lib/prometheus/node-exporter"
    # An inventory's value replaces the loaded one (the inventory outranks role defaults).
    variables = dict(role_variables("storage", "Debian.yml"), storage_packages=["lvm2"])
    assert render(variables, "{{ storage_packages }}") == ["lvm2"]


@pytest.mark.parametrize("role", sorted(OS_ROLES))
@pytest.mark.parametrize("os_file", OS_FILES)
def test_each_public_default_is_its_os_value_and_passes_the_argument_specs(role, os_file):
    from ansible.module_utils.common.arg_spec import ArgumentSpecValidator

    values = load(ROLES / role / "vars" / os_file)
    public = public_from_os(role)
    variables = role_variables(role, os_file)
    for name, raw in public.items():
        (private,) = private_names(raw, role)
        assert raw == "{{ %s | default(omit) }}" % private, "%s: %s" % (role, name)
        assert render(variables, "{{ %s }}" % name) == values[private]
    specs = load(ROLES / role / "meta" / "argument_specs.yml")["argument_specs"]
    for entry, spec in specs.items():
        options = {k: v for k, v in (spec.get("options") or {}).items() if k in public}
        if not options:
            continue
        for name, option in options.items():
            assert "vars/<OS>.yml" in option["description"], "%s %s: say where the default comes from" % (role, name)
        rendered = render(variables, {name: "{{ %s }}" % name for name in options})
        result = ArgumentSpecValidator(options).validate(rendered)
        assert not result.error_messages, (role, entry, os_file, result.error_messages)
    # The check can fail: a list option given a mapping is refused.
    for name in public:
        option = next(s["options"][name] for s in specs.values() if name in (s.get("options") or {}))
        if option["type"] == "list":
            assert ArgumentSpecValidator({name: option}).validate({name: {"a": 1}}).error_messages


@pytest.mark.parametrize("role", sorted(OS_ROLES))
def test_before_the_load_the_argument_check_skips_them(role):
    """Ansible checks a role's arguments before its first task: the values not loaded yet
    are omitted from that check (templated in a mapping, as the check does), not an error."""
    public = public_from_os(role)
    variables = role_variables(role, None)
    assert render(variables, {name: "{{ %s }}" % name for name in public}) == {}


# ------------------------------------------------------------------ every entry point loads them first


def task_items(data):
    for task in data or []:
        yield task
        for key in ("block", "rescue", "always"):
            yield from task_items(task.get(key))


def loads_os_vars(task, role):
    include = task.get("ansible.builtin.include_role") or {}
    return (
        include.get("name") == "kunlun_stack"
        and include.get("tasks_from") == "os_vars"
        and (task.get("vars") or {}).get("kunlun_stack_os_vars_role") == role
    )


def walk(role, name, seen=None):
    """A task file's tasks in order, imported and included files of the role in place."""
    seen = seen if seen is not None else set()
    if name in seen:
        return
    seen.add(name)
    for task in task_items(load(ROLES / role / "tasks" / name)):
        yield task
        for key in ("ansible.builtin.import_tasks", "ansible.builtin.include_tasks"):
            target = task.get(key)
            target = target.get("file") if isinstance(target, dict) else target
            for inner in re.findall(r"[\w.-]+\.yml", str(target or "")):
                yield from walk(role, inner, seen)


def uses_os_values(task, role, names):
    text = yaml.safe_dump(task)
    template = (task.get("ansible.builtin.template") or {}).get("src")
    if template and (ROLES / role / "templates" / template).is_file():
        text += (ROLES / role / "templates" / template).read_text()
    return any(re.search(r"(?<![\w])%s(?![\w])" % re.escape(n), text) for n in names)


def entry_points(role):
    """main, every entry point of the argument specs, and every tasks_from other files name."""
    names = {"main"} | set(load(ROLES / role / "meta" / "argument_specs.yml")["argument_specs"])
    pattern = re.compile(r"name: %s\n\s+tasks_from: (\w+)" % role)
    for path in list(ROOT.glob("playbooks/*.yml")) + list(ROLES.glob("*/tasks/*.yml")):
        names |= set(pattern.findall(path.read_text()))
    return sorted(n for n in names if (ROLES / role / "tasks" / ("%s.yml" % n)).is_file())


@pytest.mark.parametrize("role", sorted(OS_ROLES))
def test_every_entry_point_that_uses_them_loads_them_first(role):
    values = set(load(ROLES / role / "vars" / "Debian.yml"))
    derived = {
        k
        for k, v in (
            load(ROLES / role / "vars" / "main.yml") if (ROLES / role / "vars" / "main.yml").is_file() else {}
        ).items()
        if private_names(str(v), role)
    }
    names = values | set(public_from_os(role)) | derived
    users = []
    for entry in entry_points(role):
        loaded = False
        for task in walk(role, "%s.yml" % entry):
            if loads_os_vars(task, role):
                loaded = True
            elif uses_os_values(task, role, names):
                assert loaded, "%s: entry point %s uses %s in %r before loading vars/<OS>.yml" % (
                    role,
                    entry,
                    sorted(names),
                    task.get("name"),
                )
                users.append(entry)
    assert users, "%s: no entry point uses its per-OS values" % role


def test_the_entry_point_check_can_fail():
    """A task using a per-OS value ahead of the load is caught by the same walk."""
    tasks = [{"name": "early", "ansible.builtin.debug": {"msg": "{{ storage_packages }}"}}] + load(
        ROLES / "storage" / "tasks" / "main.yml"
    )
    names = {"storage_packages"}
    loaded, early = False, []
    for task in task_items(tasks):
        if loads_os_vars(task, "storage"):
            loaded = True
        elif uses_os_values(task, "storage", names) and not loaded:
            early.append(task["name"])
    assert early == ["early"]


# ------------------------------------------------------------------ preflight's inventory check


def test_preflight_reads_no_os_file_as_a_fixed_variable():
    """preflight's inventory check refuses an inventory setting a name of a role's
    vars/main.yml; the per-OS files are not read there (their names are private, and the
    public names stay the inventory's to set)."""
    tasks = load(ROLES / "preflight" / "tasks" / "controller.yml")
    (find,) = [t for t in tasks if "ansible.builtin.find" in t]
    patterns = find["ansible.builtin.find"]["patterns"]
    (read,) = [t for t in tasks if "preflight_vars_paths" in (t.get("vars") or {})]
    select = re.search(r"select\('search', '(.+?)'\)", read["vars"]["preflight_vars_paths"]).group(1)
    for path in ROLES.glob("*/vars/*.yml"):
        taken = any(fnmatch.fnmatch(path.name, p) for p in patterns) and re.search(select, str(path))
        assert bool(taken) == (path.name == "main.yml"), path
    # The inventory check knows the public names from the argument specs; a private name set
    # in an inventory is called a misspelling of the public one, which is what to set.
    import inventory_check

    specs = [load(p) for p in sorted(ROLES.glob("*/meta/argument_specs.yml"))]
    problems, _ = inventory_check.check(
        dict(
            groups={"all": ["a"], "xpu_servers": ["a"]},
            hosts={"a": {"ansible_host": "10.0.0.1", "__storage_packages": ["lvm2"]}},
            required_groups=[],
            required_host_vars={},
            argument_specs=specs,
            extra_known=[],
            similarity=0.8,
        )
    )
    assert problems == [
        "unknown variable __storage_packages (on a): did you mean storage_packages? Rename it in your inventory"
    ]


def test_preflight_runs_before_any_role_loads_them():
    """include_vars makes host variables, which the inventory check would read as the
    inventory's: site.yml (and kunlun-fleet deploy, which keeps its order) runs preflight first."""
    plays = load(ROOT / "site.yml")
    assert plays[0]["ansible.builtin.import_playbook"] == "playbooks/preflight.yml"
    preflight = load(ROOT / "playbooks" / "preflight.yml")
    assert [r["role"] for p in preflight for r in p.get("roles", [])] == ["preflight"]
