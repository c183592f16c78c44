"""kunlun_fleet/hostkeys.py: fingerprints as ssh-keygen prints them, known_hosts read and
written as OpenSSH does ([addr]:port, hashed names, markers), the statuses against live SSH
servers (paramiko, in this process, on 127.0.0.1), the CHANGED refusal that writes nothing,
`kunlun-fleet hostkeys` end to end on an inventory of its own (a vaulted variable, a
templated port), and bootstrap's refusals before any login."""

import io
import json
import os
import shlex
import socket
import stat
import subprocess
import threading
from pathlib import Path

import paramiko
import pytest

from kunlun_fleet import cli, hostkeys, runner, vault
from kunlun_fleet.hostkeys import Host

ROOT = Path(__file__).resolve().parents[2]


# ---------------------------------------------------------------- helpers


def keygen(tmp_path, kind, name=None):
    """A key pair made by ssh-keygen: (private path, 'type base64' of the public key)."""
    path = tmp_path / (name or "id_%s" % kind)
    args = ["ssh-keygen", "-q", "-t", kind, "-N", "", "-C", "test", "-f", str(path)]
    if kind == "rsa":
        args += ["-b", "2048"]
    subprocess.run(args, check=True)
    return path, " ".join(Path(str(path) + ".pub").read_text().split()[:2])


def load_key(path):
    for cls in (paramiko.Ed25519Key, paramiko.ECDSAKey, paramiko.RSAKey):
        try:
            return cls.from_private_key_file(str(path))
        except (paramiko.SSHException, ValueError):
            continue
    raise AssertionError("no paramiko key class reads %s" % path)


class SSHServer:
    """An SSH server in this process on 127.0.0.1 that offers host keys and nothing else."""

    def __init__(self, *keys):
        self.keys = list(keys)
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.stopped = False
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        while not self.stopped:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            transport = paramiko.Transport(conn)
            for key in self.keys:
                transport.add_server_key(key)
            try:
                transport.start_server(server=paramiko.ServerInterface())
            except Exception:  # a client that hangs up mid-handshake
                transport.close()

    def close(self):
        self.stopped = True
        self.sock.close()


@pytest.fixture
def keys(tmp_path_factory):
    d = tmp_path_factory.mktemp("keys")
    made = {}
    for name, kind in (("ed1", "ed25519"), ("ed2", "ed25519"), ("ec1", "ecdsa")):
        path, _ = keygen(d, kind, name)
        made[name] = load_key(path)
    return made


@pytest.fixture
def server(keys):
    srv = SSHServer(keys["ed1"])
    yield srv
    srv.close()


def line(address, port, key):
    return "%s %s %s\n" % (hostkeys.host_pattern(address, port), key.get_name(), key.get_base64())


# ---------------------------------------------------------------- fingerprints and patterns


@pytest.mark.parametrize("kind", ["ed25519", "ecdsa", "rsa"])
def test_fingerprint_is_what_ssh_keygen_prints(tmp_path, kind):
    path, public = keygen(tmp_path, kind)
    printed = subprocess.run(
        ["ssh-keygen", "-l", "-E", "sha256", "-f", str(path) + ".pub"], check=True, capture_output=True, text=True
    ).stdout.split()[1]
    assert printed.startswith("SHA256:") and not printed.endswith("=")
    assert hostkeys.fingerprint(public.split()[1]) == printed
    key = load_key(path)
    assert hostkeys.fingerprint(key) == printed == hostkeys.fingerprint(key.asbytes())


def test_host_pattern_is_openssh_s():
    assert hostkeys.host_pattern("10.20.1.11", 22) == "10.20.1.11"
    assert hostkeys.host_pattern("10.20.1.11", None) == "10.20.1.11"
    assert hostkeys.host_pattern("Node-1.Example", 2222) == "[node-1.example]:2222"


