"""`kunlun-fleet inventory`: a site inventory written from what operators have.

  kunlun-fleet inventory -i DIR --csv hosts.csv [--yes] [--force]
      DIR/hosts.yml from a CSV of the servers (name,address,role), in the shape of
      inventories/example/hosts.yml, and DIR/group_vars/all/*.yml from inventories/example
      where DIR has none of its own.
  kunlun-fleet inventory -i DIR --discover [--limit HOSTS] [--yes] [--force]
      every serving host (xpu_servers) read over SSH, read-only (library/data_disk_candidates.py
      through playbooks/inventory_discover.yml and the runner), and its
      host_vars/<host>.yml written with storage_data_disks from what it reported, by the
      rules preflight applies (module_utils/data_disks.py). Its SSH host key must be known
      first (kunlun-fleet hostkeys): discovery checks keys as every other command does.

Both show what they would write (a table of the hosts, or of each host's disks and the
choice made for each) and ask before writing anything (--yes: without asking, for scripts).
A file that exists and differs is not replaced without --force, and then the old one is
kept under DIR/.kunlun-fleet-backup/<UTC time>/ first. Nothing secret is written: the vault
is made by `kunlun-fleet api-key`.

The rules of the choice (docs/cli.md, "inventory"):
  - an LVM volume mounted at /home that is not kunlun-fleet's own (data/home) is adopted as it
    is (storage_data_disks: [], the storage stage's adopt path); blank disks that could grow
    it are shown, commented;
  - otherwise every blank disk, and every disk that is already a physical volume of the
    data volume group (kunlun-fleet's own volume), is a data disk;
  - a disk that holds anything else (foreign) is never listed, in storage_data_disks or
    storage_take_disks: it is shown, commented, with what it holds and how to take it;
  - the system's disks (/, /boot, swap, other mounted filesystems) are left out, named.

Exit codes: 0 written (or nothing to change); 1 the discovery run failed without naming a
host; 2 a host's discovery failed; 3 refused, nothing written (bad CSV, files that differ
without --force, not confirmed, unknown host keys, no inventory); 4 a host unreachable (the
others written).
"""

import csv
import datetime
import io
import ipaddress
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

from kunlun_fleet import runner

# CSV role -> inventory group, in hosts.yml's order. The group names are accepted as roles too.
ROLES = {
    "xpu_server": "xpu_servers",
    "image_builder": "image_builders",
    "gateway": "gateways",
    "monitoring": "monitoring",
}
GROUPS = list(ROLES.values())
ROLE_SEPARATOR = ";"
# What preflight requires (roles/preflight/defaults/main.yml, preflight_required_groups).
REQUIRED_GROUPS = ("xpu_servers", "image_builders", "gateways")
# Names that are groups, or the controller itself, not servers.
RESERVED = {"all", "ungrouped", "localhost"} | set(GROUPS)
HOST_NAME = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?$")
DNS_LABEL = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?$")
PLAYBOOK = "playbooks/inventory_discover.yml"
BACKUP_DIR = ".kunlun-fleet-backup"
# The variables a discovery writes in host_vars/<host>.yml; any other one an existing file
# sets is carried over into the new one.
STORAGE_VARS = ("storage_data_disks", "storage_take_disks", "storage_fstab_by_uuid")

GROUP_COMMENTS = {
    "xpu_servers": (
        "Every P800 server that serves the model (8 accelerators each). The gateway reaches\n"
        "each at its ansible_host; when that is a DNS name or a management address, give the\n"
        "serving network's address as kunlun_stack_serving_address (host_vars)."
    ),
    "image_builders": (
        "Builds the serving image once per fleet, on its first host: a host of xpu_servers\n"
        "(it needs the devices to prove the image from the inside)."
    ),
    "gateways": "Runs the fleet endpoint (the router in front of every healthy xpu_servers host).",
    "monitoring": (
        "Runs Prometheus (roles/monitoring, docs/monitoring.md): scrapes every host, holds the\n"
        "alert rules; the only address besides the gateway itself that may read the\n"
        "endpoint's /metrics."
    ),
}


class Refused(runner.Refused):
    """Input refused before anything was written."""


class Host:
    def __init__(self, name, address, groups, line):
        self.name, self.address, self.groups, self.line = name, address, list(groups), line

    def __repr__(self):
        return "Host(%r, %r, %r)" % (self.name, self.address, self.groups)


# ---------------------------------------------------------------- the CSV


