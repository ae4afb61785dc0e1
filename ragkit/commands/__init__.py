"""Every CLI command, one module each. A module exposes `register(app: typer.Typer) -> None`;
`ragkit.cli` calls it for each name in COMMANDS, in that order (the order of `--help`).
Keep imports of heavy libraries inside the command functions so `ragkit --help` stays fast."""

COMMANDS = ("ingest", "ask", "chat", "compare", "review", "docs", "eval", "tune", "doctor", "serve", "mcp")