def test_parse_and_match_known_hosts(tmp_path, keys):
    ed, ec = keys["ed1"], keys["ec1"]
    # A hashed entry as `ssh-keygen -H` writes it.
    hashed = tmp_path / "hashed"
    hashed.write_text(line("10.0.0.9", 22, ed))
    subprocess.run(["ssh-keygen", "-q", "-H", "-f", str(hashed)], check=True, capture_output=True)
    hashed_line = next(line for line in hashed.read_text().splitlines() if line.startswith("|1|"))
    text = (
        "# a comment\n\n"
        "10.0.0.1,node-1 %s %s\n"
        % (ed.get_name(), ed.get_base64())
        + "[10.0.0.2]:2222 %s %s comment words\n" % (ec.get_name(), ec.get_base64())
        + "10.0.1.* %s %s\n" % (ed.get_name(), ed.get_base64())
        + "10.0.2.*,!10.0.2.7 %s %s\n" % (ed.get_name(), ed.get_base64())
        + "@revoked 10.0.0.3 %s %s\n" % (ed.get_name(), ed.get_base64())
        + "broken line\n"
        + "10.0.0.4 ssh-ed25519 not!base64\n"
        + hashed_line
        + "\n"
    )
    entries = hostkeys.parse_known_hosts(text)
    assert [e.lineno for e in entries] == [3, 4, 5, 6, 7, 10]
    first = entries[0]
    assert first.matches("10.0.0.1") and first.matches("NODE-1") and not first.matches("10.0.0.11")
    assert first.same_key(ed) and not first.same_key(ec) and first.fingerprint == hostkeys.fingerprint(ed)
    assert entries[1].matches("[10.0.0.2]:2222") and not entries[1].matches("10.0.0.2")
    assert entries[2].matches("10.0.1.200") and not entries[2].matches("10.0.10.1")
    assert entries[3].matches("10.0.2.6") and not entries[3].matches("10.0.2.7")
    assert entries[4].marker == "@revoked"
    assert entries[5].matches("10.0.0.9") and not entries[5].matches("10.0.0.1")


def test_append_keeps_the_file_and_writes_what_openssh_reads(tmp_path, keys):
    path = tmp_path / "inv" / ".ssh" / "known_hosts"
    hostkeys.append_known_hosts(path, [hostkeys.known_line("127.0.0.1", 2222, keys["ed1"])])
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert path.read_text() == "[127.0.0.1]:2222 %s %s\n" % (keys["ed1"].get_name(), keys["ed1"].get_base64())
    # Existing lines stay byte for byte, a missing last newline is added before the new line.
    old = "# mine\n|1|abc=|def= ssh-ed25519 AAAA  odd   spacing kept"
    path.write_text(old)
    hostkeys.append_known_hosts(path, [hostkeys.known_line("10.0.0.5", 22, keys["ec1"])])
    assert path.read_text() == old + "\n10.0.0.5 %s %s\n" % (keys["ec1"].get_name(), keys["ec1"].get_base64())
    # OpenSSH finds both forms.
    for name in ("[127.0.0.1]:2222", "10.0.0.5"):
        path.write_text(
            line(
                name.strip("[").split("]")[0], 2222 if "[" in name else 22, keys["ed1"] if "[" in name else keys["ec1"]
            )
        )
        found = subprocess.run(["ssh-keygen", "-F", name, "-f", str(path)], capture_output=True, text=True)
        assert found.returncode == 0 and name in found.stdout


# ---------------------------------------------------------------- live reads