def _address_problem(address):
    """Why address is not an IP address or a DNS name, or None."""
    try:
        ipaddress.ip_address(address)
        return None
    except ValueError:
        pass
    name = address[:-1] if address.endswith(".") else address
    labels = name.split(".")
    if re.match(r"^[0-9.]+$", name):
        return "%r is not an IPv4 address (four numbers 0-255, as 10.20.1.11)" % address
    if ":" in name:
        return "%r is not an IPv6 address" % address
    if len(name) > 253 or not all(DNS_LABEL.match(label) for label in labels):
        return "%r is neither an IP address nor a DNS name (letters, digits and '-' between dots)" % address
    if labels[-1].isdigit():
        return "%r is neither an IP address nor a DNS name (its last label is a number)" % address
    return None


def _normal_address(address):
    try:
        return str(ipaddress.ip_address(address))
    except ValueError:
        return address.rstrip(".").lower()


def _roles(text):
    """(groups, unknown role names) of a role cell: roles separated by ';'."""
    groups, unknown = [], []
    for role in (r.strip() for r in text.split(ROLE_SEPARATOR)):
        if not role:
            continue
        key = role.lower()
        group = ROLES.get(key) or (key if key in GROUPS else None)
        if group is None:
            unknown.append(role)
        elif group not in groups:
            groups.append(group)
    return [g for g in GROUPS if g in groups], unknown


def parse_csv(text, source="hosts.csv"):
    """[Host] from the CSV's text (name,address,role per line; an optional header line
    `name,address,role`; blank lines and lines starting with '#' skipped). Raises Refused
    naming every problem, each with its line and fix."""
    problems, hosts = [], []
    names, addresses = {}, {}
    roles_list = ", ".join(ROLES)
    if text.startswith("\ufeff"):  # a spreadsheet's byte order mark
        text = text[1:]
    rows = csv.reader(io.StringIO(text))
    first = True
    for row in rows:
        line = rows.line_num
        cells = [c.strip() for c in row]
        while cells and not cells[-1]:  # a spreadsheet's empty trailing columns
            cells.pop()
        if not cells or cells[0].startswith("#"):
            continue
        if first and [c.lower() for c in cells] in (["name", "address", "role"], ["name", "address", "roles"]):
            first = False
            continue
        first = False
        if len(cells) != 3:
            problems.append(
                "line %d: %d field(s) %s; expected 3: name,address,role (several roles in the third field, "
                "separated by '%s', e.g. p800-a01,10.20.1.11,xpu_server%simage_builder)"
                % (line, len(cells), cells, ROLE_SEPARATOR, ROLE_SEPARATOR)
            )
            continue
        name, address, role_text = cells
        bad = False
        if not HOST_NAME.match(name) or len(name) > 253:
            problems.append(
                "line %d: %r is not a host name Ansible can target: letters, digits, '.', '-' and '_', starting and "
                "ending with a letter or digit (as p800-a01)" % (line, name)
            )
            bad = True
        elif name.lower() in RESERVED:
            problems.append(
                "line %d: %r is the name of a group (or of the controller): give the server its own name" % (line, name)
            )
            bad = True
        elif name.lower() in names:
            problems.append(
                "line %d: the name %s is on line %d already: one line per server, each with its own name"
                % (line, name, names[name.lower()])
            )
            bad = True
        why = _address_problem(address) if address else "no address: give the server's IP address or DNS name"
        if why:
            problems.append("line %d (%s): %s" % (line, name, why))
            bad = True
        elif _normal_address(address) in addresses:
            problems.append(
                "line %d (%s): the address %s is %s's (line %d) already: each server has an address of its own"
                % (line, name, address, *addresses[_normal_address(address)])
            )
            bad = True
        groups, unknown = _roles(role_text)
        if unknown:
            problems.append(
                "line %d (%s): unknown role(s) %s; the roles: %s (several separated by '%s')"
                % (line, name, ", ".join(repr(u) for u in unknown), roles_list, ROLE_SEPARATOR)
            )
            bad = True
        elif not groups:
            problems.append(
                "line %d (%s): no role; give one or more of %s, separated by '%s'"
                % (line, name, roles_list, ROLE_SEPARATOR)
            )
            bad = True
        elif "image_builders" in groups and "xpu_servers" not in groups:
            problems.append(
                "line %d (%s): image_builder without xpu_server: the image is proved on the builder's own "
                "accelerators; make the builder one of the serving hosts (xpu_server%simage_builder)"
                % (line, name, ROLE_SEPARATOR)
            )
            bad = True
        if not bad:
            names[name.lower()] = line
            addresses[_normal_address(address)] = (name, line)
            hosts.append(Host(name, address, groups, line))
    if not problems:
        for group in REQUIRED_GROUPS:
            if not any(group in h.groups for h in hosts):
                role = next(r for r, g in ROLES.items() if g == group)
                problems.append(
                    "no %s: preflight needs at least one host in %s; give the role %s to a server" % (role, group, role)
                )
    if problems:
        raise Refused("%s: %d problem(s); nothing was written:\n  %s" % (source, len(problems), "\n  ".join(problems)))
    return hosts


