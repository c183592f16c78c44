"""The exit codes of deploy, stage and bench (the package's doc says what each means), and
the refusal of a command line before anything ran."""

OK, ERROR, FAILED, REFUSED, UNREACHABLE, INTERRUPTED = 0, 1, 2, 3, 4, 130
EXIT_MEANING = {
    OK: "every host ok",
    ERROR: "error (no host named)",
    FAILED: "failed hosts",
    REFUSED: "refused input (preflight)",
    UNREACHABLE: "unreachable hosts",
    INTERRUPTED: "interrupted",
}
# The stage whose failure means the input was refused (it reads, never changes a host).
REFUSING_STAGE = "preflight"


class Refused(Exception):
    """The command line asks for something that does not exist; nothing ran."""