def test_new_accept_known_against_a_live_server(tmp_path, server, keys):
    path = tmp_path / "inv" / ".ssh" / "known_hosts"
    host = Host("srv-1", "127.0.0.1", server.port)
    [r] = hostkeys.scan([host], path)
    assert (r.status, r.key_type, r.fingerprint) == ("new", "ssh-ed25519", hostkeys.fingerprint(keys["ed1"]))
    assert hostkeys.exit_code([r]) == hostkeys.NOT_ACCEPTED
    assert hostkeys.accept([r], path) == [line("127.0.0.1", server.port, keys["ed1"]).strip()]
    assert r.status == "accepted" and hostkeys.exit_code([r]) == 0
    assert path.read_text() == line("127.0.0.1", server.port, keys["ed1"])
    [r] = hostkeys.scan([host], path)
    assert r.status == "known"
    # OpenSSH's own lookup finds the entry for [127.0.0.1]:port.
    assert (
        subprocess.run(
            ["ssh-keygen", "-F", "[127.0.0.1]:%d" % server.port, "-f", str(path)], capture_output=True
        ).returncode
        == 0
    )


def test_changed_key_is_refused_and_nothing_is_written(tmp_path, server, keys):
    path = tmp_path / ".ssh" / "known_hosts"
    path.parent.mkdir()
    path.write_text("# kept\n" + line("127.0.0.1", server.port, keys["ed2"]))  # not the key it offers
    before = path.read_bytes()
    host = Host("srv-1", "127.0.0.1", server.port)
    [r] = hostkeys.scan([host], path)
    assert r.status == "CHANGED" and hostkeys.exit_code([r]) == hostkeys.REFUSED
    assert hostkeys.accept([r], path) == [] and r.status == "CHANGED"
    assert path.read_bytes() == before
    message = hostkeys.changed_message(r, path)
    assert "srv-1" in message and "CHANGED" in message
    assert hostkeys.fingerprint(keys["ed2"]) in message  # recorded
    assert hostkeys.fingerprint(keys["ed1"]) in message  # offered
    assert "line 2" in message and "out of band" in message
    fix = next(line.strip() for line in message.splitlines() if line.strip().startswith("ssh-keygen -R"))
    assert fix == "ssh-keygen -R %s -f %s" % (
        shlex.quote("[127.0.0.1]:%d" % server.port),
        shlex.quote(hostkeys._display(path)),
    )
    # The fix as printed works: the old entry goes, the key is new, then accepted and known.
    subprocess.run(shlex.split(fix.replace(hostkeys._display(path), str(path))), check=True, capture_output=True)
    assert "# kept" in path.read_text()
    [r] = hostkeys.scan([host], path)
    assert r.status == "new"
    hostkeys.accept([r], path)
    assert hostkeys.scan([host], path)[0].status == "known"


def test_an_entry_under_the_inventory_name_counts(tmp_path, server, keys):
    path = tmp_path / "known_hosts"
    host = Host("srv-1", "127.0.0.1", server.port)
    # The right key under the name only: OpenSSH looks up the address, so it is new.
    path.write_text(line("srv-1", server.port, keys["ed1"]))
    assert hostkeys.scan([host], path)[0].status == "new"
    # Another key under the name: changed, whatever the address says.
    path.write_text(line("srv-1", server.port, keys["ed2"]) + line("127.0.0.1", server.port, keys["ed1"]))
    [r] = hostkeys.scan([host], path)
    assert r.status == "CHANGED" and "ssh-keygen -R %s" % shlex.quote(
        "[srv-1]:%d" % server.port
    ) in hostkeys.changed_message(r, path)


def test_key_types_as_openssh_prefers_them(tmp_path, keys):
    both = SSHServer(keys["ed1"], keys["ec1"])
    only_ed = SSHServer(keys["ed1"])
    try:
        path = tmp_path / "known_hosts"
        # Only the ECDSA key recorded: the ECDSA key is asked for, and it matches.
        path.write_text(line("127.0.0.1", both.port, keys["ec1"]))
        [r] = hostkeys.scan([Host("both", "127.0.0.1", both.port)], path)
        assert (r.status, r.key_type) == ("known", keys["ec1"].get_name())
        # An ECDSA key recorded for a host that now offers only ed25519: changed.
        path.write_text(line("127.0.0.1", only_ed.port, keys["ec1"]))
        [r] = hostkeys.scan([Host("only-ed", "127.0.0.1", only_ed.port)], path)
        assert r.status == "CHANGED" and r.key_type == "ssh-ed25519" and "no longer offered" in r.detail
        # A @revoked key is refused even when a plain entry holds it too.
        path.write_text(
            line("127.0.0.1", only_ed.port, keys["ed1"]) + "@revoked " + line("127.0.0.1", only_ed.port, keys["ed1"])
        )
        [r] = hostkeys.scan([Host("only-ed", "127.0.0.1", only_ed.port)], path)
        assert r.status == "CHANGED" and "revoked" in r.detail
    finally:
        both.close()
        only_ed.close()


