"""The execution environment's definition and its helpers (kunlun_fleet/ee.py).

The build and a run of site.yml in it are tested end to end in tests/e2e/test_site.py
(the second run of the converged fleet goes through ansible-navigator in the EE)."""

import yaml

from kunlun_fleet import ee


def controller_pins():
    return ee.pins(ee.os.path.join(ee.ROOT, "requirements.txt"))


def test_definition_is_valid_for_ansible_builder():
    from ansible_builder.ee_schema import validate_schema

    validate_schema(ee.definition())


def test_every_pin_the_ee_installs_is_the_controllers():
    """The EE must run what `kunlun-fleet deploy` runs: each package it installs at the
    controller's pin (a different ansible-core or collection would be another product)."""
    controller = controller_pins()
    differ = {}
    for line in ee.requirement_lines():
        name, version = line.split("==")
        name = ee.re.sub(r"[-_.]+", "-", name).lower()
        if name == "dumb-init":  # the container's init: no controller counterpart
            continue
        if controller.get(name) != version:
            differ[name] = (version, controller.get(name))
    assert differ == {}, "EE pin vs requirements.txt: %s" % differ


def test_the_core_the_collections_and_mitogen_are_all_installed():
    names = {line.split("==")[0].lower() for line in ee.requirement_lines()}
    assert {"ansible-core", "ansible-runner", "ansible", "mitogen", "bindep", "dumb-init"} <= names, names


def test_pins_reads_name_version_lines_only(tmp_path):
    req = tmp_path / "r.txt"
    req.write_text("# c\nJinja2==3.1.6\nruamel.yaml==0.19.1\nmolecule-plugins[docker]==25.8.12\nrich\n")
    assert ee.pins(str(req)) == {"jinja2": "3.1.6", "ruamel-yaml": "0.19.1", "molecule-plugins": "25.8.12"}


def test_navigator_command_mounts_each_path_at_the_same_place():
    cmd = ee.navigator_command(
        "kunlun-fleet/ee:abc",
        "site.yml",
        "inventories/prod",
        extra=["--limit", "batch1"],
        mounts=["/srv/keys"],
        container_options=["--network=host"],
        pass_env=["ANSIBLE_VAULT_PASSWORD_FILE"],
    )
    assert cmd[1:3] == ["run", "site.yml"]
    joined = " ".join(cmd)
    assert "--execution-environment-image kunlun-fleet/ee:abc" in joined
    assert "--pull-policy never" in joined
    assert "--execution-environment-volume-mounts /srv/keys:/srv/keys" in joined
    assert "--container-options=--network=host" in cmd
    assert "--pass-environment-variable ANSIBLE_VAULT_PASSWORD_FILE" in joined
    assert cmd[-2:] == ["--limit", "batch1"]


def test_plain_output_drops_the_runners_event_marks():
    # The first bytes of a real run's output (ansible-navigator 26.10, --mode stdout).
    raw = (
        "\x1b[KeyJ1dWlkIjogIjk3MjAzM2FjLWJjM2EtNDA3OC04OWViLTk1MmJhMzEwMTEwOSJ9\x1b[64D\x1b[K"
        "\x1b[Ke30=\x1b[4D\x1b[K"
        "\x1b[KeyJ1dWlkIjogIjAyZmMwMDAwLTAwMDEtNDZjMy1mNGNiLTAwMDAwMDAwMDAwNSJ9\x1b[64D\x1b[K\n"
        "PLAY [Preflight | validate the inventory] ***\n"
        "\x1b[Ke30=\x1b[4D\x1b[Kok: [kf-node-1]\n"
    )
    assert ee.plain_output(raw) == "\nPLAY [Preflight | validate the inventory] ***\nok: [kf-node-1]\n"


def test_navigator_settings_name_the_image_the_build_tags():
    with open(ee.os.path.join(ee.ROOT, "ansible-navigator.yml")) as fh:
        settings = yaml.safe_load(fh)["ansible-navigator"]
    assert settings["execution-environment"]["image"] == ee.IMAGE_REPO + ":latest"
    assert settings["execution-environment"]["enabled"] is True
    assert settings["mode"] == "stdout"


def test_no_rootfs_on_another_engine_is_refused_before_anything_runs(monkeypatch):
    monkeypatch.setattr(ee, "_image_id", lambda *a: (_ for _ in ()).throw(AssertionError("reached the engine")))
    try:
        ee.base_image(None, {"DOCKER_HOST": "unix:///run/other.sock"})
    except ee.EEError as exc:
        assert "--rootfs" in str(exc) and "/run/other.sock" in str(exc)
    else:
        raise AssertionError("no refusal")
