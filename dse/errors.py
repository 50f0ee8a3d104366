"""Errors a user can fix: the CLI prints them on one line and exits 2."""


class InputError(ValueError):
    """Bad input: the message names the field and what is allowed."""
