"""Errors that carry a one-line message for the user (the CLI prints them and exits 2)."""


class MoelabError(Exception):
    """A user-facing error: bad input, missing backend, unusable database. One line, exit code 2."""


class SpecError(MoelabError, ValueError):
    """An invalid workload, suite or run specification."""


class BackendUnavailable(MoelabError):
    """A backend cannot run here; the message is the reason (package missing, no GPU, ...)."""
