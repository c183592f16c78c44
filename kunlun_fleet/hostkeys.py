"""First contact with new hosts: their SSH host keys, and the controller's key on servers
that have only a password.

  kunlun-fleet hostkeys -i INV [--limit L] [--accept] [--json]
      every host's SSH host key, read over the network (paramiko, a few hosts at a time),
      its SHA256 fingerprint (as `ssh-keygen -lf` prints it) and its status against
      INV/.ssh/known_hosts: known, new, CHANGED or unreachable. --accept appends the new
      ones to that file (as OpenSSH writes them; existing lines are never touched).
  kunlun-fleet bootstrap -i INV (--ask-pass | --password-file FILE) [--deploy-user NAME]
      playbooks/bootstrap.yml through the runner, with the password answered at
      ansible-playbook's own -k prompt: the controller's public key into the login user's
      authorized_keys, optionally a deploy user with passwordless sudo; then a key login
      to every host proves it.

The hosts, their addresses, ports and users are read as Ansible reads them (ansible-core's
InventoryManager and VariableManager, the inventory's vault password file when it has one).

A host whose key CHANGED is refused in every mode and never written over: the operator
verifies the new key out of band and removes the old line with `ssh-keygen -R`.

Exit codes (hostkeys): 0 every host known (or accepted now), 1 new keys not accepted yet,
3 refused (a changed key; or the command line / inventory was refused), 4 unreachable
hosts. bootstrap: the runner's (docs/cli.md), 3 also when a host key is not known yet.
"""

import base64
import functools
import hashlib
import hmac
import json
import os
import re
import shlex
import socket
import stat
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

OK, NOT_ACCEPTED, FAILED, REFUSED, UNREACHABLE = 0, 1, 2, 3, 4
KNOWN, NEW, ACCEPTED, CHANGED, UNREACHED, SKIPPED = "known", "new", "accepted", "CHANGED", "unreachable", "skipped"
TIMEOUT = 5.0
WORKERS = 16
# Connections that are not SSH (a `local` host, a container): nothing to read.
SSH_CONNECTIONS = (
    None,
    "",
    "ssh",
    "ansible.builtin.ssh",
    "paramiko",
    "paramiko_ssh",
    "ansible.builtin.paramiko_ssh",
    "smart",
    "mitogen_ssh",
    "ansible.legacy.ssh",
)
# Host key algorithms that stand for a known_hosts key type (RSA keys sign with SHA-2).
KEY_ALGORITHMS = {"ssh-rsa": ("rsa-sha2-512", "rsa-sha2-256", "ssh-rsa")}


class Refused(Exception):
    """The command line or the inventory cannot be used; nothing was read or written."""


# ---------------------------------------------------------------- keys and known_hosts


def fingerprint(blob):
    """SHA256:<base64, no padding> of a key's wire form, as `ssh-keygen -lf` prints it.
    Takes the blob (bytes), a paramiko key, or a known_hosts base64 field."""
    if hasattr(blob, "asbytes"):
        blob = blob.asbytes()
    elif isinstance(blob, str):
        blob = base64.b64decode(blob)
    return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")


def host_pattern(address, port=22):
    """The name OpenSSH looks up and writes in known_hosts: the host, or [host]:port."""
    address = str(address).lower()
    return address if int(port or 22) == 22 else "[%s]:%d" % (address, int(port))


def known_hosts_path(inventory):
    """INV/.ssh/known_hosts (hidden: Ansible would read a plain file of an inventory
    directory as an inventory source)."""
    inventory = Path(inventory)
    base = inventory if inventory.is_dir() or not inventory.exists() else inventory.parent
    return base / ".ssh" / "known_hosts"


class Entry:
    """One known_hosts line: its marker (@revoked, @cert-authority or None), host patterns,
    key type and key."""

    def __init__(self, lineno, text, marker, patterns, keytype, blob):
        self.lineno, self.text, self.marker = lineno, text, marker
        self.patterns, self.keytype, self.blob = patterns, keytype, blob

    @property
    def fingerprint(self):
        return fingerprint(self.blob)

    def matches(self, name):
        return match_host(self.patterns, name)

    def same_key(self, key):
        return self.keytype == key.get_name() and self.blob == key.asbytes()


