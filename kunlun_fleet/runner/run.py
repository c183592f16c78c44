"""One playbook run (Run): the environment, ansible-runner, Ctrl-C, the output, the report;
run_playbook, what deploy, stage and bench call."""

import json
import os
import shlex
import shutil
import signal
import sys
import threading
import time
from pathlib import Path

from kunlun_fleet.runner.checkout import _cfg, _venv_bin, ansible_env, root
from kunlun_fleet.runner.exit_codes import (
    ERROR,
    FAILED,
    INTERRUPTED,
    OK,
    PARTIAL,
    REFUSED,
    REFUSING_STAGE,
    UNREACHABLE,
    Refused,
)
from kunlun_fleet.runner.json_events import json_line
from kunlun_fleet.runner.live_view import render
from kunlun_fleet.runner.masking import ANSI, Masker
from kunlun_fleet.runner.report import build_summary, closing_lines, stack_info, summary_markdown
from kunlun_fleet.runner.run_dirs import new_run_dir
from kunlun_fleet.runner.stages import playbook_plays, write_selection
from kunlun_fleet.runner.tracking import Tracker
from kunlun_fleet.runner.vaulted import vault_secrets, vault_sources

# Seconds ansible-playbook gets to stop after Ctrl-C before it is cancelled (killed).
CANCEL_GRACE = 10
# Interactive prompts ansible-playbook can show; answered from the operator's terminal
# before the run (ansible-playbook runs on a pseudo-terminal of its own).
PROMPTS = [
    (("-k", "--ask-pass"), "SSH password", r"^SSH password:\s*?$"),
    (("-K", "--ask-become-pass"), "BECOME password", r"^BECOME password.*:\s*?$"),
    (("-J", "--ask-vault-pass", "--ask-vault-password"), "Vault password", r"^Vault password.*:\s*?$"),
]


