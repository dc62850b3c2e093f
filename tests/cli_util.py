"""What the CLI tests share: a command that must fail with one line, not a traceback."""

from __future__ import annotations

from aiayn.cli import main


def one_line_error(argv: list[str], capsys) -> str:
    """Run ``aiayn argv``, which must exit 2 with one line on stderr and no traceback;
    that line."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    return err


def with_settings(base: list[str], *more: str) -> list[str]:
    """The KEY=VALUE settings ``base`` with ``more`` in place of those of the same key:
    `aiayn train` refuses a key that its --set gives twice."""
    keys = {item.split("=", 1)[0] for item in more}
    return [*(item for item in base if item.split("=", 1)[0] not in keys), *more]