# ---------------------------------------------------------------- hosts.yml


def _scalar(text):
    """text as a YAML scalar that reads back as the same string (quoted when it would not)."""
    import yaml

    return yaml.safe_dump([str(text)], default_flow_style=True, width=1000).strip()[1:-1]


def render_hosts(hosts):
    """hosts.yml's text for the hosts, in the shape of inventories/example/hosts.yml: each
    host's ansible_host in the first group it is in, the groups in that file's order."""
    lines = [
        "---",
        "# The site's servers, written by `kunlun-fleet inventory --csv` from a CSV of them",
        "# (name,address,role; docs/cli.md), in the shape of inventories/example/hosts.yml. Edit it",
        "# as you like: the command does not replace it again without --force (the old file kept).",
        "# Each serving host's data disks: host_vars/<host>.yml (`kunlun-fleet inventory --discover`).",
        "all:",
        "  children:",
    ]
    placed = set()
    for group in GROUPS:
        members = [h for h in hosts if group in h.groups]
        lines += ["    # " + c for c in GROUP_COMMENTS[group].splitlines()]
        if not members:
            lines += ["    # (no host has the role %s)" % next(r for r, g in ROLES.items() if g == group)]
            continue
        lines += ["    %s:" % group, "      hosts:"]
        for h in members:
            lines.append("        %s:" % _scalar(h.name))
            if h.name not in placed:
                lines.append("          ansible_host: %s" % _scalar(h.address))
                placed.add(h.name)
    return "\n".join(lines) + "\n"


def read_groups(inventory):
    """({group: [host]}, {host: ansible_host}) of an inventory, read as Ansible reads it."""
    os.environ.setdefault("ANSIBLE_CONFIG", str(runner.root() / "ansible.cfg"))
    from ansible.errors import AnsibleError
    from ansible.inventory.manager import InventoryManager
    from ansible.parsing.dataloader import DataLoader

    try:
        manager = InventoryManager(loader=DataLoader(), sources=[str(inventory)])
    except AnsibleError as exc:
        raise Refused("the inventory %s cannot be read: %s" % (inventory, exc)) from exc
    groups = {name: [h.name for h in g.get_hosts()] for name, g in manager.groups.items()}
    addresses = {h.name: h.vars.get("ansible_host") for h in manager.get_hosts("all")}
    return groups, addresses


def check_hosts(text, hosts):
    """Reads hosts.yml's text back as Ansible does (in a directory of its own) and compares
    it with the hosts; raises Refused on any difference (a bug, never written)."""
    with tempfile.TemporaryDirectory(prefix="kf-inventory-") as tmp:
        Path(tmp, "hosts.yml").write_text(text)
        groups, addresses = read_groups(tmp)
    for group in GROUPS:
        want = [h.name for h in hosts if group in h.groups]
        if groups.get(group, []) != want:
            raise Refused("hosts.yml as written would give %s %s, not %s" % (group, groups.get(group), want))
    for h in hosts:
        if str(addresses.get(h.name)) != h.address:
            raise Refused("hosts.yml as written would give %s the address %r" % (h.name, addresses.get(h.name)))


# ---------------------------------------------------------------- files


class Change:
    """One file the command would write: create, replace, same (nothing to do) or keep (exists, left alone)."""

    def __init__(self, rel, text, action, note=""):
        self.rel, self.text, self.action, self.note = rel, text, action, note


def plan_file(inventory, rel, text, keep_existing=False):
    path = Path(inventory) / rel
    if not path.exists():
        return Change(rel, text, "create")
    if keep_existing:
        return Change(rel, None, "keep", "exists: left as it is")
    try:
        old = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise Refused("%s cannot be read (%s): move it aside first" % (path, exc)) from exc
    return Change(rel, text, "same" if old == text else "replace")


