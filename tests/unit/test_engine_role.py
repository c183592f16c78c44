"""roles/engine, read as data: every variable its defaults use is defined (by the role or
its dependency), packages from the distribution come through the shared package task, and
no task embeds a program (that is what library/engine_state.py and engine_debs.py are for)."""

import os

import jinja2
import jinja2.meta
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ROLE = os.path.join(ROOT, "roles", "engine")
# Variables Ansible gives every play.
MAGIC = {"ansible_facts", "inventory_hostname", "groups", "hostvars", "playbook_dir", "ansible_check_mode", "omit"}


def load(*parts):
    with open(os.path.join(*parts)) as fh:
        return yaml.safe_load(fh)


def tasks(data):
    """Every task of a task list, the tasks inside blocks included."""
    for task in data or []:
        yield task
        for key in ("block", "rescue", "always"):
            yield from tasks(task.get(key))


def role_tasks():
    for name in sorted(os.listdir(os.path.join(ROLE, "tasks"))):
        for task in tasks(load(ROLE, "tasks", name)):
            yield name, task


def names_used(value):
    """Variable names a (possibly templated) default value reads."""
    env = jinja2.Environment()
    if isinstance(value, str):
        return jinja2.meta.find_undeclared_variables(env.parse(value)) if "{{" in value else set()
    if isinstance(value, dict):
        return set().union(*[names_used(v) for v in value.values()] or [set()])
    if isinstance(value, list):
        return set().union(*[names_used(v) for v in value] or [set()])
    return set()


def test_every_variable_the_defaults_use_is_defined():
    defaults = load(ROLE, "defaults", "main.yml")
    deps = [d["role"] if isinstance(d, dict) else d for d in load(ROLE, "meta", "main.yml")["dependencies"]]
    known = set(defaults) | MAGIC
    # The distribution's values the role loads first (vars/<OS>.yml; tests/unit/test_os_vars.py).
    for name in sorted(os.listdir(os.path.join(ROLE, "vars"))):
        known |= set(load(ROLE, "vars", name))
    for dep in deps:
        known |= set(load(ROOT, "roles", dep, "defaults", "main.yml"))
        if os.path.exists(os.path.join(ROOT, "roles", dep, "vars", "main.yml")):
            known |= set(load(ROOT, "roles", dep, "vars", "main.yml"))
    used = set().union(*[names_used(v) for v in defaults.values()])
    assert used - known == set(), "roles/engine/defaults/main.yml uses undefined %s" % sorted(used - known)


def test_the_bundle_is_the_projects_bundle():
    defaults = load(ROLE, "defaults", "main.yml")
    text = open(os.path.join(ROLE, "tasks", "checks.yml")).read() + open(os.path.join(ROLE, "tasks", "main.yml")).read()
    assert "kunlun_stack_bundle_dir" in text and "kunlun_bundle_dir" not in text.replace("kunlun_stack_bundle_dir", "")
    assert defaults["engine_bundle_debs_subdir"] == "debs"
    specs = load(ROLE, "meta", "argument_specs.yml")["argument_specs"]["main"]["options"]
    assert set(specs) == set(defaults), "argument_specs and defaults differ: %s" % sorted(set(specs) ^ set(defaults))


def test_distribution_packages_come_through_the_shared_task():
    shared = [
        t for _, t in role_tasks() if (t.get("ansible.builtin.include_role") or {}).get("tasks_from") == "packages"
    ]
    assert len(shared) == 1, "the engine role must install engine_distro_packages with kunlun_stack's packages task"
    task = shared[0]
    assert task["ansible.builtin.include_role"]["name"] == "kunlun_stack"
    assert task["vars"] == {"kunlun_stack_packages": "{{ engine_distro_packages }}"}
    assert task["when"] == "engine_source == 'distro'"
    for name, t in role_tasks():
        argv = (t.get("ansible.builtin.command") or {}).get("argv") or ""
        assert "apt-cache" not in str(argv), "%s: %s probes apt itself" % (name, t["name"])
        apt = t.get("ansible.builtin.apt") or {}
        assert "engine_distro_packages" not in str(apt.get("name", "")), "%s: %s" % (name, t["name"])


def test_no_task_embeds_a_program():
    for name, task in role_tasks():
        for module in ("ansible.builtin.command", "ansible.builtin.shell"):
            args = task.get(module)
            if args is None:
                continue
            text = str(args)
            assert "python3" not in text and "import " not in text, "%s: %s embeds a program" % (name, task["name"])


def test_daemon_json_is_read_by_the_module_not_slurped():
    checks = [t for _, t in role_tasks()]
    assert not [t for t in checks if "ansible.builtin.slurp" in t]
    state = [t for t in checks if "engine_state" in t]
    assert len(state) == 1 and state[0]["engine_state"]["daemon_json"] == "{{ engine_daemon_json }}"
    assert "failed_when" not in state[0]