def parse_known_hosts(text):
    """[Entry] of the lines that hold a key (comments, blank and unreadable lines skipped)."""
    entries = []
    for lineno, line in enumerate(text.splitlines(), 1):
        fields = line.strip().split()
        if not fields or fields[0].startswith("#"):
            continue
        marker = None
        if fields[0].startswith("@"):
            marker, fields = fields[0], fields[1:]
        if len(fields) < 3:
            continue
        try:
            blob = base64.b64decode(fields[2], validate=True)
        except (ValueError, TypeError):
            continue
        entries.append(Entry(lineno, line, marker, fields[0], fields[1], blob))
    return entries


def match_host(patterns, name):
    """OpenSSH's host matching for one known_hosts field: comma-separated patterns, hashed
    names (|1|salt|hash), * and ? wildcards, !negation (a negated match is no match)."""
    name = name.lower()
    found = False
    for pattern in patterns.split(","):
        negated = pattern.startswith("!")
        pattern = pattern[1:] if negated else pattern
        if pattern.startswith("|1|"):
            try:
                _, _, salt, digest = pattern.split("|", 3)
                hit = hmac.compare_digest(
                    hmac.new(base64.b64decode(salt), name.encode(), hashlib.sha1).digest(), base64.b64decode(digest)
                )
            except (ValueError, TypeError):
                hit = False
        else:
            hit = _glob(pattern.lower()).match(name) is not None
        if hit and negated:
            return False
        found = found or hit
    return found


def _glob(pattern):
    """OpenSSH's wildcards: * and ? only ([addr]:port is literal, not a character class)."""
    return re.compile(
        "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern) + r"\Z", re.DOTALL
    )


def read_known_hosts(path):
    try:
        return parse_known_hosts(Path(path).read_text(errors="replace"))
    except FileNotFoundError:
        return []


def known_line(address, port, key):
    """The line OpenSSH writes for a host it accepts (HashKnownHosts off)."""
    return "%s %s %s" % (host_pattern(address, port), key.get_name(), key.get_base64())


