"""The one exception type a user sees: its message says what is wrong and what to do."""


class RotvizError(Exception):
    """A problem with the user's input; the CLI prints it as one line and exits with code 2."""


def read_json(path, remedy: str):
    """A JSON file's content; a file that does not parse is one line ending in `remedy`."""
    import json
    from pathlib import Path

    try:
        return json.loads(Path(path).read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise RotvizError(f"cannot parse '{path}' ({e.__class__.__name__}); {remedy}") from None