def test_a_key_exchange_that_times_out_is_unreached_not_a_changed_key(tmp_path, keys, monkeypatch):
    """A busy host (or controller) whose key exchange times out: paramiko's message names a
    key ("Key-exchange timed out waiting for key negotiation"), and that is no reason to ask
    again for any key type and call the host CHANGED."""
    path = tmp_path / "known_hosts"
    path.write_text(line("127.0.0.1", 2222, keys["ec1"]))
    asked = []

    def timed_out(address, port=22, timeout=hostkeys.TIMEOUT, key_types=None):
        asked.append(key_types)
        if key_types:
            raise paramiko.SSHException("Key-exchange timed out waiting for key negotiation")
        return keys["ed1"]

    monkeypatch.setattr(hostkeys, "read_host_key", timed_out)
    [r] = hostkeys.scan([Host("busy", "127.0.0.1", 2222)], path)
    assert r.status == hostkeys.UNREACHED and "timed out" in r.detail, (r.status, r.detail)
    assert asked == [[keys["ec1"].get_name()]]

    # The real answer of a host that no longer offers the recorded type still is CHANGED.
    def incompatible(address, port=22, timeout=hostkeys.TIMEOUT, key_types=None):
        if key_types:
            raise paramiko.ssh_exception.IncompatiblePeer("Incompatible ssh peer (no acceptable host key)")
        return keys["ed1"]

    monkeypatch.setattr(hostkeys, "read_host_key", incompatible)
    [r] = hostkeys.scan([Host("moved", "127.0.0.1", 2222)], path)
    assert r.status == "CHANGED" and "no longer offered" in r.detail


def test_unreachable_hosts(tmp_path):
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()  # nothing listens there now
    mute = socket.socket()
    mute.bind(("127.0.0.1", 0))
    mute.listen(4)

    def hang_up():
        conn, _ = mute.accept()
        conn.sendall(b"HTTP/1.0 400 nope\r\n\r\n")
        conn.close()

    threading.Thread(target=hang_up, daemon=True).start()
    try:
        results = hostkeys.scan(
            [Host("gone", "127.0.0.1", port), Host("web", "127.0.0.1", mute.getsockname()[1])],
            tmp_path / "known_hosts",
            timeout=2,
        )
    finally:
        mute.close()
    assert [r.status for r in results] == ["unreachable", "unreachable"]
    assert results[0].detail == "connection refused"
    assert hostkeys.exit_code(results) == hostkeys.UNREACHABLE
    assert not (tmp_path / "known_hosts").exists()


# ---------------------------------------------------------------- the command, on an inventory


def inventory(tmp_path, port, name="inv"):
    """An inventory directory as an operator has one: a vaulted variable (its password in
    .vault-password) and the port templated from a group variable."""
    inv = tmp_path / name
    (inv / "group_vars" / "all").mkdir(parents=True)
    (inv / "hosts.yml").write_text(
        "---\nall:\n  children:\n    xpu_servers:\n      hosts:\n"
        '        srv-1:\n          ansible_host: 127.0.0.1\n          ansible_port: "{{ test_ssh_port }}"\n'
        '        srv-2:\n          ansible_host: 127.0.0.1\n          ansible_port: "{{ test_ssh_port }}"\n'
    )
    (inv / "group_vars" / "all" / "connection.yml").write_text(
        "---\ntest_ssh_port: %d\nansible_user: root\nansible_ssh_private_key_file: %s/id_test\n"
        "ansible_ssh_common_args: -o UserKnownHostsFile={{ inventory_dir }}/.ssh/known_hosts "
        "-o StrictHostKeyChecking=yes\n" % (port, inv)
    )
    vault.ensure_api_key(str(inv))  # group_vars/all/vault.yml, inline !vault
    return inv