def append_known_hosts(path, lines):
    """Appends lines to known_hosts: the directory made 0700 and the file 0600 when they do
    not exist yet; what the file holds is kept byte for byte."""
    path = Path(path)
    if not path.parent.exists():
        path.parent.mkdir(mode=0o700, parents=True)
        os.chmod(path.parent, 0o700)
    fd = os.open(str(path), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    with os.fdopen(fd, "a") as handle:
        if path.stat().st_size:
            with open(path, "rb") as existing:
                existing.seek(-1, os.SEEK_END)
                if existing.read(1) != b"\n":
                    handle.write("\n")
        handle.write("".join(line + "\n" for line in lines))


# ---------------------------------------------------------------- the inventory


class Host:
    def __init__(self, name, address, port=22, user=None, key_file=None, ssh_args="", connection=None):
        self.name, self.address, self.port, self.user = name, str(address), int(port or 22), user
        self.key_file, self.ssh_args, self.connection = key_file, ssh_args or "", connection

    @property
    def ssh(self):
        return self.connection in SSH_CONNECTIONS

    def __repr__(self):
        return "Host(%r, %r, %r)" % (self.name, self.address, self.port)


def resolve_inventory(inventory, base=None):
    """As given when it exists from here, else from the checkout (as deploy does)."""
    from kunlun_fleet import runner

    if not inventory:
        raise Refused("give the inventory: -i INVENTORY (a directory, as inventories/example)")
    if os.path.exists(inventory):
        return os.path.abspath(inventory)
    checkout = Path(base or runner.root()) / inventory
    if checkout.exists():
        return str(checkout)
    raise Refused(
        "no inventory %r (looked in %s and in the checkout %s): give the inventory directory, "
        "e.g. -i inventories/site-a" % (inventory, os.getcwd(), base or runner.root())
    )


def _vault_password_file(inventory, given=None):
    from kunlun_fleet import vault

    path = given or os.environ.get("ANSIBLE_VAULT_PASSWORD_FILE")
    if path:
        return path
    if os.path.isdir(inventory) and os.path.exists(vault.paths(inventory)[0]):
        return vault.paths(inventory)[0]
    return None


def read_inventory(inventory, limit=None, vault_password_file=None):
    """[Host] of the inventory (narrowed by limit), their connection variables templated as
    Ansible templates them."""
    os.environ.setdefault("ANSIBLE_CONFIG", str(Path(__file__).resolve().parent.parent / "ansible.cfg"))
    from ansible.errors import AnsibleError
    from ansible.inventory.manager import InventoryManager
    from ansible.parsing.dataloader import DataLoader
    from ansible.parsing.vault import get_file_vault_secret
    from ansible.template import Templar
    from ansible.vars.manager import VariableManager

    loader = DataLoader()
    password_file = _vault_password_file(inventory, vault_password_file)
    if password_file:
        if not os.path.exists(password_file):
            raise Refused("no vault password file %s" % password_file)
        secret = get_file_vault_secret(filename=password_file, vault_id="default", loader=loader)
        secret.load()
        loader.set_vault_secrets([("default", secret)])
    try:
        manager = InventoryManager(loader=loader, sources=[inventory])
        variables = VariableManager(loader=loader, inventory=manager)
        if limit:
            manager.subset(limit)
        found = manager.get_hosts("all")
    except AnsibleError as exc:
        raise Refused("the inventory %s cannot be read: %s" % (inventory, exc)) from exc
    if not found:
        raise Refused("no host in %s%s" % (inventory, " matches --limit %s" % limit if limit else ""))
    hosts = []
    for host in found:
        hv = variables.get_vars(host=host)
        value = functools.partial(_host_var, host.name, hv, Templar(loader=loader, variables=hv))
        args = " ".join(str(a) for a in (value("ansible_ssh_common_args"), value("ansible_ssh_extra_args")) if a)
        hosts.append(
            Host(
                host.name,
                value("ansible_host", "ansible_ssh_host", default=host.name),
                value("ansible_port", "ansible_ssh_port", default=22),
                value("ansible_user", "ansible_ssh_user"),
                value("ansible_ssh_private_key_file", "ansible_private_key_file"),
                args,
                value("ansible_connection"),
            )
        )
    return hosts


def _host_var(host_name, hv, templar, *names, default=None):
    """The first of the variables names that host_name has set (not empty), templated; else default."""
    from ansible.errors import AnsibleError

    for name in names:
        if hv.get(name) not in (None, ""):
            try:
                return templar.template(hv[name])
            except AnsibleError as exc:
                raise Refused("%s: %s cannot be templated: %s" % (host_name, name, exc)) from exc
    return default


# ---------------------------------------------------------------- reading keys


def read_host_key(address, port=22, timeout=TIMEOUT, key_types=None):
    """The host key the SSH server at address:port offers (a paramiko key). With key_types
    (known_hosts key types), only those are asked for, as OpenSSH prefers the types it
    knows for a host."""
    import paramiko

    _quiet_paramiko()
    sock = socket.create_connection((address, int(port)), timeout=timeout)
    transport = paramiko.Transport(sock)
    try:
        transport.banner_timeout = transport.handshake_timeout = timeout
        if key_types:
            wanted = [a for t in key_types for a in KEY_ALGORITHMS.get(t, (t,))]
            options = transport.get_security_options()
            offered = [a for a in options.key_types if a in wanted]
            if not offered:
                raise paramiko.SSHException("no acceptable host key type (%s)" % ", ".join(key_types))
            options.key_types = offered
        transport.start_client(timeout=timeout)
        return transport.get_remote_server_key()
    finally:
        transport.close()


def _quiet_paramiko():
    """paramiko logs a failed handshake with its traceback (Python's last-resort handler
    prints it): the reason is in the host's row instead."""
    import logging

    log = logging.getLogger("paramiko")
    if not log.handlers:
        log.addHandler(logging.NullHandler())
        log.propagate = False


def _why(exc, timeout):
    if isinstance(exc, (socket.timeout, TimeoutError)):
        return "no answer in %g s" % timeout
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, socket.gaierror):
        return "name not resolved (%s)" % exc.strerror
    if isinstance(exc, EOFError):
        return "the connection closed during the SSH handshake"
    text = str(exc) or type(exc).__name__
    if "banner" in text.lower():
        return "no SSH server answers (%s)" % text
    return text


