"""What every command shares: settings from the options, errors as exit codes, JSON out.

Exit codes (the README's table): 0 success; 1 some input files failed; 2 usage or
configuration error; 3 model missing or unloadable, a generator server unreachable, or a
plan that does not fit this machine; 4 store error; 5 store locked by another writer;
130 interrupted.
"""

from __future__ import annotations

import json
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Optional

import typer
from rich.console import Console

from ragkit.errors import RagkitError

err = Console(stderr=True, soft_wrap=True)  # one line per message, greppable
out = Console()

StoreOpt = typer.Option(None, "--store", help="store folder (default ./.ragkit, or RAGKIT_STORE / ragkit.toml)")
JsonOpt = typer.Option(False, "--json", help="print machine-readable JSON on stdout")
# shown beside every citation the model did not mark itself (ask, chat)
INFERRED_NOTE = " [dim](inferred: matched by wording, the model gave no marker)[/]"

ProfileOpt = typer.Option(None, "--profile", help="settings profile: laptop (default) or kimi-k2")

def settings_for(store: Optional[Path], profile: Optional[str] = None, **extra: Any):
    from ragkit.config import load_settings

    overrides: dict[str, Any] = dict(extra)
    if store is not None:
        overrides["store"] = store
    if profile is not None:
        overrides["profile"] = profile
    return load_settings(**overrides)


def fail(exc: RagkitError, as_json: bool) -> None:
    if as_json:
        print(json.dumps({"error": str(exc), "exit_code": exc.exit_code}))
    err.print(f"[bold red]error:[/] {exc}", highlight=False, markup=True, soft_wrap=True) if not as_json else None
    raise typer.Exit(exc.exit_code)


def print_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, ensure_ascii=False, indent=2) + "\n")
    sys.stdout.flush()


@contextmanager
def command_errors(as_json: bool, interrupted: str = "interrupted"):
    """A command's body: a ragkit error becomes its message and exit code, Ctrl-C exit 130."""
    try:
        yield
    except RagkitError as exc:
        fail(exc, as_json)
    except KeyboardInterrupt:
        err.print(interrupted)
        raise typer.Exit(130)


# the names before they were public (scripts and modules written against them keep working)
_settings, _fail, _print_json = settings_for, fail, print_json
