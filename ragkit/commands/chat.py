"""`ragkit chat`: ask question after question with the model and its KV cache kept alive."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Iterator, Optional

import typer


def _questions(path: Optional[Path]) -> Iterator[str]:
    from ragkit.errors import UsageError

    if path is not None:
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            raise UsageError(f"cannot read the questions file {path}: {getattr(exc, 'strerror', None) or exc}") from None
    else:
        lines = sys.stdin
    for line in lines:
        q = line.strip()
        if not q or q.startswith("#"):
            continue
        if q in ("/exit", "/quit"):
            return
        yield q


def register(app: typer.Typer) -> None:
    @app.command()
    def chat(
        doc: list[str] = typer.Option([], "--doc", help="restrict to this document; repeat for several"),
        questions: Optional[Path] = typer.Option(None, "--questions", help="read the questions from this file, one a line (default: stdin)"),
        state_dir: Optional[Path] = typer.Option(
            None, "--state-dir", help="save the KV cache per document set here and restore it in a later session"
        ),
        store: Optional[Path] = typer.Option(None, "--store", help="store folder (default ./.ragkit, or RAGKIT_STORE / ragkit.toml)"),
        profile: Optional[str] = typer.Option(None, "--profile", help="settings profile: laptop (default) or kimi-k2"),
        as_json: bool = typer.Option(False, "--json", help="print one JSON object per answer, one a line (the shape of `ask --json`)"),
    ) -> None:
        """Answer questions one after another (stdin, one a line; /exit ends), keeping the model and its
        KV cache loaded, so follow-ups on the same documents skip the prefill of the documents."""
        from ragkit.answer.chat import ChatSession
        from ragkit.commands._common import INFERRED_NOTE, command_errors, err, out, settings_for
        from ragkit.commands.ask import print_claims
        from ragkit.evidence.location import format_location

        interactive = questions is None and sys.stdin.isatty()
        with command_errors(as_json):
            settings = settings_for(store, profile)
            session = ChatSession(settings, doc, state_dir=state_dir)
            if interactive:
                err.print("[dim]ask a question (empty line skipped, /exit or Ctrl-D ends)[/]")
            from ragkit.answer.ask import StreamGate, display_text

            live = settings.retrieve.show_unverified
            for q in _questions(questions):
                gate = StreamGate(hold_all=not live)

                def on_text(piece: str, gate=gate) -> None:
                    shown = gate.feed(piece)
                    if not as_json and shown:
                        sys.stdout.write(shown)
                        sys.stdout.flush()

                r = session.ask(q, on_text=on_text)
                if as_json:
                    obj = {"question": q, **r.to_json()}
                    sys.stdout.write(json.dumps(obj, ensure_ascii=False) + "\n")
                    sys.stdout.flush()
                    continue
                sys.stdout.write(gate.finish(display_text(r, show_model=live)) + "\n")
                for c in (r.citations if r.outcome != "unverified" else []):  # unverified: the passages are above
                    where = format_location(c.page, c.section)
                    flag = INFERRED_NOTE if c.inferred else ""
                    out.print(f" [{c.n}] [cyan]{c.doc}[/] {where}{flag}", highlight=False)
                print_claims(r, model_shown=live)
                g = r.generation
                err.print(
                    f"[dim]prompt {len(r.prompt.ids)} tok ({g.cached_tokens} cached), {g.completion_tokens} generated; "
                    f"first token {g.ttft_s:.2f}s, total {r.timings['total_s']:.2f}s[/]",
                    highlight=False,
                )
                sys.stdout.write("\n")