class Result:
    def __init__(self, host, status, key=None, recorded=(), detail=""):
        self.host, self.status, self.key = host, status, key
        self.recorded, self.detail = list(recorded), detail

    @property
    def key_type(self):
        return self.key.get_name() if self.key is not None else None

    @property
    def fingerprint(self):
        return fingerprint(self.key) if self.key is not None else None

    def as_dict(self):
        h = self.host
        return {
            "host": h.name,
            "address": h.address,
            "port": h.port,
            "key_type": self.key_type,
            "fingerprint": self.fingerprint,
            "status": self.status,
            "detail": self.detail or None,
            "recorded": [
                {"line": e.lineno, "key_type": e.keytype, "fingerprint": e.fingerprint} for e in self.recorded
            ],
        }


def check_host(host, entries, timeout=TIMEOUT):
    """The host's key against the known_hosts entries: known, new, CHANGED or unreachable.

    CHANGED: an entry for the host's address (or its inventory name) that does not hold
    the key the host offers, or a @revoked entry that does. OpenSSH looks the address up;
    an entry under the inventory name alone is not enough for it, so such a host is new."""
    if not host.ssh:
        return Result(host, SKIPPED, detail="connection %s: no SSH host key" % host.connection)
    names = [host_pattern(host.address, host.port)]
    if host.name.lower() != host.address.lower():
        names.append(host_pattern(host.name, host.port))
    recorded = {n: [e for e in entries if e.marker is None and e.matches(n)] for n in names}
    types = []
    for entry in recorded[names[0]] + recorded.get(names[-1], []):
        if entry.keytype not in types:
            types.append(entry.keytype)
    gone = False
    try:
        try:
            key = read_host_key(host.address, host.port, timeout, types or None)
        except Exception as exc:  # the known types are no longer offered: what is?
            # Only that answer (paramiko's IncompatiblePeer, "no acceptable host key", or
            # read_host_key's own): a key exchange that timed out on a busy host ("Key-exchange
            # timed out ...") is an unreached host, never a changed key.
            if not types or "no acceptable host key" not in str(exc).lower():
                raise
            key, gone = read_host_key(host.address, host.port, timeout), True
    except Exception as exc:
        return Result(host, UNREACHED, detail=_why(exc, timeout))
    revoked = [e for e in entries if e.marker == "@revoked" and any(e.matches(n) for n in names) and e.same_key(key)]
    if revoked:
        return Result(host, CHANGED, key, revoked, "the offered key is marked @revoked")
    conflicts = []
    for name in names:
        found = recorded[name]
        if found and not any(e.same_key(key) for e in found):
            conflicts += [e for e in found if e.keytype == key.get_name()] or found
    if conflicts:
        detail = ("the recorded key type(s) %s are no longer offered" % ", ".join(types)) if gone else ""
        return Result(host, CHANGED, key, conflicts, detail)
    return Result(host, KNOWN if recorded[names[0]] else NEW, key)


def scan(hosts, path, timeout=TIMEOUT, workers=WORKERS):
    """check_host for every host, a few at a time; results in the hosts' order."""
    entries = read_known_hosts(path)
    with ThreadPoolExecutor(max_workers=max(1, min(workers, len(hosts)))) as pool:
        return list(pool.map(lambda h: check_host(h, entries, timeout), hosts))


def accept(results, path):
    """Appends the new keys to known_hosts; marks those results accepted. Returns the lines."""
    lines = []
    for r in results:
        if r.status == NEW:
            line = known_line(r.host.address, r.host.port, r.key)
            if line not in lines:
                lines.append(line)
            r.status = ACCEPTED
    if lines:
        append_known_hosts(path, lines)
    return lines


# ---------------------------------------------------------------- what to say


def _display(path):
    path = str(path)
    try:
        rel = os.path.relpath(path)
    except ValueError:
        return path
    return rel if not rel.startswith("..") else path


