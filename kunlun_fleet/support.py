"""kunlun-fleet support-bundle: what an engineer needs from a misbehaving fleet, in one
tar.gz that reads without the fleet.

One run of playbooks/status.yml (read-only, in check mode, as `status` runs it) with
status_support=true: per host collect_outputs returns the raw outputs the parsers read
(xpu-smi -q and the others, the /proc/kunlun and /proc/xpu state files, docker info, ...)
and the serving unit's diagnostics (dmesg's tail, the unit and its journal's tail, vLLM's
log tail, docker inspect of the serving container, serve.env, the driver's local facts),
secrets masked on the host. Here, on the controller, every text is masked again with the
inventory's vaulted values (the runner's masker), and the bundle is read back and refused
(removed, exit 1) if any vaulted value is still in it.

The bundle: <name>/README.txt (what is where), status.txt and status.json (the status table
and document of the same run), hosts/<host>/<file> with hosts/<host>/index.json (the command
behind each file, its exit status, what was missing and why), last-run/ (the summary of the
newest deploy or stage run of the inventory in reports/runs/), and from each gateway the engine watchdog's
state (watchdog/<gateway>/state.json) and its evidence archives of the hosts in the bundle,
unpacked (hosts/<host>/watchdog/<gateway>/<archive>/...), masked like the hosts' files;
watchdog/index.json says what was found where. No watchdog on a gateway: nothing of it.

Exit codes: 0 the bundle is written with every host in it; 4 written, a host was
unreachable (its index.json says so); 1 nothing written (the run failed, or a secret
survived the masking); 3 refused input.
"""

import base64
import datetime
import io
import json
import os
import re
import shutil
import sys
import tarfile
import tempfile
from pathlib import Path

from kunlun_fleet import runner, status

README = """kunlun-fleet support bundle
made:      {made}
command:   {command}
inventory: {inventory}
hosts:     {hosts}

status.txt, status.json   `kunlun-fleet status` of the same moment: one row per host
hosts/<host>/index.json   per file: the command that made it, its exit status; what was
                          missing on the host and why
hosts/<host>/...          xpu-smi.txt, xpu-smi-q.txt, xpu-smi-L.txt, proc_kunlun_version.txt,
                          proc_xpu_devN_state.txt, lspci-Dn.txt, lsmod.txt, docker-info.json,
                          findmnt.json, blkid.txt, lsblk.txt, os-release.txt, uname-a.txt,
                          dmesg-tail.txt, unit.txt, unit-status.txt, journal-tail.txt
                          (the serving unit), vllm-log-tail.txt, docker-inspect.json (the
                          serving container), serve.env, xpu-facts.json (the driver's facts)
last-run/                 the newest deploy or stage run of the inventory (summary.md, .json)
watchdog/<gateway>/state.json
                          the engine watchdog's state on each gateway that runs it: which
                          hosts it quarantined, why, since when (watchdog/index.json: what
                          was found on each gateway)
hosts/<host>/watchdog/<gateway>/<archive>/
                          the watchdog's evidence of that host, unpacked from its archive
                          (<host>-<UTC time>.tar.gz on the gateway): verdict.json, the
                          worker's /metrics over the rounds before the verdict, the
                          router's worker list

Masked before anything was written: serial numbers, MAC and IP addresses (placeholders,
equal values equal: SERIAL-0001, 192.0.2.1, ...), the value of every KEY/TOKEN/SECRET/
PASSWORD assignment, --api-key argument and bearer token (********), and every value the
inventory keeps in ansible-vault. The API key file itself is never read.
"""


def default_output(base):
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return Path(base) / "reports" / "support" / ("support-%s.tar.gz" % stamp)


def last_run(base, inventory):
    """The newest deploy or stage run of this inventory (not a status or support run, nor
    another inventory's from the same checkout): its directory, or None."""
    for summary in reversed(runner.list_runs(base)):
        if (
            summary.get("command") in ("deploy", "stage")
            and summary.get("id")
            and status.same_inventory(summary.get("inventory"), inventory)
        ):
            path = runner.runs_dir(base) / summary["id"]
            if path.is_dir():
                return path
    return None


def _texts(root):
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            yield os.path.join(dirpath, name)


def mask_tree(root, masker):
    """Every file under root masked again with the run's masker (the vaulted values)."""
    for path in _texts(root):
        with open(path, encoding="utf-8", errors="replace") as fh:
            text = fh.read()
        masked = masker.text(text)
        if masked != text:
            with open(path, "w", encoding="utf-8") as fh:
                fh.write(masked)


def secrets_in(archive, masker):
    """Names of the archive's members that still hold a vaulted value (none, normally)."""
    if masker.secrets is None:
        return []
    found = []
    with tarfile.open(archive, "r:gz") as tar:
        for member in tar.getmembers():
            if member.isfile():
                data = tar.extractfile(member).read().decode("utf-8", errors="replace")
                if masker.secrets.search(data):
                    found.append(member.name)
    return found


