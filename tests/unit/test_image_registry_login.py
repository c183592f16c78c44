"""The image build's registry login (roles/image/tasks/build.yml) never outlives the pull it is
for: it is written to a Docker client configuration of the run's own (docker_login's
config_path), the pull reads it there (DOCKER_CONFIG, which the Docker SDK inside
community.docker reads: plugins/module_utils/_api/utils/config.py, find_config_file), and the
block's `always` removes that directory whether the pull worked or failed, in check mode too.
Before, the credential stayed in the builder's /root/.docker/config.json."""

from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
TASKS = ROOT / "roles" / "image" / "tasks"


def walk(tasks, parents=()):
    """(task, enclosing blocks) of a task list, blocks' block/rescue/always included."""
    for task in tasks or []:
        yield task, parents
        for key in ("block", "rescue", "always"):
            yield from walk(task.get(key), parents + (task,))


def test_the_registry_login_is_removed_with_its_own_configuration_after_the_pull():
    tasks = list(walk(yaml.safe_load((TASKS / "build.yml").read_text())))
    logins = [(task, parents) for task, parents in tasks if "community.docker.docker_login" in task]
    assert len(logins) == 1, "build.yml logs in to the base image's registry once"
    login, parents = logins[0]
    args = login["community.docker.docker_login"]
    assert login.get("no_log") is True and args.get("state", "present") == "present"
    assert args.get("config_path"), "docker_login without config_path writes root's ~/.docker/config.json"
    directory = args["config_path"].rsplit("/", 1)[0]
    block = parents[-1]
    assert login in block["block"]
    made = [t for t in block["block"] if t.get("ansible.builtin.tempfile", {}).get("state") == "directory"]
    assert made and "{{ %s.path }}" % made[0]["register"] == directory, (made, directory)
    assert made[0].get("check_mode") is False
    # Whatever happens in the block (a failed login or pull), the directory goes.
    removed = [
        t
        for t in block.get("always") or []
        if t.get("ansible.builtin.file", {}).get("path") == directory
        and t["ansible.builtin.file"].get("state") == "absent"
    ]
    assert removed, "no `always` of the login's block removes %s" % directory
    assert removed[0].get("check_mode") is False  # a check run leaves nothing either
    # Every other Docker task of the block reads the login where it was written.
    for task in block["block"]:
        if task is not login and any(key.startswith("community.docker.") for key in task):
            assert (task.get("environment") or {}).get("DOCKER_CONFIG") == directory, task["name"]


def test_no_other_task_of_the_role_logs_in():
    for path in sorted(TASKS.glob("*.yml")):
        if path.name != "build.yml":
            assert "docker_login" not in path.read_text(), path