def changed_message(result, path):
    """The refusal of a changed key: the host, the recorded and offered fingerprints, the fix."""
    h, shown = result.host, _display(path)
    lines = [
        "REFUSED %s (%s): its SSH host key CHANGED%s."
        % (h.name, host_pattern(h.address, h.port), ": " + result.detail if result.detail else "")
    ]
    for e in result.recorded:
        lines.append("  recorded (%s line %d, %s): %s %s" % (shown, e.lineno, e.patterns, e.keytype, e.fingerprint))
    lines.append("  offered now: %s %s" % (result.key_type, result.fingerprint))
    lines.append("  A reinstalled server, or someone between you and it. Nothing was written for %s." % h.name)
    lines.append(
        "  Fix: verify the offered fingerprint out of band (on the server's console: "
        "ssh-keygen -lf /etc/ssh/ssh_host_%s_key.pub), then remove the old entry:"
        % (result.key_type or "ed25519").replace("ssh-", "").split("-")[0]
    )
    names = []
    for e in result.recorded:
        name = next(
            (n for n in [host_pattern(h.address, h.port), host_pattern(h.name, h.port)] if e.matches(n)), e.patterns
        )
        if name not in names:
            names.append(name)
    for name in names:
        lines.append("    ssh-keygen -R %s -f %s" % (shlex.quote(name), shlex.quote(shown)))
    lines.append("  and accept the new key: kunlun-fleet hostkeys -i INVENTORY --limit %s --accept" % h.name)
    return "\n".join(lines)


def table(results):
    rows = [("HOST", "ADDRESS", "KEY", "FINGERPRINT", "STATUS")]
    for r in results:
        h = r.host
        status = r.status + (": " + r.detail if r.detail and r.status in (UNREACHED, SKIPPED) else "")
        rows.append(
            (
                h.name,
                h.address if h.port == 22 else "%s:%d" % (h.address, h.port),
                r.key_type or "-",
                r.fingerprint or "-",
                status,
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(row[:4], widths, strict=True)) + "  " + row[4] for row in rows
    )


def exit_code(results):
    statuses = {r.status for r in results}
    if CHANGED in statuses:
        return REFUSED
    if UNREACHED in statuses:
        return UNREACHABLE
    if NEW in statuses:
        return NOT_ACCEPTED
    return OK


def _not_pointed(hosts, path):
    """Hosts whose Ansible connection does not read this known_hosts (their ssh arguments
    name no UserKnownHostsFile=<path>): Ansible's ssh would check ~/.ssh/known_hosts."""
    want = os.path.realpath(str(path))
    missing = []
    for h in hosts:
        if not h.ssh:
            continue
        files = [a.split("=", 1)[1] for a in shlex.split(h.ssh_args) if a.startswith("UserKnownHostsFile=")]
        files = [f for value in files for f in value.split()]
        if want not in [os.path.realpath(os.path.expanduser(f)) for f in files]:
            missing.append(h.name)
    return missing


def run_hostkeys(
    inventory, limit=None, do_accept=False, as_json=False, timeout=TIMEOUT, vault_password_file=None, out=None, err=None
):
    """`kunlun-fleet hostkeys`: the table (or JSON), the refusals, the exit code."""
    out, err = out or sys.stdout, err or sys.stderr
    try:
        inventory = resolve_inventory(inventory)
        hosts = read_inventory(inventory, limit, vault_password_file)
    except Refused as exc:
        err.write("kunlun-fleet hostkeys: %s\n" % exc)
        return REFUSED
    path = known_hosts_path(inventory)
    results = scan(hosts, path, timeout)
    written = accept(results, path) if do_accept else []
    code = exit_code(results)
    if as_json:
        out.write(
            json.dumps(
                {
                    "known_hosts": str(path),
                    "hosts": [r.as_dict() for r in results],
                    "written": len(written),
                    "exit_code": code,
                },
                indent=2,
            )
            + "\n"
        )
    else:
        out.write(table(results) + "\n")
    for r in results:
        if r.status == CHANGED:
            err.write("\n" + changed_message(r, path) + "\n")
    for r in results if as_json else []:  # the table says why in the host's row
        if r.status == UNREACHED:
            err.write("UNREACHABLE %s (%s port %d): %s\n" % (r.host.name, r.host.address, r.host.port, r.detail))
    say = err if as_json else out
    if written:
        say.write("\naccepted %d new host key(s) into %s\n" % (len(written), _display(path)))
    new = [r.host.name for r in results if r.status == NEW]
    if new:
        say.write(
            "\n%d new host key(s), not accepted yet: %s. Verify each fingerprint out of band (on the server's "
            "console: ssh-keygen -lf /etc/ssh/ssh_host_*_key.pub), then:\n  kunlun-fleet hostkeys -i %s%s --accept\n"
            % (len(new), ", ".join(new), _display(inventory), " --limit %s" % limit if limit else "")
        )
    missing = _not_pointed(hosts, path)
    if missing:
        err.write(
            "\nnote: Ansible does not read %s for %s: its ssh checks ~/.ssh/known_hosts for them. Point it "
            "there in group_vars/all/connection.yml:\n  ansible_ssh_common_args: >-\n"
            "    -o UserKnownHostsFile={{ inventory_dir }}/.ssh/known_hosts -o StrictHostKeyChecking=yes\n"
            % (_display(path), ", ".join(missing) if len(missing) <= 5 else "%d hosts" % len(missing))
        )
    return code


