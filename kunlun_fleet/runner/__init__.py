"""Every command that runs a playbook (deploy, stage, bench) runs it here, through
ansible-runner's Python API: one place for the environment, the output, the run report
and the exit codes, so that each command behaves the same way.

The package's modules, by concern (kunlun_fleet.runner itself gives the names the rest of
the project uses):

  exit_codes   the exit codes and Refused (the command line refused before anything ran)
  checkout     the checkout whose playbooks run (root()), the ansible environment
  stages       site.yml's stages, --from/--only, the playbook of the chosen stages
  vaulted      the inventory's vaulted values, decrypted, for the masker
  masking      Masker: vaulted values and bearer tokens masked in everything printed or kept
  tracking     Tracker: what the events said (stages, hosts, counts, first failures)
  json_events  --json's line per event
  live_view    the live view on a terminal
  run_dirs     reports/runs/: a directory per run, rotation, listing, `kunlun-fleet runs`
  report       summary.json, summary.md, the lines printed at the end of a run
  run          Run (one playbook run) and run_playbook

One directory per run, the newest KEEP_RUNS (50) of each command kept:

  reports/runs/<UTC timestamp>-<command>/
      summary.json, summary.md   the run report (secrets masked)
      site.yml                   the playbook of a `deploy --from/--only` (site.yml's imports)
      artifacts/                 ansible-runner's: stdout, job_events/, rc, status, command

Output: on a terminal a live view (the stage bar, one line per host, or per group of hosts
in the same state beyond GROUP_ABOVE hosts); `--plain`, or stdout not a terminal, prints
what ansible-playbook prints; `--json` one JSON object per event per line.

Exit codes (deploy, stage, bench):
  0    every host ok
  1    error: ansible-playbook stopped on an error that names no host (a syntax error, a
       missing file, an option it refused), or the run could not start
  2    failed hosts: a task failed on one host or more (after preflight), or the failure
       budget stopped the run
  3    refused input: preflight failed on a host (and only preflight), or the command line was refused before
       anything ran (an unknown stage); no host was changed
  4    unreachable hosts, and no host failed
  5    partial: hosts left out within the failure budget (kunlun_stack_failure_budget), every
       other host finished; the report names each with its reason and the resume command
       (--limit of exactly those hosts)
  130  interrupted (Ctrl-C or SIGTERM): the run was cancelled, its report says "interrupted"

Ctrl-C stops ansible-playbook as its own Ctrl-C would (its workers stop their tasks), then
ansible-runner's cancel ends it if it is still running CANCEL_GRACE seconds later (or at a
second Ctrl-C); the report is written in every case. A task cut mid-way is done again by
the resume command (the stages are idempotent).
"""

from kunlun_fleet.runner.exit_codes import (
    ERROR,
    EXIT_MEANING,
    FAILED,
    INTERRUPTED,
    OK,
    PARTIAL,
    REFUSED,
    REFUSING_STAGE,
    UNREACHABLE,
    Refused,
)
from kunlun_fleet.runner.checkout import ROOT, ansible_env, root
from kunlun_fleet.runner.stages import playbook_plays, select_stages, site_stages, write_selection
from kunlun_fleet.runner.vaulted import vault_secrets, vault_sources
from kunlun_fleet.runner.masking import ANSI, BEARER, MASK, Masker
from kunlun_fleet.runner.tracking import COUNTS, STATS_KEYS, Tracker
from kunlun_fleet.runner.json_events import json_line
from kunlun_fleet.runner.live_view import GROUP_ABOVE, render
from kunlun_fleet.runner.run_dirs import (
    KEEP_RUNS,
    RUN_ID,
    find_run,
    list_runs,
    new_run_dir,
    rotate,
    run_kind,
    runs_dir,
    runs_table,
)
from kunlun_fleet.runner.report import build_summary, closing_lines, stack_info, summary_markdown
from kunlun_fleet.runner.run import CANCEL_GRACE, PROMPTS, Run, run_playbook

__all__ = [
    "ANSI",
    "BEARER",
    "CANCEL_GRACE",
    "COUNTS",
    "ERROR",
    "EXIT_MEANING",
    "FAILED",
    "GROUP_ABOVE",
    "INTERRUPTED",
    "KEEP_RUNS",
    "MASK",
    "Masker",
    "OK",
    "PARTIAL",
    "PROMPTS",
    "REFUSED",
    "REFUSING_STAGE",
    "ROOT",
    "RUN_ID",
    "Refused",
    "Run",
    "STATS_KEYS",
    "Tracker",
    "UNREACHABLE",
    "ansible_env",
    "build_summary",
    "closing_lines",
    "find_run",
    "json_line",
    "list_runs",
    "new_run_dir",
    "playbook_plays",
    "render",
    "root",
    "rotate",
    "run_kind",
    "run_playbook",
    "runs_dir",
    "runs_table",
    "select_stages",
    "site_stages",
    "stack_info",
    "summary_markdown",
    "vault_secrets",
    "vault_sources",
    "write_selection",
]
