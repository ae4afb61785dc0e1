"""An answer as the OpenAI-compatible API shows it: the citations, the "Sources:" list
appended to the text, claims, the `ragkit` block (outcome, passages...), usage and the
finish reason. Shared by the /v1 routes (ragkit.serve.openai_api) and the MCP tools."""

from __future__ import annotations

from typing import Any

SOURCES_HEAD = "\n\nSources:\n"


def citation_json(c, contexts: dict[int, Any]) -> dict:
    ctx = contexts.get(c.n)
    return {"n": c.n, "doc": c.doc, "doc_id": ctx.doc_id if ctx else None, "page": c.page,
            "page_end": ctx.page_end if ctx else None, "section": c.section, "quote": c.quote,
            "inferred": c.inferred, "notes": [] if ctx is None else ctx.notes_for(c.quote)}


def sources_text(result) -> str:
    """"\\n\\nSources:\\n[1] doc.pdf, p. 3, § 5.2 Title" lines ("(inferred)" when the
    citation was matched by wording, not marked by the model); empty when none."""
    from ragkit.evidence.location import format_location

    if not result.citations:
        return ""
    by_n = {c.n: c for c in result.prompt.contexts}
    lines = []
    for c in result.citations:
        ctx = by_n.get(c.n)
        where = format_location(c.page, c.section, ctx.page_end if ctx else None)
        notes = ctx.notes_for(c.quote) if ctx is not None else []
        lines.append(f"[{c.n}] {c.doc}" + (f", {where}" if where else "") + (" (inferred)" if c.inferred else "")
                     + "".join(f"; {n}" for n in notes))
    return SOURCES_HEAD + "\n".join(lines)


def claims_json(result) -> list[dict]:
    """The answer's claims, each with the source sentence(s) that support it (empty for an
    abstention); `supported: false` marks a claim no source sentence supports."""
    return [c.to_json() for c in getattr(result, "claims", [])]


def content_text(result, show_model: bool = True) -> str:
    """The message content: the answer as `ragkit.answer.ask.display_text` reads it (an unverified
    answer: the model's text, marked, then "Not verified against the sources." and the
    passages; never "The documents do not say." for what the documents say), then the
    "Sources:" list. A stream's text pieces are its beginning and the stream ends on the
    same content (`ragkit.answer.ask.StreamGate`)."""
    from ragkit.answer.ask import display_text

    return display_text(result, show_model=show_model) + sources_text(result)


def ragkit_json(result, show_model: bool = True) -> dict:
    """The `ragkit` object of an answer (non-streamed) or of a stream's final chunk: the
    outcome ("supported" | "unverified" | "not_found"), the passages shown for an
    unverified or quoted answer, the model's own text (unless `retrieve.show_unverified`
    is off), and, for compatibility, `abstained` (true for not_found only)."""
    model = getattr(result, "model_answer", None)
    return {
        "outcome": getattr(result, "outcome", "not_found" if result.abstained else "supported"),
        "answer_kind": getattr(result, "answer_kind", "generated"),
        "passages": [p.to_json() for p in getattr(result, "passages", [])],
        "model_answer": model if show_model else None,
        "unverified_reason": getattr(result, "unverified_reason", None),
        # a question over several documents answered document by document: what each says
        "findings": [f.to_json() for f in getattr(result, "findings", [])],
        "abstained": result.abstained,
        "abstain_reason": result.abstain_reason,
        "unsupported_answer": getattr(result, "unsupported_answer", None) if show_model else None,
        "invalid_citations": list(result.invalid_citations),
        "mode": result.prompt.mode,
        "contexts": [{"n": c.n, "doc": c.doc, "doc_id": c.doc_id, "page": c.page_start, "page_end": c.page_end,
                      "section": c.section} for c in result.prompt.contexts],
        "timings": {k: round(v, 4) for k, v in result.timings.items()},
    }


def usage_json(result) -> dict:
    g = result.generation
    prompt = len(result.prompt.ids)
    completion = g.completion_tokens if g else 0
    cached = g.cached_tokens if g else 0
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached}}


def finish_reason(result) -> str:
    g = result.generation
    return "length" if g is not None and g.finish_reason == "length" else "stop"


# ---------------------------------------------------------------------- events from the worker
