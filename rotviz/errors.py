"""The one exception type a user sees: its message says what is wrong and what to do."""


class RotvizError(Exception):
    """A problem with the user's input; the CLI prints it as one line and exits with code 2."""