def refuse_replacing(changes, inventory, command):
    """Refused when a file would be replaced without --force, naming them."""
    replaced = [c.rel for c in changes if c.action == "replace"]
    if replaced:
        one = len(replaced) == 1
        raise Refused(
            "%s %s in %s and %s from what this would write; nothing was written. Edits there are yours: compare, "
            "or run `%s --force` to replace %s (the old %s kept under %s first)"
            % (
                ", ".join(replaced),
                "exists" if one else "exist",
                inventory,
                "differs" if one else "differ",
                command,
                "it" if one else "them",
                "file" if one else "files",
                Path(inventory) / BACKUP_DIR / "<UTC time>",
            )
        )


def write_changes(inventory, changes, now=None):
    """Writes the create and replace changes (each replaced file kept first under
    BACKUP_DIR/<UTC time>/); returns [(rel, backup path or None)]."""
    stamp = (now or datetime.datetime.now(datetime.timezone.utc)).strftime("%Y%m%dT%H%M%SZ")
    kept = Path(inventory) / BACKUP_DIR / stamp
    n = 1
    while kept.exists():  # a run within the same second: a directory of its own
        kept, n = Path(inventory) / BACKUP_DIR / ("%s-%d" % (stamp, n)), n + 1
    done = []
    for c in changes:
        if c.action not in ("create", "replace"):
            continue
        path = Path(inventory) / c.rel
        backup = None
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(".%s.tmp" % path.name)
        tmp.write_text(c.text)
        if c.action == "replace":
            backup = kept / c.rel
            backup.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, backup)
            shutil.copymode(path, tmp)
        os.replace(tmp, path)
        done.append((c.rel, backup))
    return done


def confirm(question, yes, stdin=None, out=None):
    """True when the operator says yes (or --yes); Refused without a terminal to ask on."""
    stdin, out = stdin or sys.stdin, out or sys.stdout
    if yes:
        return True
    if not (hasattr(stdin, "isatty") and stdin.isatty()):
        raise Refused("not confirmed: no terminal to ask on; nothing was written. Give --yes to write without asking")
    out.write("%s [y/N] " % question)
    out.flush()
    answer = stdin.readline().strip().lower()
    return answer in ("y", "yes")


def _table(rows):
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]) - 1)]
    return "\n".join(
        "  ".join(str(c).ljust(w) for c, w in zip(r[:-1], widths, strict=True)) + "  " + str(r[-1]) for r in rows
    )


def _show(path):
    try:
        rel = os.path.relpath(str(path))
    except ValueError:
        return str(path)
    return rel if not rel.startswith("..") else str(path)


def _changes_lines(inventory, changes):
    words = {"create": "write", "replace": "REPLACE", "same": "unchanged", "keep": "keep"}
    return [
        "  %-9s %s%s" % (words[c.action], _show(Path(inventory) / c.rel), "  (%s)" % c.note if c.note else "")
        for c in changes
    ]


# ---------------------------------------------------------------- --csv


def example_dir():
    return runner.root() / "inventories" / "example"


def csv_changes(inventory, hosts, example=None):
    """The files --csv writes: hosts.yml, and the example's group_vars/all/*.yml where the
    inventory has none of that name."""
    text = render_hosts(hosts)
    check_hosts(text, hosts)
    changes = [plan_file(inventory, "hosts.yml", text)]
    source = Path(example or example_dir()) / "group_vars" / "all"
    for path in sorted(source.glob("*.yml")):
        rel = "group_vars/all/%s" % path.name
        change = plan_file(inventory, rel, path.read_text(), keep_existing=True)
        if change.action == "create":
            change.note = "from %s" % _show(path)
        changes.append(change)
    return changes