# An evidence archive is a few /metrics texts: more than this unpacked is not one.
EVIDENCE_MAX_BYTES = 64 * 1024 * 1024


def _safe(name):
    return re.sub(r"[^A-Za-z0-9._-]", "_", name).lstrip(".") or "_"


def evidence_host(archive, hosts):
    """The host an evidence archive (<host>-<UTC time>.tar.gz, the host name made file-safe
    as the watchdog does) is of: the longest name of `hosts` that prefixes it, else None."""
    name = os.path.basename(archive)
    found = [h for h in hosts if name.startswith(re.sub(r"[^A-Za-z0-9._-]", "_", h) + "-")]
    return max(found, key=len) if found else None


def unpack_evidence(data, archive):
    """[(relative path, text)] of an evidence archive's regular files (the watchdog's own
    top directory, named after the archive, left out); links, devices and paths that leave
    the directory are skipped. Raises ValueError for what is not a gzipped tar, or too big."""
    stem = os.path.basename(archive)
    stem = stem[: -len(".tar.gz")] if stem.endswith(".tar.gz") else stem
    files, total = [], 0
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
            for member in tar.getmembers():
                if not member.isfile():
                    continue
                parts = [p for p in member.name.replace("\\", "/").split("/") if p not in ("", ".", "..")]
                if len(parts) > 1 and parts[0] == stem:
                    parts = parts[1:]
                if not parts:
                    continue
                total += member.size
                if total > EVIDENCE_MAX_BYTES:
                    raise ValueError("more than %d bytes unpacked" % EVIDENCE_MAX_BYTES)
                text = tar.extractfile(member).read().decode("utf-8", errors="replace")
                files.append(("/".join(_safe(p) for p in parts), text))
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise ValueError("not a readable tar.gz (%s)" % exc) from exc
    return files


def _slurped(item):
    """(text or None, error) of a slurp result item."""
    if item.get("unreachable"):
        return None, "unreachable: %s" % status._message(item)
    if not item.get("content"):
        return None, status._message(item)
    try:
        return base64.b64decode(item["content"]), ""
    except (ValueError, TypeError) as exc:
        return None, "not base64 (%s)" % exc


def write_watchdog(top, states, evidence, hosts):
    """The engine watchdog's part of the bundle under `top`, from the status run's slurps:
    each gateway's state.json (`states`, status.WATCHDOG_TASK's results) as
    watchdog/<gateway>/state.json, and each evidence archive (`evidence`,
    status.EVIDENCE_TASK's results) of a host of `hosts` unpacked under
    hosts/<host>/watchdog/<gateway>/<archive>/; every text masked as the hosts' files are
    (collect_outputs: secrets, then serials and addresses, one masker for all of them), and
    watchdog/index.json. Nothing is written when no gateway has a watchdog. Returns the index."""
    top = Path(top)
    masking = status._collect_module()
    index = {"gateways": {}, "evidence": []}
    texts = []  # (path under top, text), written once all are masked
    for item in states or []:
        gw = item.get("status_gateway") or item.get("item")
        if not gw:
            continue
        data, error = _slurped(item)
        entry = {"state": "read", "file": None, "error": ""}
        if data is None:
            entry["state"] = "absent" if "not found" in error.lower() else "unreadable"
            entry["state"] = "unreachable" if item.get("unreachable") else entry["state"]
            entry["error"] = "" if entry["state"] == "absent" else error
        else:
            entry["file"] = "watchdog/%s/state.json" % _safe(gw)
            texts.append((entry["file"], data.decode("utf-8", errors="replace")))
        index["gateways"][gw] = entry
    for item in evidence or []:
        gw, path = (list(item.get("status_evidence_file") or []) + [None, None])[:2]
        if not gw or not path:
            continue
        host = evidence_host(path, hosts)
        entry = {"gateway": gw, "archive": path, "host": host, "dir": None, "files": [], "error": ""}
        index["evidence"].append(entry)
        if host is None:
            entry["error"] = "of no host in the bundle"
            continue
        data, error = _slurped(item)
        if data is None:
            entry["error"] = error
            continue
        name = os.path.basename(path)
        name = name[: -len(".tar.gz")] if name.endswith(".tar.gz") else name
        entry["dir"] = "hosts/%s/watchdog/%s/%s" % (_safe(host), _safe(gw), _safe(name))
        try:
            files = unpack_evidence(data, path)
        except ValueError as exc:
            entry.update(dir=None, error=str(exc))
            continue
        for rel, text in files:
            entry["files"].append(rel)
            texts.append(("%s/%s" % (entry["dir"], rel), text))
    if not texts and not any(e["state"] != "absent" for e in index["gateways"].values()) and not index["evidence"]:
        return index
    masker = masking.Masker()
    masker.learn([t for _p, t in texts])
    for rel, text in texts:
        text, _n = masking.mask_secrets(text)
        target = top / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(masker.text(text))
    (top / "watchdog").mkdir(exist_ok=True)
    (top / "watchdog" / "index.json").write_text(json.dumps(index, indent=2) + "\n")
    return index


