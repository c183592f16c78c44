"""The command lines of the systemd units the roles write (kunlun-serve, kunlun-gateway,
kunlun-watchdog, kunlun-registry, the exporters): every value from the inventory or a role's
defaults reaches the program as one argument, exactly as written - a space, a quote, a
backslash, a % or a $ in it never splits it or gets expanded. Each unit is rendered by
Ansible's own templating (as the template module does), then read back by systemd itself:
`systemd-analyze verify` at debug level dumps every command line of the unit from the argv
it parsed (systemd's own quoting of it, decoded here), and systemd's one expansion left at
exec time, `$$` to `$`, is applied as systemd.service(5) "Command lines" says.

How a hostile value is checked: the unit is rendered twice, once with a plain placeholder and
once with the hostile value; systemd's argv of the second must be the first's with the
placeholder replaced by the value inside the same argument, and nothing else changed."""

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from kunlun_fleet.bundle import load_pins as stack_pins
from plugins.filter.serving import vllm_argv
from plugins.filter.systemd import systemd_quote

ROOT = Path(__file__).resolve().parents[2]
ROLES = ROOT / "roles"
# What an inventory may well hold: spaces, quotes, a backslash, systemd's specifier and
# variable characters, a lone ; (systemd's separator of two command lines).
HOSTILE = "a \"b\" 'c' \\d 100% %n $HOME ${X} $$ ;"


# ---------------------------------------------------------------- the filter
@pytest.mark.parametrize(
    "value, word",
    [
        ("plain", "plain"),
        ("/dev/xpu0:/dev/xpu0", "/dev/xpu0:/dev/xpu0"),
        ("--flag=value,other", "--flag=value,other"),
        (128, "128"),
        (0.75, "0.75"),
        ("100%", "100%%"),
        ("$HOME", "$$HOME"),
        ("a b", '"a b"'),
        ('say "hi"', '"say \\"hi\\""'),
        ("it's", '"it\'s"'),
        ("back\\slash", '"back\\\\slash"'),
        ("two\nlines\tand\x01", '"two\\nlines\\tand\\x01"'),
        ("", '""'),
        (";", '";"'),
        ("a b 50% ${X}", '"a b 50%% $${X}"'),
    ],
)
def test_a_value_becomes_one_word(value, word):
    assert systemd_quote(value) == word


def test_a_list_becomes_a_word_each_and_a_nul_is_refused():
    assert systemd_quote(["--x", "a b"]) == ["--x", '"a b"']
    # Another setting's words (RequiresMountsFor=): specifiers, no variables.
    assert systemd_quote("/srv/a b 100% $X", command=False) == '"/srv/a b 100%% $X"'
    with pytest.raises(ValueError, match="NUL"):
        systemd_quote("a\x00b")


# ---------------------------------------------------------------- systemd's reading
def _analyze():
    analyze = shutil.which("systemd-analyze")
    if not analyze:
        pytest.fail("systemd-analyze is missing: install Debian's systemd package")
    return analyze


_C_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "a": "\a", "b": "\b", "f": "\f", "v": "\v"}


def _dumped_words(line):
    """The argv of one `Command Line:` of systemd's dump (quote_command_line: a word with a
    special character in double quotes, \\ " ` $ backslash-escaped, control characters as C
    escapes)."""
    words, i = [], 0
    while i < len(line):
        if line[i] == " ":
            i += 1
            continue
        if line[i] != '"':
            end = line.find(" ", i)
            end = len(line) if end < 0 else end
            words.append(line[i:end])
            i = end
            continue
        i, word = i + 1, []
        while line[i] != '"':
            c = line[i]
            if c == "\\":
                n = line[i + 1]
                if n in "\\\"`$'":
                    word.append(n)
                    i += 2
                elif n in _C_ESCAPES:
                    word.append(_C_ESCAPES[n])
                    i += 2
                elif n == "x":
                    word.append(chr(int(line[i + 2 : i + 4], 16)))
                    i += 4
                else:  # octal
                    word.append(chr(int(line[i + 1 : i + 4], 8)))
                    i += 4
            else:
                word.append(c)
                i += 1
        words.append("".join(word))
        i += 1
    return words


