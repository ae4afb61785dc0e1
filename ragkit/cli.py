"""The `ragkit` command. Every command lives in `ragkit/commands/` as a thin function over
the library, and takes --json. Exit codes: see `ragkit.commands._common`.
"""

from __future__ import annotations

import sys

import typer

import ragkit  # noqa: F401  (sets the offline switches first)

app = typer.Typer(
    help="Offline document question answering with page and section citations.\n\n"
    "Ingest PDF/Word/Markdown/text files, then ask questions answered only from them, by a model running on this machine.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _register_commands() -> None:
    import importlib

    from ragkit.commands import COMMANDS

    for name in COMMANDS:
        importlib.import_module(f"ragkit.commands.{name}").register(app)


_register_commands()


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        sys.exit(130)


if __name__ == "__main__":
    main()