def _private_file(path):
    """`path` opened for writing, created 0600 (whatever the umask) and exclusively, never
    through a link: the bundle is private from its first byte. A .partial a killed run left
    is removed first."""
    if os.path.lexists(path):
        os.unlink(path)
    fd = os.open(str(path), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    return os.fdopen(fd, "wb")


def run(inventory, limit=None, output=None, argv=None, base=None, out=None):
    out = out or sys.stdout
    base = Path(base or runner.root())
    archive = Path(output) if output else default_output(base)
    if archive.exists():
        sys.stderr.write("kunlun-fleet support-bundle: %s exists; give another -o FILE\n" % archive)
        return runner.REFUSED
    if not archive.name.endswith((".tar.gz", ".tgz")):
        sys.stderr.write("kunlun-fleet support-bundle: -o %s: name the file *.tar.gz (it is a gzipped tar)\n" % archive)
        return runner.REFUSED
    try:
        archive.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        sys.stderr.write("kunlun-fleet support-bundle: -o %s: %s\n" % (archive, exc.strerror or exc))
        return runner.REFUSED
    code, support_run, doc = status.read_fleet(
        "support-bundle", inventory, limit, argv=argv, base=base, collect=True, support=True
    )
    if doc is None:
        return code
    report = support_run.dir / "summary.md"
    if not doc["hosts"]:
        said = (support_run.summary or {}).get("error_output") or ["no host was read"]
        sys.stderr.write(
            "kunlun-fleet support-bundle: no host was read; nothing written%s\n  report: %s\n"
            % ("".join("\n  " + line for line in said), report)
        )
        return code if code != runner.OK else runner.ERROR

    name = archive.name[: -len(".tar.gz")] if archive.name.endswith(".tar.gz") else archive.stem
    masker = support_run.masker
    with tempfile.TemporaryDirectory(prefix="kunlun-support-") as tmp:
        top = Path(tmp) / name
        missed = status.not_collected(doc)
        written = status.write_collection(str(top / "hosts"), support_run.state["outputs"], missed)
        watchdog = write_watchdog(
            top, support_run.state.get("watchdog"), support_run.state.get("evidence"), [r["host"] for r in doc["hosts"]]
        )
        (top / "status.json").write_text(status.render_json(doc))
        (top / "status.txt").write_text(status.render_table(doc))
        previous = last_run(base, inventory)
        if previous is not None:
            (top / "last-run").mkdir()
            for item in ("summary.md", "summary.json"):
                if (previous / item).is_file():
                    shutil.copyfile(previous / item, top / "last-run" / item)
        (top / "README.txt").write_text(
            README.format(
                made=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                command=" ".join(argv or ["kunlun-fleet", "support-bundle"]),
                inventory=support_run.inventory,
                hosts=", ".join("%s (%d files)" % (h, n) for h, n in sorted(written.items())) or "-",
            )
        )
        mask_tree(top, masker)
        partial = archive.with_name(archive.name + ".partial")
        with _private_file(partial) as handle, tarfile.open(fileobj=handle, mode="w:gz") as tar:
            tar.add(str(top), arcname=name)
    leaked = secrets_in(partial, masker)
    if leaked:
        partial.unlink()
        sys.stderr.write(
            "kunlun-fleet support-bundle: a vaulted value survived the masking in %s; the bundle was "
            "removed, nothing is written. Report this as a bug.\n" % ", ".join(leaked)
        )
        return runner.ERROR
    partial.rename(archive)
    size = archive.stat().st_size
    collected = sum(1 for n in written.values() if n)
    out.write(
        "support bundle: %s (%s, %d of %d host(s) collected, %d files)\n"
        % (archive, status.human_bytes(size), collected, len(written), sum(written.values()))
    )
    for host in sorted(missed):
        out.write("  %s: not collected: %s\n" % (host, missed[host]))
    read = sorted(gw for gw, e in watchdog["gateways"].items() if e["state"] == "read")
    unpacked = [e for e in watchdog["evidence"] if e["dir"]]
    if read or watchdog["evidence"]:
        out.write(
            "  engine watchdog: state of %s; %d evidence archive(s)%s\n"
            % (
                ", ".join(read) or "no gateway",
                len(unpacked),
                " (%d not taken: watchdog/index.json says why)" % (len(watchdog["evidence"]) - len(unpacked))
                if len(unpacked) < len(watchdog["evidence"])
                else "",
            )
        )
    if previous is None:
        out.write("  no deploy or stage run in %s to include\n" % runner.runs_dir(base))
    return runner.UNREACHABLE if missed else runner.OK
