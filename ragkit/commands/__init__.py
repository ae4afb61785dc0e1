"""Extra CLI commands. Each module here exposes `register(app: typer.Typer) -> None`;
`ragkit.cli` calls it for every module, in name order. Keep imports of heavy libraries
inside the command functions so `ragkit --help` stays fast."""
