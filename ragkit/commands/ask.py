"""`ragkit ask QUESTION`: one answer with citations (or, with --dry-run, the exact prompt)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape

from ragkit.commands._common import INFERRED_NOTE, JsonOpt, ProfileOpt, StoreOpt, command_errors, err, out, print_json, settings_for


def print_claims(result, model_shown: bool = True) -> None:
    """Each claim of the answer with the source sentence that supports it; a claim no
    sentence supports is marked, and so is a marker [n] whose source does not say it.
    First, when the outcome is not "supported", why (the answer text above, `display_text`,
    already says "Not verified against the sources" with the passages, or "The documents do
    not say."; `model_shown`: the model's own text was printed above)."""
    from ragkit.answer.ask import display_text
    from ragkit.evidence.location import format_location

    outcome = getattr(result, "outcome", "supported")
    if outcome == "unverified":
        shown = model_shown and bool(getattr(result, "model_answer", None)) and result.model_answer in display_text(result)
        out.print(f"[bold yellow]Not verified:[/] {result.unverified_reason}"
                  + ("; the first paragraph above is the model's answer, the passages are the documents' words" if shown
                     else "; the passages above are the documents' words"), highlight=False)
    elif outcome == "not_found" and result.abstain_reason:
        out.print(f"[dim]why: {result.abstain_reason}[/]", highlight=False)
    if not result.claims:
        return
    out.print("[bold]Claims[/]")
    for i, c in enumerate(result.claims, 1):
        mark = "[green]supported[/]" if c.supported else "[bold yellow]NOT SUPPORTED by the sources[/]"
        out.print(f" {i}. {c.text}  ({mark}, {c.support:.2f})", highlight=False)
        for s in c.citations:
            where = format_location(s.page, s.section, s.page_end)
            flag = " (inferred)" if s.inferred else ""
            out.print(f"     [{s.n}] [cyan]{s.doc}[/] {where}{flag}: “{s.quote}”", highlight=False)
        if c.flagged:
            out.print(f"     [yellow]warning:[/] cites {c.flagged}, which does not support this claim", highlight=False)
        if c.missing_figures:
            out.print(f"     [yellow]not in the sources:[/] {', '.join(c.missing_figures)}", highlight=False)
        for comp in c.computed:
            cells = "; ".join(cell.shown() for cell in comp.cells)
            out.print(f"     computed: {comp.formula}  [dim]from {cells}[/]", highlight=False)
        if c.missing_names:
            # a flag, not a veto (ragkit.answer.claims.missing_names): the reader checks the name
            out.print(f"     [yellow]names what its source does not:[/] {', '.join(c.missing_names)}", highlight=False)


def register(app: typer.Typer) -> None:
    @app.command()
    def ask(
        question: str = typer.Argument(..., help="the question"),
        doc: list[str] = typer.Option([], "--doc", help="restrict to this document (name, name without extension, or path); repeat for several"),
        store: Optional[Path] = StoreOpt,
        profile: Optional[str] = ProfileOpt,
        dry_run: bool = typer.Option(False, "--dry-run", help="build and print the prompt with its token count; do not generate"),
        as_json: bool = JsonOpt,
    ) -> None:
        """Answer a question from the ingested documents, with citations to document, page and section."""
        from ragkit.answer.ask import ask as run_ask
        from ragkit.evidence.location import format_location

        with command_errors(as_json):
            settings = settings_for(store, profile)
            from ragkit.answer.ask import StreamGate, display_text, routed_note

            live = settings.retrieve.show_unverified  # else the answer is printed once it is checked
            gate = StreamGate(hold_all=not live)

            def on_text(piece: str) -> None:
                shown = gate.feed(piece)
                if not as_json and shown:
                    sys.stdout.write(shown)
                    sys.stdout.flush()

            result = run_ask(question, settings, doc, dry_run=dry_run, on_text=on_text)
        if dry_run:
            if as_json:
                print_json(result.dry_run_json())
            else:
                sys.stdout.write(result.prompt.text + "\n")
                p = result.prompt
                err.print(
                    f"prompt tokens {len(p.ids)} (prefix {p.prefix_tokens}), sources {len(p.contexts)} ({p.mode}), "
                    f"n_ctx {p.n_ctx}, max_tokens {p.max_tokens}",
                    highlight=False,
                )
            return
        if as_json:
            print_json(result.to_json())
            return
        sys.stdout.write(gate.finish(display_text(result, show_model=live)))  # the rest, once checked
        sys.stdout.write("\n\n")
        if result.routed and result.outcome != "not_found":  # not_found: the answer above says it
            out.print(f"[dim]{escape(routed_note(result))}[/]", highlight=False)
        if result.citations and result.outcome != "unverified":  # unverified: the passages are in the answer above
            out.print("[bold]Sources[/]")
            for c in result.citations:
                where = format_location(c.page, c.section)
                flag = INFERRED_NOTE if c.inferred else ""
                out.print(f" [{c.n}] [cyan]{c.doc}[/] {where}{flag}", highlight=False)
                out.print(f"     “{c.quote}”", highlight=False, style="dim")
                for note in result.source_notes(c):
                    out.print(f"     [yellow]⚠[/] {escape(note)}", highlight=False)
        if result.invalid_citations:
            out.print(f"[yellow]warning:[/] the answer cites {result.invalid_citations}, which were not among the sources", highlight=False)
        print_claims(result, model_shown=live)
        g = result.generation
        t = result.timings
        err.print(
            f"[dim]prompt {len(result.prompt.ids)} tok ({g.cached_tokens} cached), {g.completion_tokens} generated; "
            f"retrieve {t['retrieve_s']:.2f}s"
            + (f" (reranker {t['rerank_s']:.2f}s)" if "rerank_s" in t else "")
            + f", first token {t['ttft_s']:.2f}s, generate {t['generate_s']:.2f}s[/]",
            highlight=False,
        )