def run_cli(capsys, *args):
    code = cli.main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_hostkeys_command_on_an_inventory(tmp_path, server, keys, capsys):
    inv = inventory(tmp_path, server.port)
    hosts = hostkeys.read_inventory(str(inv))
    assert [(h.name, h.address, h.port, h.user) for h in hosts] == [
        ("srv-1", "127.0.0.1", server.port, "root"),
        ("srv-2", "127.0.0.1", server.port, "root"),
    ]
    assert hosts[0].key_file == "%s/id_test" % inv
    known = inv / ".ssh" / "known_hosts"
    fp = hostkeys.fingerprint(keys["ed1"])

    code, out, err = run_cli(capsys, "hostkeys", "-i", str(inv))
    assert code == 1 and not known.exists()
    assert [line.split()[-1] for line in out.splitlines()[1:3]] == ["new", "new"]
    assert fp in out and "ssh-ed25519" in out and "2 new host key(s), not accepted yet" in out
    assert "note: Ansible does not read" not in err  # the inventory points Ansible at the file

    code, out, err = run_cli(capsys, "hostkeys", "-i", str(inv), "--limit", "srv-1", "--accept")
    assert code == 0 and "accepted" in out
    assert known.read_text() == line("127.0.0.1", server.port, keys["ed1"])  # one line for one address
    assert stat.S_IMODE(known.stat().st_mode) == 0o600 and stat.S_IMODE(known.parent.stat().st_mode) == 0o700

    code, out, err = run_cli(capsys, "hostkeys", "-i", str(inv), "--json")
    data = json.loads(out)
    assert code == 0 and data["exit_code"] == 0 and [h["status"] for h in data["hosts"]] == ["known", "known"]
    assert data["hosts"][0]["fingerprint"] == fp and data["known_hosts"] == str(known)

    # A tampered line: CHANGED, exit 3, with --accept too, and the file is left as it was.
    known.write_text(line("127.0.0.1", server.port, keys["ed2"]))
    before = known.read_bytes()
    for extra in ([], ["--accept"]):
        code, out, err = run_cli(capsys, "hostkeys", "-i", str(inv), *extra)
        assert code == 3 and "CHANGED" in out
        assert "REFUSED srv-1" in err and fp in err and hostkeys.fingerprint(keys["ed2"]) in err
        assert "ssh-keygen -R" in err
        assert known.read_bytes() == before


def test_hostkeys_refuses_what_it_cannot_read(tmp_path, capsys):
    code, out, err = run_cli(capsys, "hostkeys", "-i", str(tmp_path / "none"))
    assert code == 3 and "no inventory" in err
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()
    inv = inventory(tmp_path, port)
    code, out, err = run_cli(capsys, "hostkeys", "-i", str(inv), "--limit", "nothere")
    assert code == 3 and "matches --limit nothere" in err
    # The vaulted value is never needed to find the hosts: a wrong vault password does not
    # stop the read (the host is then unreachable: nothing listens on its port).
    (inv / ".vault-password").write_text("not the password\n")
    code, out, err = run_cli(capsys, "hostkeys", "-i", str(inv), "--limit", "srv-1", "--timeout", "1")
    assert code == 4 and "unreachable: connection refused" in out


# ---------------------------------------------------------------- bootstrap before any login


