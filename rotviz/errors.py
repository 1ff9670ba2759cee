"""The one exception type a user sees: its message says what is wrong and what to do."""


class RotvizError(Exception):
    """A problem with the user's input; the CLI prints it as one line and exits with code 2."""


def read_json(path, remedy: str):
    """A JSON file's content; a file that does not parse is one line ending in `remedy`.
    Read through rotviz.confine (regular files only, bounded size and depth, no NaN)."""
    from rotviz.confine import ANYWHERE

    return ANYWHERE.read_json(path, remedy)