def do_csv(inventory, csv_path, yes=False, force=False, stdin=None, out=None, example=None):
    out = out or sys.stdout
    try:
        text = Path(csv_path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise Refused("--csv %s cannot be read: %s" % (csv_path, getattr(exc, "strerror", None) or exc)) from exc
    hosts = parse_csv(text, source=_show(csv_path))
    if Path(inventory).exists() and not Path(inventory).is_dir():
        raise Refused("%s is a file; give the inventory directory to write (e.g. -i inventories/site-a)" % inventory)
    changes = csv_changes(inventory, hosts, example)
    if not force:
        refuse_replacing(changes, inventory, "kunlun-fleet inventory -i %s --csv %s" % (inventory, csv_path))
    rows = [("HOST", "ADDRESS", "GROUPS")] + [(h.name, h.address, ", ".join(h.groups)) for h in hosts]
    out.write(_table(rows) + "\n\n")
    if not any(h for h in hosts if "monitoring" in h.groups):
        out.write("note: no host has the role monitoring: the monitoring stage will have no host to run on\n\n")
    out.write("%s:\n%s\n" % (_show(inventory), "\n".join(_changes_lines(inventory, changes))))
    todo = [c for c in changes if c.action in ("create", "replace")]
    if not todo:
        out.write("nothing to change\n")
        return []
    if not confirm("Write %d file(s) in %s?" % (len(todo), _show(inventory)), yes, stdin, out):
        raise Refused("not confirmed; nothing was written")
    done = write_changes(inventory, changes)
    _say_written(inventory, done, out)
    return done


def _say_written(inventory, done, out):
    for rel, backup in done:
        out.write(
            "wrote %s%s\n"
            % (_show(Path(inventory) / rel), "  (the old one kept: %s)" % _show(backup) if backup else "")
        )


# ---------------------------------------------------------------- --discover


def human(n):
    n = float(n or 0)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if n < 1024 or unit == "PiB":
            return ("%.0f %s" if unit == "B" else "%.1f %s") % (n, unit)
        n /= 1024.0


class Choice:
    """What a discovery says for one host: its data disks, the foreign disks not taken,
    the volume adopted, the table's rows and the host_vars text."""

    def __init__(self, host, result):
        self.host, self.result = host, result
        self.mp = result.get("mount_point") or "/home"
        disks = result.get("disks") or []
        self.home = result.get("home_volume") or {}
        self.adopt = bool(self.home.get("adopt"))
        if self.adopt:
            # The adopted volume's own disks stay as they are; blank ones would grow it.
            self.data = []
            self.growers = [d for d in disks if d["state"] == "empty"]
        else:
            self.data = [d for d in disks if d["state"] in ("empty", "ours")]
            self.growers = []
        self.own = [d for d in disks if d["state"] == "ours" and self.adopt]
        self.foreign = [d for d in disks if d["state"] not in ("empty", "ours")]
        self.excluded = result.get("excluded") or []

    def choice_of(self, d):
        if d in self.data:
            return "data disk" + (" (the volume at %s)" % self.mp if d.get("home") else "")
        if d in self.own:
            return "not listed: in the adopted volume group %s" % self.home["vg"]
        if d in self.growers:
            return "not listed: it would grow %s (commented)" % self.home["vg"]
        return "NOT taken: it holds something (commented, with how to take it)"

    def rows(self):
        rows = []
        if self.adopt:
            h = self.home
            rows.append(
                (
                    self.host,
                    "%s/%s" % (h["vg"], h["lv"]),
                    human(h.get("size_bytes")),
                    "-",
                    "the LVM volume at %s (%s)" % (self.mp, h.get("fstype") or "?"),
                    "adopted as it is: storage_data_disks []",
                )
            )
        for d in self.result.get("disks") or []:
            rows.append((self.host, d["name"], human(d["size_bytes"]), d["state"], d["summary"], self.choice_of(d)))
        for e in self.excluded:
            rows.append((self.host, e.get("by_id") or e["path"], "-", "-", e["reason"], "left out: the system's"))
        if not self.data and not self.adopt:
            rows.append((self.host, "(none)", "-", "-", "no blank disk", "NO DATA DISK: preflight refuses this host"))
        return rows

    def text(self, carried=None):
        mp = self.mp
        out = [
            "---",
            "# %s's data disks, from what the host reported to `kunlun-fleet inventory --discover`" % self.host,
            '# (library/data_disk_candidates.py; the rules: docs/cli.md, "inventory"). They become, or',
            "# already are, the LVM volume mounted at %s (docs/storage.md). Check them against the" % mp,
            "# server before its first deploy. A disk that holds something is refused unless it is",
            "# also listed in storage_take_disks.",
        ]
        if self.adopt:
            h = self.home
            out += [
                "#",
                "# %s is the LVM volume %s/%s (%s, %s; %s free in %s) on %s:"
                % (
                    mp,
                    h["vg"],
                    h["lv"],
                    h.get("fstype") or "?",
                    human(h.get("size_bytes")),
                    human(h.get("vg_free_bytes")),
                    h["vg"],
                    ", ".join(h.get("disks") or h.get("pvs") or []) or "?",
                ),
                "# adopted as it is, grown, never rebuilt; no data disk listed.",
                "storage_data_disks: []",
            ]
            if self.growers:
                out += ["# Blank disks that would grow it (listed in storage_data_disks, they join %s):" % h["vg"]]
                out += ["#   - %s  # %s, empty" % (d["name"], human(d["size_bytes"])) for d in self.growers]
            fstab = h.get("fstab") or {}
            if fstab.get("by") == "path":
                out += [
                    "# Its fstab line names it by path (%s); true has the storage stage" % fstab.get("spec"),
                    "# rewrite that line by UUID:",
                    "# storage_fstab_by_uuid: true",
                ]
        elif self.data:
            if not self.home:
                mount = self.result.get("home_mount") or {}
                out += [
                    "#",
                    "# %s is %s:"
                    % (
                        mp,
                        "%s on %s, not an LVM volume" % (mount.get("fstype") or "?", mount.get("source") or "?")
                        if mount
                        else "a directory of the root filesystem",
                    ),
                    "# its content is carried over onto the new volume (storage_carry_over, true by",
                    "# default; docs/storage.md).",
                ]
            out.append("storage_data_disks:")
            for d in self.data:
                out.append(
                    "  - %s  # %s, %s%s"
                    % (
                        _scalar(d["name"]),
                        human(d["size_bytes"]),
                        d["state"] if d["state"] == "empty" else "%s: %s" % (d["state"], d["summary"]),
                        " (the volume at %s)" % mp if d.get("home") else "",
                    )
                )
            kernel = [d["path"] for d in self.data if not d.get("by_id")]
            if kernel:
                out.append(
                    "# %s: no /dev/disk/by-id/ link on this host; a kernel name can change between boots."
                    % ", ".join(kernel)
                )
        else:
            out += [
                "# No blank disk and no LVM volume at %s: preflight refuses this host until its data" % mp,
                "# disks are listed here.",
                "storage_data_disks: []",
            ]
        if self.foreign:
            out += [
                "",
                "# Not taken: these disks hold something. To use one, WIPING what it holds, list it in",
                "# storage_data_disks and in storage_take_disks:",
            ]
            out += ["#   %s (%s): %s" % (d["name"], human(d["size_bytes"]), d["summary"]) for d in self.foreign]
            out += ["# storage_take_disks:"] + ["#   - %s" % d["name"] for d in self.foreign]
        if self.excluded:
            out += [""] + [
                "# Left out, the system's: %s (%s)" % (e.get("by_id") or e["path"], e["reason"]) for e in self.excluded
            ]
        if carried:
            import yaml

            out += ["", "# Kept from the previous host_vars/%s.yml:" % self.host]
            out += yaml.safe_dump(carried, default_flow_style=False, sort_keys=False).rstrip("\n").splitlines()
        return "\n".join(out) + "\n"


def _storage_settings(path):
    """The storage variables an existing host_vars file sets, as one line ('' when none)."""
    import yaml

    try:
        data = yaml.safe_load(path.read_text()) if path.exists() else None
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return ""
    if not isinstance(data, dict):
        return ""
    return "; ".join("%s %s" % (k, data[k]) for k in STORAGE_VARS if k in data)


def _carried(path):
    """The variables of an existing host_vars file other than the storage ones a discovery
    writes ({} when there is no file). Refused when it cannot be read as plain YAML (a
    vaulted file: move it aside, or into host_vars/<host>/)."""
    import yaml

    if not path.exists():
        return {}
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise Refused(
            "%s cannot be read as plain YAML (%s): move what it sets that is not storage_* into host_vars/%s/ "
            "(a directory Ansible reads too) and remove the file, then discover again"
            % (path, str(exc).splitlines()[0], path.stem)
        ) from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise Refused("%s is not a mapping of variables" % path)
    return dict((k, v) for k, v in data.items() if k not in STORAGE_VARS)


class DiscoverRun(runner.Run):
    """playbooks/inventory_discover.yml through the runner, quiet, in check mode: each host's
    data_disk_candidates result, or why there is none."""

    def __init__(self, inventory, limit, argv=None, base=None):
        super().__init__(
            "inventory",
            PLAYBOOK,
            ["--check"],
            inventory=inventory,
            limit=limit,
            output="quiet",
            argv=argv,
            stream=io.StringIO(),
            base=base,
            label="inventory-discover",
        )
        self.results, self.problems = {}, {}

    def on_event(self, event):
        super().on_event(event)  # masked in place first
        from kunlun_fleet.status import _action, _message

        data = event.get("event_data") or {}
        host, kind = data.get("host"), event.get("event")
        if not host or not _action(data, "data_disk_candidates"):
            if host and kind == "runner_on_unreachable":
                self.problems[host] = "unreachable: " + _message(data.get("res"))
            return
        if kind == "runner_on_ok":
            self.results[host] = data.get("res") or {}
        elif kind == "runner_on_unreachable":
            self.problems[host] = "unreachable: " + _message(data.get("res"))
        elif kind == "runner_on_failed":
            self.problems[host] = "failed: " + _message(data.get("res"))


def serving_hosts(inventory, limit=None):
    """The xpu_servers hosts of the inventory (within --limit), in its order."""
    os.environ.setdefault("ANSIBLE_CONFIG", str(runner.root() / "ansible.cfg"))
    from ansible.errors import AnsibleError
    from ansible.inventory.manager import InventoryManager
    from ansible.parsing.dataloader import DataLoader

    try:
        manager = InventoryManager(loader=DataLoader(), sources=[str(inventory)])
        if limit:
            manager.subset(limit)
        found = [h.name for h in manager.get_hosts("xpu_servers")]
    except AnsibleError as exc:
        raise Refused("the inventory %s cannot be read: %s" % (inventory, exc)) from exc
    if not found:
        raise Refused(
            "no serving host (xpu_servers) in %s%s: discovery reads the serving hosts' disks"
            % (inventory, " within --limit %s" % limit if limit else "")
        )
    return found


def key_refusal(inventory, names, err):
    """Why discovery cannot log in to these hosts yet, as hostkeys judges their keys (None when
    every key is known or the host does not answer: the run says so)."""
    from kunlun_fleet import hostkeys

    try:
        hosts = hostkeys.read_inventory(inventory, ",".join(names))
    except hostkeys.Refused as exc:
        return str(exc)
    path = hostkeys.known_hosts_path(inventory)
    results = hostkeys.scan(hosts, path)
    changed = [r for r in results if r.status == hostkeys.CHANGED]
    for r in changed:
        err.write(hostkeys.changed_message(r, path) + "\n")
    new = [r.host.name for r in results if r.status == hostkeys.NEW]
    if changed:
        return "the SSH host key of %s CHANGED (above); nothing was read" % ", ".join(r.host.name for r in changed)
    if new:
        return (
            "the SSH host keys of %s are not known yet (%s); discovery logs in only to hosts whose keys are known and "
            "checked. Run `kunlun-fleet hostkeys -i %s --limit %s --accept` after comparing each fingerprint with the "
            "server's console, then discover again" % (", ".join(new), _show(path), _show(inventory), ",".join(new))
        )
    return None


def do_discover(inventory, limit=None, yes=False, force=False, stdin=None, out=None, err=None, argv=None, base=None):
    """Reads the serving hosts' disks, shows the choices, writes host_vars/<host>.yml;
    returns the exit code."""
    out, err = out or sys.stdout, err or sys.stderr
    if not Path(inventory).is_dir():
        raise Refused(
            "no inventory directory %s: write it first with `kunlun-fleet inventory -i %s --csv hosts.csv`"
            % (inventory, inventory)
        )
    names = serving_hosts(inventory, limit)
    why = key_refusal(inventory, names, err)
    if why:
        raise Refused(why)
    run = DiscoverRun(str(inventory), ",".join(names), argv=argv, base=base)
    code = run.run()
    if code == runner.INTERRUPTED:
        err.write("kunlun-fleet inventory: interrupted; nothing was written\n")
        return code
    if not run.results:
        said = (run.summary or {}).get("error_output") or []
        err.write(
            "kunlun-fleet inventory: no host was read (exit %d); nothing was written%s\n  report: %s\n"
            % (
                code if code != runner.OK else runner.ERROR,
                "".join("\n  " + line for line in said[:10]),
                run.dir / "summary.md",
            )
        )
        for host, why in sorted(run.problems.items()):
            err.write("  %s: %s\n" % (host, why))
        return code if code != runner.OK else runner.ERROR
    choices = [Choice(h, run.results[h]) for h in names if h in run.results]
    rows = [("HOST", "DISK", "SIZE", "STATE", "WHAT IT HOLDS", "CHOICE")]
    for c in choices:
        rows += c.rows()
    for h in names:
        if h not in run.results:
            rows.append((h, "-", "-", "-", run.problems.get(h, "not read"), "nothing written"))
    out.write(_table(rows) + "\n\n")
    changes = []
    for c in choices:
        rel = "host_vars/%s.yml" % c.host
        carried = _carried(Path(inventory) / rel)
        change = plan_file(inventory, rel, c.text(carried))
        if change.action == "replace":
            was = _storage_settings(Path(inventory) / rel)
            change.note = "; ".join(
                n
                for n in (
                    "it had %s" % was if was else "",
                    "keeps %s" % ", ".join(sorted(carried)) if carried else "",
                )
                if n
            )
        changes.append(change)
    if not force:
        command = "kunlun-fleet inventory -i %s --discover%s" % (inventory, " --limit %s" % limit if limit else "")
        refuse_replacing(changes, inventory, command)
    out.write("%s:\n%s\n" % (_show(inventory), "\n".join(_changes_lines(inventory, changes))))
    todo = [c for c in changes if c.action in ("create", "replace")]
    if todo:
        if not confirm("Write %d file(s) in %s?" % (len(todo), _show(inventory)), yes, stdin, out):
            raise Refused("not confirmed; nothing was written")
        _say_written(inventory, write_changes(inventory, changes), out)
    else:
        out.write("nothing to change\n")
    for h in names:
        if h not in run.results:
            err.write("kunlun-fleet inventory: %s not read (%s): nothing written for it\n" % (h, run.problems.get(h)))
    if any(not (c.data or c.adopt) for c in choices):
        err.write(
            "kunlun-fleet inventory: %s: no data disk found; list its disks in its host_vars before the deploy\n"
            % ", ".join(c.host for c in choices if not (c.data or c.adopt))
        )
    missing = [h for h in names if h not in run.results]
    if not missing:
        return runner.OK
    if all(run.problems.get(h, "").startswith("unreachable") for h in missing):
        return runner.UNREACHABLE
    return runner.FAILED


# ---------------------------------------------------------------- the command


def next_steps(inventory, discovered):
    inv = _show(inventory)
    steps = []
    if not discovered:
        steps += [
            "set in %s/group_vars/all/: connection.yml (the login user and its key, ansible_ssh_private_key_file), "
            "firewall.yml (firewall_admin_sources: this controller's network), stack.yml (kunlun_stack_bundle_dir)"
            % inv,
            "kunlun-fleet hostkeys -i %s --accept   (compare each fingerprint with the server's console first)" % inv,
            "kunlun-fleet inventory -i %s --discover   (each serving host's data disks into host_vars/)" % inv,
        ]
    steps += [
        "kunlun-fleet api-key -i %s   (the fleet's API key, in the vault: this command writes no secret)" % inv,
        "kunlun-fleet stage preflight -i %s   (reads every host and refuses what cannot work; changes nothing)" % inv,
    ]
    return "next:\n" + "\n".join("  %d. %s" % (i, s) for i, s in enumerate(steps, 1)) + "\n"


def run(
    inventory,
    csv_path=None,
    discover=False,
    limit=None,
    yes=False,
    force=False,
    argv=None,
    stdin=None,
    out=None,
    err=None,
    base=None,
    example=None,
):
    """`kunlun-fleet inventory`: returns the exit code."""
    out, err = out or sys.stdout, err or sys.stderr
    try:
        if not csv_path and not discover:
            raise Refused(
                "give --csv FILE (hosts.yml from a CSV of the servers), --discover (each serving host's data disks "
                "into host_vars/), or both"
            )
        if limit and not discover:
            raise Refused("--limit goes with --discover (the hosts whose disks are read)")
        if csv_path:
            do_csv(inventory, csv_path, yes=yes, force=force, stdin=stdin, out=out, example=example)
        code = runner.OK
        if discover:
            if csv_path:
                out.write("\n")
            code = do_discover(
                inventory, limit=limit, yes=yes, force=force, stdin=stdin, out=out, err=err, argv=argv, base=base
            )
    except runner.Refused as exc:
        err.write("kunlun-fleet inventory: %s\n" % exc)
        return runner.REFUSED
    except KeyboardInterrupt:
        err.write("\nkunlun-fleet inventory: interrupted; nothing more was written\n")
        return runner.INTERRUPTED
    if code in (runner.OK, runner.UNREACHABLE, runner.FAILED):
        out.write("\n" + next_steps(inventory, discover))
    return code