# ---------------------------------------------------------------- bootstrap


def read_password_file(path):
    """The first line of a file only its owner can read (scripts and tests; a person uses
    --ask-pass)."""
    try:
        st = os.stat(path)
    except OSError as exc:
        raise Refused("--password-file %s: %s" % (path, exc.strerror)) from exc
    if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise Refused(
            "--password-file %s can be read by others (mode %o): chmod 600 %s"
            % (path, stat.S_IMODE(st.st_mode), shlex.quote(path))
        )
    with open(path) as handle:
        password = handle.readline().rstrip("\r\n")
    if not password:
        raise Refused("--password-file %s: its first line (the password) is empty" % path)
    return password


def public_key_files(hosts):
    """{host: public key file} (the inventory's ansible_ssh_private_key_file + .pub), or Refused."""
    problems, found = [], {}
    for h in hosts:
        if not h.key_file:
            problems.append(
                "%s: the inventory sets no ansible_ssh_private_key_file (bootstrap installs that key's "
                ".pub); set it in group_vars/all/connection.yml" % h.name
            )
            continue
        pub = os.path.expanduser(str(h.key_file)) + ".pub"
        if not os.path.isfile(pub):
            problems.append(
                "%s: no public key %s next to its private key: make it with "
                "ssh-keygen -y -f %s > %s" % (h.name, pub, h.key_file, pub)
            )
            continue
        found[h.name] = pub
    if problems:
        raise Refused("the controller's key:\n  " + "\n  ".join(problems))
    return found


def key_login(host, key, user, key_file, timeout=TIMEOUT):
    """None when `user` logs in to the host with key_file alone (no agent, no password), the
    host's key checked against `key` (the one known_hosts holds); else why not."""
    import paramiko

    _quiet_paramiko()
    client = paramiko.SSHClient()
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    client.get_host_keys().add(host_pattern(host.address, host.port), key.get_name(), key)
    try:
        client.connect(
            host.address,
            port=host.port,
            username=user,
            key_filename=os.path.expanduser(key_file),
            look_for_keys=False,
            allow_agent=False,
            timeout=timeout,
            banner_timeout=timeout,
            auth_timeout=timeout,
        )
        return None
    except Exception as exc:
        return _why(exc, timeout)
    finally:
        client.close()


def _bootstrap_run_class():
    from kunlun_fleet import runner

    class BootstrapRun(runner.Run):
        """The runner, its SSH (and become) prompt answered from memory: the password of
        --password-file, or the operator's (getpass). The password is masked in every event
        and in the stored output, like the vault's values."""

        password = None

        def passwords(self):
            import getpass

            answers = {}
            for flags, label, pattern in runner.PROMPTS:
                if any(a in flags for a in self.args):
                    if self.password is None and label == "SSH password":
                        self.password = getpass.getpass("%s: " % label)
                    answers[pattern] = (
                        self.password
                        if label in ("SSH password", "BECOME password")
                        else getpass.getpass("%s: " % label)
                    )
            return answers

        def _hide(self, text):
            return text.replace(self.password, runner.MASK) if self.password and isinstance(text, str) else text

        def on_event(self, event):
            if self.password:
                event["stdout"] = self._hide(event.get("stdout"))
                if event.get("event_data"):
                    event["event_data"] = runner.Masker([self.password]).obj(event["event_data"])
            return super().on_event(event)

        def _tidy_artifacts(self):
            super()._tidy_artifacts()
            stdout = self.dir / "artifacts" / "stdout"
            if self.password and stdout.exists():
                stdout.write_text(self._hide(stdout.read_text(errors="replace")))

    return BootstrapRun