def _at_exec(word):
    """What systemd passes the program for a stored argument: $$ is a literal $ (no other $
    may be left: it would be expanded)."""
    assert re.fullmatch(r"(?:[^$]|\$\$)*", word), "systemd would expand a variable in %r" % word
    return word.replace("$$", "$")


def systemd_reads(name, text, tmp_path):
    """{setting: argv} of the unit's Exec lines as systemd parsed them; and the complaints
    systemd-analyze made about the unit file's lines."""
    directory = tmp_path / ("unit-%d" % len(list(tmp_path.iterdir())))
    directory.mkdir()
    (directory / name).write_text(text)
    proc = subprocess.run(
        [_analyze(), "verify", str(directory / name)],
        env=dict(os.environ, SYSTEMD_LOG_LEVEL="debug"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    lines = proc.stdout.splitlines()
    if "\t-> Unit %s:" % name not in lines:  # systemd did not load it at all
        said = [line for line in proc.stderr.splitlines() if name in line]
        pytest.fail("systemd did not load %s:\n%s" % (name, "\n".join(said)))
    start = lines.index("\t-> Unit %s:" % name)
    found, setting = {}, None
    for line in lines[start + 1 :]:
        if line.startswith("\t-> Unit "):
            break
        m = re.match(r"^\t\t-> (Exec\w+):$", line)
        if m:
            setting = m.group(1)
        elif line.startswith("\t\t\tCommand Line: ") and setting:
            found[setting] = [_at_exec(w) for w in _dumped_words(line[len("\t\t\tCommand Line: ") :])]
    complaints = [line for line in proc.stderr.splitlines() if str(directory / name) + ":" in line]
    return found, complaints


def test_the_reading_is_systemds_own(tmp_path):
    """The decoder against a unit written by hand as systemd.service(5) describes it: quotes,
    %% and $$, C escapes - and a plain unquoted $VAR, which systemd would expand (refused)."""
    unit = '[Service]\nExecStart=/bin/echo "a b" 100%% $$HOME "q\\"q" "x\\\\y" "t\\tn" "" \';\' plain\n'
    found, complaints = systemd_reads("t.service", unit, tmp_path)
    assert found["ExecStart"] == ["/bin/echo", "a b", "100%", "$HOME", 'q"q', "x\\y", "t\tn", "", ";", "plain"]
    assert complaints == []
    with pytest.raises(AssertionError, match="would expand"):
        systemd_reads("u.service", "[Service]\nExecStart=/bin/echo $HOME\n", tmp_path)


# ---------------------------------------------------------------- the units
def render(template, variables):
    """A role template as ansible.builtin.template renders it (Ansible's Templar, the
    project's filters, trim_blocks, backslashes as written)."""
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar, trust_as_template

    templar = Templar(loader=DataLoader(), variables=variables)
    return templar.template(
        trust_as_template(Path(template).read_text()), escape_backslashes=False, overrides={"trim_blocks": True}
    )


def _yaml(path):
    return yaml.safe_load(Path(path).read_text()) if Path(path).exists() else {}


def role_variables(role, extra):
    """What a play of `role` sees on one host, kf-a, by default: kunlun_stack's defaults and
    role variables, the role's defaults, `extra` (the inventory), the role's variables."""
    from ansible.template import trust_as_template

    variables = {"ansible_managed": "Ansible managed", "playbook_dir": str(ROOT)}
    variables.update(stack_pins())
    variables.update(_yaml(ROLES / role / "defaults" / "main.yml"))
    variables.update(
        {
            "inventory_hostname": "kf-a",
            "groups": {"all": ["kf-a"], "xpu_servers": ["kf-a"], "gateways": ["kf-a"], "monitoring": ["kf-a"]},
            "hostvars": {"kf-a": {"ansible_host": "10.0.0.1"}},
            "ansible_play_hosts_all": ["kf-a"],
        }
    )
    variables.update(extra)
    variables.update(_yaml(ROLES / "kunlun_stack" / "vars" / "main.yml"))
    variables.update(_yaml(ROLES / role / "vars" / "main.yml"))
    variables.update(_yaml(ROLES / role / "vars" / "Debian.yml"))

    def trust(value):  # as Ansible trusts what an inventory and a role say
        if isinstance(value, str):
            return trust_as_template(value)
        if isinstance(value, dict):
            return {k: trust(v) for k, v in value.items()}
        if isinstance(value, list):
            return [trust(v) for v in value]
        return value

    return {k: (v if k in extra else trust(v)) for k, v in variables.items()}


def hostile_reading(tmp_path, role, template, name, plain, hostile, extra=None):
    """systemd's argv of the unit rendered with `plain` values, and with `hostile` ones
    (the same variables, {name: value}); the placeholders of `plain` are words of their own."""
    readings = []
    for values in (plain, hostile):
        text = render(ROLES / role / "templates" / template, role_variables(role, dict(extra or {}, **values)))
        found, complaints = systemd_reads(name, text, tmp_path)
        assert complaints == [], complaints
        readings.append(found)
    return readings


def replaced(argv, pairs):
    out = []
    for word in argv:
        for placeholder, value in pairs:
            word = word.replace(placeholder, value)
        out.append(word)
    return out


def test_the_serving_unit_passes_every_value_as_written(tmp_path):
    """The served model name, a serving flag's value (a site's kunlun_stack_serving_overrides)
    and the data volume's path, each with a space, quotes, a backslash, % and $ in it."""
    image = {"serve_run_image_id": "sha256:" + "0" * 64}
    plain = {
        "serve_served_model_name": "kfplainname",
        "kunlun_stack_serving_overrides": {"chat_template": "kfplainflag", "seed": "kfplainempty"},
        "kunlun_stack_data_root": "/srv/kfplainroot",
    }
    hostile = {
        "serve_served_model_name": HOSTILE,
        "kunlun_stack_serving_overrides": {"chat_template": "/t/" + HOSTILE, "seed": ""},
        "kunlun_stack_data_root": "/srv/new data 100%",
    }
    before, after = hostile_reading(
        tmp_path, "serve", "kunlun-serve.service.j2", "kunlun-serve.service", plain, hostile, image
    )
    pairs = [
        ("kfplainname", HOSTILE),
        ("kfplainflag", "/t/" + HOSTILE),
        ("kfplainempty", ""),
        ("/srv/kfplainroot", "/srv/new data 100%"),
    ]
    assert set(after) == {"ExecStartPre", "ExecStart", "ExecStop"}
    for setting in after:
        assert after[setting] == replaced(before[setting], pairs), setting
    argv = after["ExecStart"]
    assert argv[argv.index("--served-model-name") + 1] == HOSTILE
    assert argv[argv.index("--chat-template") + 1] == "/t/" + HOSTILE and argv[argv.index("--seed") + 1] == ""
    model = "/srv/new data 100%/newdata/models/" + stack_pins()["kunlun_stack_model"]["directory"]
    assert argv[argv.index("--model") + 1] == model
    # The plain unit's vLLM part is vllm_argv's of the effective flags, in its order.
    from ansible.template import Templar, trust_as_template

    variables = role_variables("serve", dict(image, **plain))
    effective = Templar(variables=variables).template(trust_as_template("{{ kunlun_stack_serving_effective }}"))
    plain_argv = before["ExecStart"]
    assert plain_argv[plain_argv.index("--served-model-name") + 2 :] == vllm_argv(effective)


def test_the_serving_unit_mounts_only_the_model_and_read_only(tmp_path):
    """The container gets the model directory read-only, never the whole data volume, and no
    volume it could write."""
    variables = role_variables("serve", {"serve_run_image_id": "sha256:" + "0" * 64})
    found, _ = systemd_reads(
        "kunlun-serve.service", render(ROLES / "serve/templates/kunlun-serve.service.j2", variables), tmp_path
    )
    argv = found["ExecStart"]
    volumes = [argv[i + 1] for i, word in enumerate(argv) if word in ("--volume", "-v", "--mount")]
    model = "/home/newdata/models/" + stack_pins()["kunlun_stack_model"]["directory"]
    assert "%s:%s:ro" % (model, model) in volumes, volumes
    assert all(v.endswith(":ro") for v in volumes), volumes
    assert not [v for v in volumes if v.split(":")[0] in ("/home/newdata", "/home")], volumes
    assert argv[argv.index("--model") + 1] == model


def test_the_gateway_and_watchdog_units_pass_every_value_as_written(tmp_path):
    urls = ["http://10.0.0.1:8000", "http://10.0.0.2:8000"]
    common = {"gateway_worker_urls": urls, "gateway_watchdog_names": {urls[0]: "kfplainhost"}}
    plain = {"gateway_log_dir": "/srv/kfplainlogs", "gateway_extra_args": ["--kfplainflag", "kfplainvalue"]}
    hostile = {"gateway_log_dir": "/srv/my logs 100%", "gateway_extra_args": ["--kfplainflag", HOSTILE]}
    before, after = hostile_reading(
        tmp_path, "gateway", "kunlun-gateway.service.j2", "kunlun-gateway.service", plain, hostile, common
    )
    pairs = [("/srv/kfplainlogs", "/srv/my logs 100%"), ("kfplainvalue", HOSTILE)]
    assert after["ExecStart"] == replaced(before["ExecStart"], pairs)
    argv = after["ExecStart"]
    assert argv[argv.index("--log-dir") + 1] == "/srv/my logs 100%" and argv[-1] == HOSTILE
    assert argv[argv.index("--worker-urls") + 1 : argv.index("--worker-urls") + 3] == urls
    # The watchdog names a worker by its inventory name.
    plain = {"gateway_watchdog_names": {urls[0]: "kfplainhost"}, "gateway_watchdog_state_dir": "/srv/kfplainstate"}
    hostile = {"gateway_watchdog_names": {urls[0]: HOSTILE}, "gateway_watchdog_state_dir": "/srv/state $X"}
    before, after = hostile_reading(
        tmp_path,
        "gateway",
        "kunlun-watchdog.service.j2",
        "kunlun-watchdog.service",
        plain,
        hostile,
        {"gateway_worker_urls": urls},
    )
    pairs = [("kfplainhost", HOSTILE), ("/srv/kfplainstate", "/srv/state $X")]
    assert after["ExecStart"] == replaced(before["ExecStart"], pairs)
    assert "%s=%s" % (urls[0], HOSTILE) in after["ExecStart"] and "/srv/state $X" in after["ExecStart"]


def test_the_registry_and_exporter_units_pass_every_value_as_written(tmp_path):
    plain = {"image_fleet_registry_config_dir": "/etc/kfplainreg"}
    hostile = {"image_fleet_registry_config_dir": "/etc/reg %i $X"}
    before, after = hostile_reading(
        tmp_path, "image", "kunlun-registry.service.j2", "kunlun-registry.service", plain, hostile
    )
    assert after["ExecStart"] == replaced(before["ExecStart"], [("/etc/kfplainreg", "/etc/reg %i $X")])
    assert after["ExecStart"][-1] == "/etc/reg %i $X/config.yml"
    unit = {"name": "kunlun-xpu-exporter", "description": "d", "output": "o.prom", "interval": 15, "timeout": 35}
    plain = {"monitoring_unit": dict(unit, args=["--xpu-smi", "/opt/kfplainsmi"])}
    hostile = {"monitoring_unit": dict(unit, args=["--xpu-smi", "/opt/" + HOSTILE])}
    before, after = hostile_reading(
        tmp_path, "monitoring", "exporter.service.j2", "kunlun-xpu-exporter.service", plain, hostile
    )
    assert after["ExecStart"] == replaced(before["ExecStart"], [("/opt/kfplainsmi", "/opt/" + HOSTILE)])
    assert after["ExecStart"][-2:] == ["--xpu-smi", "/opt/" + HOSTILE]