def test_bootstrap_refuses_before_any_login(tmp_path, server, keys, capsys, monkeypatch):
    monkeypatch.setenv("KUNLUN_FLEET_ROOT", str(tmp_path / "checkout"))  # no run may start: no reports here
    inv = inventory(tmp_path, server.port)
    pw = tmp_path / "pw"
    pw.write_text("secret-password\n")
    os.chmod(pw, 0o600)
    code, out, err = run_cli(capsys, "bootstrap", "-i", str(inv))
    assert code == 3 and "--ask-pass" in err and "--password-file" in err
    os.chmod(pw, 0o644)
    code, out, err = run_cli(capsys, "bootstrap", "-i", str(inv), "--password-file", str(pw))
    assert code == 3 and "chmod 600" in err
    os.chmod(pw, 0o600)
    code, out, err = run_cli(
        capsys, "bootstrap", "-i", str(inv), "--password-file", str(pw), "--deploy-user", "Bad.User"
    )
    assert code == 3 and "--deploy-user" in err
    # No public key next to the private key the inventory names.
    code, out, err = run_cli(capsys, "bootstrap", "-i", str(inv), "--password-file", str(pw))
    assert code == 3 and "no public key %s/id_test.pub" % inv in err and "ssh-keygen -y -f" in err
    keygen(inv, "ed25519", "id_test")
    # Host keys not known yet: refused, with the command that records them.
    code, out, err = run_cli(capsys, "bootstrap", "-i", str(inv), "--password-file", str(pw))
    assert code == 3 and "not known yet" in err and "kunlun-fleet hostkeys -i %s --accept" % inv in err
    # A changed key: refused with the fix.
    known = inv / ".ssh" / "known_hosts"
    hostkeys.append_known_hosts(known, [line("127.0.0.1", server.port, keys["ed2"]).strip()])
    code, out, err = run_cli(capsys, "bootstrap", "-i", str(inv), "--password-file", str(pw))
    assert code == 3 and "REFUSED srv-1" in err and "ssh-keygen -R" in err
    assert "secret-password" not in out + err
    assert not (tmp_path / "checkout" / "reports").exists()
    # No ansible_ssh_private_key_file at all.
    conn = inv / "group_vars" / "all" / "connection.yml"
    conn.write_text("\n".join(line for line in conn.read_text().splitlines() if "private_key" not in line) + "\n")
    code, out, err = run_cli(capsys, "bootstrap", "-i", str(inv), "--password-file", str(pw))
    assert code == 3 and "sets no ansible_ssh_private_key_file" in err


def test_bootstrap_answers_the_prompts_and_masks_the_password(tmp_path):
    inv = inventory(tmp_path, 22)
    run = hostkeys._bootstrap_run_class()(
        "bootstrap",
        "playbooks/bootstrap.yml",
        ["--ask-pass", "-K"],
        inventory=str(inv),
        output="json",
        stream=io.StringIO(),
    )
    run.password = "pw-0123"
    answers = run.passwords()
    assert sorted(answers.values()) == ["pw-0123", "pw-0123"]
    assert {p for p in answers} == {p for flags, label, p in runner.PROMPTS if label != "Vault password"}
    run.masker = runner.Masker()
    run.tracker = runner.Tracker(run.stages, run.masker)
    event = {
        "event": "runner_on_failed",
        "stdout": "fatal: pw-0123 leaked",
        "event_data": {"host": "srv-1", "task": "t", "play": "p", "res": {"msg": "pw-0123 here"}},
    }
    run.on_event(event)
    assert "pw-0123" not in json.dumps(event) and "pw-0123" not in run.out.getvalue()


def test_bootstrap_playbook_keeps_host_key_checking_and_names_no_password():
    text = (ROOT / "playbooks" / "bootstrap.yml").read_text()
    assert "StrictHostKeyChecking=yes" in text and "StrictHostKeyChecking=no" not in text
    assert "host_key_checking" not in text and "accept-new" not in text
    body = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    for name in ("ansible_password", "ansible_ssh_pass:", "ansible_ssh_password:", "ansible_become_pass"):
        assert name not in body
    assert "visudo -cf %s" in body and "NOPASSWD" in body