def run_bootstrap(
    inventory,
    limit=None,
    ask_pass=False,
    password_file=None,
    deploy_user=None,
    rest=(),
    output="plain",
    argv=None,
    timeout=TIMEOUT,
    out=None,
    err=None,
):
    """`kunlun-fleet bootstrap`: refuses before any login when a host key is not known, the
    controller's public key is missing or no password is given; then playbooks/bootstrap.yml
    through the runner (-k answered); then a key login to every host (and as the deploy user)."""
    from kunlun_fleet import runner

    out, err = out or sys.stdout, err or sys.stderr
    rest = list(rest)
    if any(a in ("-k", "--ask-pass") for a in rest):
        ask_pass = True
        rest = [a for a in rest if a not in ("-k", "--ask-pass")]
    try:
        if bool(ask_pass) == bool(password_file):
            raise Refused("give the login password one way: --ask-pass (a prompt) or --password-file FILE")
        if deploy_user is not None and not _valid_user(deploy_user):
            raise Refused(
                "--deploy-user %r: a user name is lower-case letters, digits, _ and -, starting with a "
                "letter or _ (32 characters at most)" % deploy_user
            )
        password = read_password_file(password_file) if password_file else None
        inventory = resolve_inventory(inventory)
        hosts = [h for h in read_inventory(inventory, limit) if h.ssh]
        if not hosts:
            raise Refused("no SSH host in %s%s" % (inventory, " matches --limit %s" % limit if limit else ""))
        public_key_files(hosts)
    except Refused as exc:
        err.write("kunlun-fleet bootstrap: %s\n" % exc)
        return REFUSED
    path = known_hosts_path(inventory)
    results = scan(hosts, path, timeout)
    bad = [r for r in results if r.status != KNOWN]
    if bad:
        for r in bad:
            if r.status == CHANGED:
                err.write(changed_message(r, path) + "\n")
            elif r.status == UNREACHED:
                err.write("UNREACHABLE %s (%s port %d): %s\n" % (r.host.name, r.host.address, r.host.port, r.detail))
        new = [r.host.name for r in bad if r.status == NEW]
        if new:
            err.write(
                "kunlun-fleet bootstrap: the host key of %s is not known yet (%s has no entry): a password is "
                "only ever sent to a host whose key was verified. Run first, and verify the fingerprints it "
                "prints out of band:\n  kunlun-fleet hostkeys -i %s%s --accept\n"
                % (", ".join(new), _display(path), _display(inventory), " --limit %s" % limit if limit else "")
            )
        return UNREACHABLE if all(r.status == UNREACHED for r in bad) else REFUSED
    err.write("host keys: %d host(s) known in %s\n" % (len(results), _display(path)))
    args = ["--ask-pass"] + (["-e", json.dumps({"bootstrap_deploy_user": deploy_user})] if deploy_user else []) + rest
    head = (
        ["kunlun-fleet", "bootstrap", "-i", _display(inventory)]
        + (["--password-file", password_file] if password_file else ["--ask-pass"])
        + (["--deploy-user", deploy_user] if deploy_user else [])
    )
    try:
        run = _bootstrap_run_class()(
            "bootstrap",
            "playbooks/bootstrap.yml",
            args,
            inventory=inventory,
            limit=limit,
            output=output,
            resume=(head, rest, None),
            argv=argv,
        )
    except runner.Refused as exc:
        err.write("kunlun-fleet bootstrap: %s\n" % exc)
        return REFUSED
    run.password = password
    code = run.run()
    if code != OK or any(a in ("-C", "--check") for a in rest):
        return code
    return _prove_key_logins(results, deploy_user, timeout, err if output == "json" else out)


def _prove_key_logins(results, deploy_user, timeout, out):
    """Every host opens to the controller's key alone (and the deploy user's): the point of
    the bootstrap, checked from the controller."""
    failed = []
    for r in results:
        h = r.host
        for user in [h.user or _local_user()] + ([deploy_user] if deploy_user else []):
            why = key_login(h, r.key, user, h.key_file, timeout)
            out.write("key login %s@%s: %s\n" % (user, h.name, "ok" if why is None else "FAILED: " + why))
            if why is not None:
                failed.append(h.name)
    return FAILED if failed else OK


def _local_user():
    import getpass

    return getpass.getuser()


def _valid_user(name):
    import re

    return bool(re.match(r"^[a-z_][a-z0-9_-]{0,31}$", name or ""))
