"""The exit codes of deploy, stage and bench (the package's doc says what each means), and
the refusal of a command line before anything ran."""

OK, ERROR, FAILED, REFUSED, UNREACHABLE, PARTIAL, INTERRUPTED = 0, 1, 2, 3, 4, 5, 130
EXIT_MEANING = {
    OK: "every host ok",
    ERROR: "error (no host named)",
    FAILED: "failed hosts",
    REFUSED: "refused input (preflight)",
    UNREACHABLE: "unreachable hosts",
    PARTIAL: "partial: hosts left out within the failure budget, the others done",
    INTERRUPTED: "interrupted",
}
# The module whose result, once after each stage, says whether the hosts a run left out are
# within the failure budget (library/failure_budget.py).
BUDGET_ACTIONS = ("failure_budget", "kunlun.fleet.failure_budget")
# The stage whose failure means the input was refused (it reads, never changes a host).
REFUSING_STAGE = "preflight"


class Refused(Exception):
    """The command line asks for something that does not exist; nothing ran."""