class Run:
    """One playbook run: the environment, ansible-runner, the output, the report."""

    def __init__(
        self,
        command,
        playbook,
        args=(),
        inventory=None,
        limit=None,
        stages=None,
        selection=None,
        output="plain",
        resume=None,
        base=None,
        keep=None,
        argv=None,
        stream=None,
        label=None,
    ):
        self.base = Path(base or root())
        self.command = command
        self.label = label or command  # the run id's tail
        self.playbook = str(self.base / playbook)
        self.args = list(args)
        self.inventory_given = inventory
        self.inventory = self._resolve(inventory)
        self.limit = limit
        self.stages = (
            stages
            if stages is not None
            else [
                {
                    "stage": Path(playbook).stem,
                    "name": Path(playbook).stem,
                    "import": self.playbook,
                    "plays": playbook_plays(self.playbook) if os.path.exists(self.playbook) else [],
                }
            ]
        )
        self.selection = selection  # True: a deploy --from/--only (self.stages are the chosen)
        self.output = output
        # (head, tail, "from" | "only" | None): the resume command is head, --from/--only,
        # --limit, tail.
        self.resume = resume
        self.keep = keep
        self.argv = argv or ["kunlun-fleet", command] + self.args
        self.out = stream or sys.stdout
        self.interrupted = False
        self.interrupts = 0
        self.interrupted_at = None
        self.ansible_pid = None  # ansible-playbook's own process, from its events
        self.write_lock = threading.Lock()
        self.broken_pipe = False

    def _resolve(self, inventory):
        """As given when it exists from here; else from the checkout (as `deploy` always
        resolved it); else as given (ansible-playbook names what it cannot read)."""
        if not inventory:
            return None
        if os.path.exists(inventory):
            return os.path.abspath(inventory)
        if (self.base / inventory).exists():
            return str(self.base / inventory)
        if "," in inventory:  # a host list ("host1,host2,"), as ansible-playbook takes it
            return inventory
        raise Refused(
            "no inventory %r (looked in %s and in the checkout %s): give the inventory directory, "
            "e.g. -i inventories/site-a" % (inventory, os.getcwd(), self.base)
        )

    def _write(self, text):
        if self.broken_pipe:
            return
        try:
            with self.write_lock:
                self.out.write(text)
                self.out.flush()
        except BrokenPipeError:
            self.broken_pipe = True

    # -- the environment and ansible-runner's arguments

    def envvars(self):
        env = ansible_env(self.inventory, self.base)
        extra = {
            "ANSIBLE_CONFIG": env["ANSIBLE_CONFIG"],
            "PATH": _venv_bin() + os.pathsep + os.environ.get("PATH", ""),
            # ansible-runner turns host key checking off unless told: keep ansible.cfg's.
            "ANSIBLE_HOST_KEY_CHECKING": os.environ.get("ANSIBLE_HOST_KEY_CHECKING")
            or _cfg(self.base, "defaults", "host_key_checking", "True"),
        }
        if "ANSIBLE_VAULT_PASSWORD_FILE" in env:
            extra["ANSIBLE_VAULT_PASSWORD_FILE"] = env["ANSIBLE_VAULT_PASSWORD_FILE"]
        tty = self.output == "plain" and hasattr(self.out, "isatty") and self.out.isatty()
        # Its pseudo-terminal would make it colour; only a true ANSIBLE_FORCE_COLOR asks for
        # that ("0" or "false" is Ansible's boolean false, as a caller piping the output sets it).
        forced = os.environ.get("ANSIBLE_FORCE_COLOR", "").strip().lower() in ("1", "true", "yes", "on", "y", "t")
        if not tty and not forced:
            extra["ANSIBLE_NOCOLOR"] = "1"
        return extra

    def cmdline(self):
        args = []
        if self.inventory:
            args += ["-i", self.inventory]
        return args + self.args

    def passwords(self):
        """Answers to the prompts the operator asked for (-k, -K, --ask-vault-pass), read
        here, kept in memory only."""
        import getpass

        answers = {}
        for flags, label, pattern in PROMPTS:
            if any(a in flags for a in self.args):
                answers[pattern] = getpass.getpass("%s: " % label)
        return answers

    def password_file(self):
        for i, arg in enumerate(self.args):
            if arg == "--vault-password-file" and i + 1 < len(self.args):
                return self.args[i + 1]
            if arg.startswith("--vault-password-file="):
                return arg.split("=", 1)[1]
        return None

    # -- the run

    def run(self):
        self.dir = new_run_dir(self.label, self.base, self.keep)
        self.id = self.dir.name
        self.masker = Masker()
        self.tracker = Tracker(self.stages, self.masker)
        playbook = self.playbook
        if self.selection:
            playbook = str(write_selection(self.stages, self.dir / "site.yml"))
        (self.dir / "env").mkdir(mode=0o700)
        # Check for Ctrl-C every half second (ansible-runner's default is 5 s).
        (self.dir / "env" / "settings").write_text(json.dumps({"pexpect_timeout": 0.5}))
        self.started = time.time()
        status, rc, self.error = "failed", None, None
        try:
            passwords = self.passwords()
            vault_password = next((v for k, v in passwords.items() if k.startswith("^Vault")), None)
            self.masker = self.tracker.masker = Masker(
                vault_secrets(self.inventory, self.password_file(), vault_password, vault_sources(self.args))
            )
            status, rc = self._run(playbook, passwords)
        except KeyboardInterrupt:
            self.interrupted = True
        except Exception as exc:  # ansible-runner refused its configuration, or died
            self.error = "%s: %s" % (type(exc).__name__, exc)
            sys.stderr.write("kunlun-fleet: the run stopped on an error of its own: %s\n" % self.error)
        finally:
            self.ended = time.time()
            code = self.exit_code(rc)
            self.summary = self.report(code, status, rc)
            self._tidy_artifacts()
            self._final(code)
        return code

    def _run(self, playbook, passwords):
        import ansible_runner

        def handler(event):
            try:
                self.on_event(event)
            except Exception as exc:  # a display problem never stops the run
                sys.stderr.write("kunlun-fleet: event %s not shown: %s\n" % (event.get("event"), exc))
            return True

        previous = {}
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, self._interrupt)
        try:
            thread, runner = ansible_runner.run_async(
                private_data_dir=str(self.dir),
                artifact_dir=str(self.dir),
                ident="artifacts",
                project_dir=str(self.base),
                playbook=playbook,
                cmdline=shlex.join(self.cmdline()),
                limit=self.limit,
                envvars=self.envvars(),
                passwords=passwords or None,
                event_handler=handler,
                cancel_callback=self._cancel,
                quiet=True,
                suppress_env_files=True,
                fact_cache_type=None,
            )
            if self.output == "live":
                self._live(thread)
            else:
                while thread.is_alive():
                    thread.join(0.2)
        finally:
            for sig, old in previous.items():
                signal.signal(sig, old)
        return runner.status, runner.rc

    def _interrupt(self, signum, frame):
        """Ctrl-C (or SIGTERM): ask ansible-playbook to stop as its own Ctrl-C does (it
        passes the signal to its workers, which stop their tasks' processes); the cancel
        below ends it for good when it has not stopped within CANCEL_GRACE seconds, or at a
        second Ctrl-C. ansible-playbook runs on a terminal of its own: the operator's Ctrl-C
        reaches this process only."""
        self.interrupts += 1
        if self.interrupts == 1:
            self.interrupted, self.interrupted_at = True, time.time()
            sys.stderr.write(
                "\nkunlun-fleet: interrupted: stopping ansible-playbook (Ctrl-C again: at once), then the report\n"
            )
            if self.ansible_pid:
                try:
                    os.kill(self.ansible_pid, signal.SIGINT)
                except OSError:
                    pass
        else:
            sys.stderr.write("kunlun-fleet: stopping ansible-playbook now\n")

    def _cancel(self):
        """ansible-runner's cancel_callback: True kills ansible-playbook's process group."""
        if not self.interrupted:
            return False
        return self.ansible_pid is None or self.interrupts > 1 or time.time() - self.interrupted_at > CANCEL_GRACE

    def _live(self, thread):
        from rich.console import Console
        from rich.live import Live
        from rich.text import Text

        console = Console(file=self.out)
        title = "kunlun-fleet %s  %s%s%s" % (
            self.label.replace("-", " ", 1),
            self.inventory_given or "",
            "  --limit %s" % self.limit if self.limit else "",
            "  (check mode)" if self.check_mode() else "",
        )
        with Live(
            render(self.tracker, title),
            console=console,
            refresh_per_second=4,
            redirect_stdout=False,
            redirect_stderr=False,
        ) as live:
            while thread.is_alive():
                thread.join(0.25)
                with self.tracker.lock:
                    notes, self.tracker.notes = self.tracker.notes, []
                for host, f in notes:
                    line = Text(
                        "%s %s  %s / %s: %s"
                        % ("UNREACHABLE" if f["unreachable"] else "FAILED", host, f["stage"], f["task"], f["message"]),
                        style="magenta" if f["unreachable"] else "red",
                    )
                    live.console.print(line)
                live.update(render(self.tracker, title))
            if self.interrupted:
                with self.tracker.lock:
                    for h in self.tracker.hosts.values():
                        if h["state"] == "running":
                            h["state"] = "interrupted"
            live.update(render(self.tracker, title))

    def on_event(self, event):
        """Masks the event in place (ansible-runner then stores it masked), records it,
        and shows it as the output mode says."""
        if self.ansible_pid is None and event.get("pid"):
            self.ansible_pid = event["pid"]
        if event.get("stdout"):
            event["stdout"] = self.masker.text(event["stdout"])
        if event.get("event_data"):
            event["event_data"] = self.masker.obj(event["event_data"])
        self.tracker.feed(event)
        if self.output == "plain" and event.get("stdout"):
            self._write(event["stdout"].replace("\r\n", "\n") + "\n")
        elif self.output == "json":
            self._write(json.dumps(json_line(event, self.tracker, self.masker)) + "\n")

    # -- the outcome

    def check_mode(self):
        return any(a in ("-C", "--check") for a in self.args)

    def failed_hosts(self):
        return [h for h, v in self.tracker.hosts.items() if v["failed"] and v["failure"]]

    def unreachable_hosts(self):
        return [h for h, v in self.tracker.hosts.items() if v["unreachable"] and not v["failed"]]

    def within_budget(self):
        """The run went on to its end with the hosts it left out: the failure budget's last
        verdict, after every host's failure, let the rest go on (and none stopped it)."""
        b = self.tracker.budget
        return bool(
            b
            and b["within"]
            and self.tracker.budget_stop is None
            and b["seq"] > self.tracker.last_failure_seq
            and (self.failed_hosts() or self.unreachable_hosts())
        )

    def exit_code(self, rc):
        if self.interrupted:
            return INTERRUPTED
        if self.within_budget():
            return PARTIAL
        failed = self.failed_hosts()
        if failed:
            # Refused: only preflight failed a host (the hosts it leaves out are not changed,
            # and over the budget it stops the run before any host is).
            stages = {self.tracker.hosts[h]["failure"]["stage"] for h in failed}
            return REFUSED if stages <= {REFUSING_STAGE} else FAILED
        if self.unreachable_hosts():
            return UNREACHABLE
        stop = self.tracker.budget_stop
        if stop:  # the budget itself refused (a malformed value), no host failed
            return REFUSED if stop["stage"] == REFUSING_STAGE else FAILED
        return OK if rc == 0 else ERROR

    def resume_command(self, code):
        """The command that finishes the job: from the first stage that failed (or was
        running when interrupted), for the failed and unreachable hosts when the run carried
        on to its last stage with the others, else for every host of the run (preflight and
        a stopped rollout end the run for every host)."""
        if self.resume is None or code in (OK, ERROR):
            return None
        head, tail, how = self.resume
        names = [s["stage"] for s in self.stages]
        bad = self.failed_hosts() + self.unreachable_hosts()
        started = [n for n in names if self.tracker.stages[n]["start"] is not None]
        if bad:
            firsts = [self.tracker.hosts[h]["failure"]["stage"] for h in bad]
            stage = min(firsts, key=lambda s: names.index(s) if s in names else len(names))
        else:
            stage = started[-1] if started else (names[0] if names else None)
        # A stop by the failure budget leaves the later stages' plays started but hostless.
        carried_on = code == PARTIAL or (
            bool(names) and names[-1] in started and not self.interrupted and not self.tracker.budget_stop
        )
        limit = ",".join(bad) if bad and carried_on else self.limit
        cmd = list(head)
        if how == "only" and stage in names:
            cmd += ["--only", ",".join(names[names.index(stage) :])]
        elif how == "from" and stage in names:
            cmd += ["--from", stage]
        if limit:
            cmd += ["--limit", limit]
        return self.masker.text(shlex.join(cmd + list(tail)))

    def stack(self):
        """The stack and pins this run deploys, and the image tag when this run computed it."""
        return stack_info(self.base, self.tracker.image_tag, self.inventory, self.extra_stack())

    def extra_stack(self):
        """kunlun_stack_stack as this run's extra vars give it (-e name=value or -e JSON), or None."""
        args = list(self.args)
        for flag, value in zip(args, args[1:], strict=False):
            if flag not in ("-e", "--extra-vars"):
                continue
            if value.lstrip().startswith("{"):
                try:
                    found = json.loads(value).get("kunlun_stack_stack")
                except (ValueError, AttributeError):
                    found = None
                if found:
                    return str(found)
            elif value.startswith("kunlun_stack_stack="):
                return value.split("=", 1)[1]
        return None

    def report(self, code, status, rc):
        summary = build_summary(self, code, status, rc)
        (self.dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        (self.dir / "summary.md").write_text(summary_markdown(summary))
        return summary

    def error_output(self, lines=20):
        """What ansible-playbook said when it stopped without naming a host: from its
        first error line on (masked)."""
        try:
            text = (self.dir / "artifacts" / "stdout").read_text(errors="replace")
        except OSError:
            return [self.error] if self.error else []
        text = ANSI.sub("", self.masker.text(text)).replace("\r\n", "\n").splitlines()
        first = next((i for i, line in enumerate(text) if "ERROR" in line), max(0, len(text) - lines))
        return [line for line in text[first : first + lines]] + ([self.error] if self.error else [])

    def _tidy_artifacts(self):
        """ansible-runner's `command` file holds the whole environment: keep the command
        and its directory only. Its stdout copy is masked like everything else."""
        art = self.dir / "artifacts"
        try:
            data = json.loads((art / "command").read_text())
            (art / "command").write_text(json.dumps({"command": data.get("command"), "cwd": data.get("cwd")}))
        except (OSError, ValueError):
            pass
        try:
            text = (art / "stdout").read_text(errors="replace")
            (art / "stdout").write_text(self.masker.text(text))
        except OSError:
            pass
        shutil.rmtree(self.dir / "env", ignore_errors=True)

    def _final(self, code):
        s = self.summary
        path = (
            os.path.relpath(self.dir / "summary.md")
            if str(self.dir).startswith(os.getcwd())
            else str(self.dir / "summary.md")
        )
        if self.output == "json":
            self._write(
                json.dumps(
                    {
                        "event": "kunlun_fleet_summary",
                        "id": s["id"],
                        "status": s["status"],
                        "exit_code": code,
                        "failed_hosts": s["failed_hosts"],
                        "unreachable_hosts": s["unreachable_hosts"],
                        "report": str(self.dir / "summary.json"),
                        "resume": s["resume"],
                    }
                )
                + "\n"
            )
            return
        self._write("\n".join(closing_lines(self.command, s, code, path)) + "\n")


def run_playbook(command, playbook, args=(), **kwargs):
    """Runs a playbook as `command` and returns the exit code (see the module's doc)."""
    try:
        run = Run(command, playbook, args, **kwargs)
    except Refused as exc:
        sys.stderr.write("kunlun-fleet %s: %s\n" % (command, exc))
        return REFUSED
    return run.run()
