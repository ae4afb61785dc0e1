"""A comparison's shape and its outputs: findings, rows, the cost line, Markdown and HTML
(Word: ragkit.compare.docx)."""

from __future__ import annotations

import html
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ragkit.compare.checklist import ChecklistItem
from ragkit.evidence.location import format_location
from ragkit.evidence.words import words

if TYPE_CHECKING:
    pass


@dataclass
class Finding:
    doc: str
    label: str  # Yes | No | Not mentioned
    answer: str
    quote: str | None
    page: int | None
    section: str | None
    path: str | None
    prompt_tokens: int = 0
    cached_tokens: int = 0
    seconds: float = 0.0
    confidence: float | None = None  # the model's probability of the label (Yes/No items)
    note: str | None = None  # a warning a reader must see (figures the document does not contain)
    evidence: dict = field(default_factory=dict)  # how well the quote matches the item (`evidence`)
    scores: dict = field(default_factory=dict)  # per option, the log-probability the label was decided on
    closest: str | None = None  # Not mentioned from the evidence: the nearest passage, not on point (not quoted)
    claims: list = field(default_factory=list)  # free-text items: the answer's claims (ragkit.answer.claims)
    outcome: str | None = None  # free-text items: the answer's outcome (supported | unverified | not_found, ragkit.answer.ask)
    # what decided the label: "label model NAME", "wording" (the checklist's words), "evidence"
    # (no passage on point), "generator" (its option scores) or "answer" (a free-text item)
    decided_by: str | None = None
    probabilities: dict = field(default_factory=dict)  # the label model's Yes / No / Not mentioned probabilities

    def to_json(self) -> dict:
        return {
            "doc": self.doc, "label": self.label, "confidence": self.confidence, "decided_by": self.decided_by,
            "probabilities": self.probabilities, "answer": self.answer, "note": self.note,
            "quote": self.quote, "page": self.page, "section": self.section, "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens, "evidence": self.evidence, "closest": self.closest,
            "claims": self.claims, "outcome": self.outcome,
        }


@dataclass
class Row:
    item: ChecklistItem
    findings: dict[str, Finding] = field(default_factory=dict)

    @property
    def difference(self) -> str:
        labels = {d: f.label for d, f in self.findings.items()}
        if len(set(labels.values())) > 1:
            quotes = [f.quote for f in self.findings.values()]
            if all(quotes) and all(same_substance(quotes[0], q) for q in quotes[1:]):
                # the labels disagree, the clauses do not: never tell the reader the NDAs differ
                return "uncertain: the quotes say the same, the labels differ (" + "; ".join(f"{d} {lab}" for d, lab in labels.items()) + "): read the quotes"
            return "differs: " + "; ".join(f"{d} says {lab}" for d, lab in labels.items())
        same = f"same: {next(iter(labels.values()), '-')}"
        quotes = [(d, f.quote) for d, f in self.findings.items() if f.quote]
        if len(quotes) < 2 or next(iter(labels.values()), None) != "Found":
            return same
        # a free-text clause (term, governing law): the labels say nothing, the wording does
        (d0, q0), rest = quotes[0], quotes[1:]
        parts = []
        for d, q in rest:
            changes = wording_changes(q0, q)
            if changes is None:
                parts.append(f"{d} words it differently")
            elif changes:
                parts.append(f"{d}: " + "; ".join(f"“{a}” → “{b}”" if a and b else (f"adds “{b}”" if b else f"drops “{a}”")
                                                 for a, b in changes[:4]) + (" …" if len(changes) > 4 else ""))
        if not parts:
            return f"{same}, same wording"
        return f"{same}; against {d0}, " + " | ".join(parts)


@dataclass
class Comparison:
    checklist: str
    docs: list[str]
    rows: list[Row]
    prompt_tokens: dict[str, int]  # per document: tokens prefilled (not served from cache)
    seconds: float
    prompt_rate_tok_s: float

    def to_json(self) -> dict:
        total = sum(self.prompt_tokens.values())
        return {
            "checklist": self.checklist,
            "docs": self.docs,
            "rows": [
                {"id": r.item.id, "title": r.item.title, "question": r.item.question, "difference": r.difference,
                 "findings": {d: f.to_json() for d, f in r.findings.items()}}
                for r in self.rows
            ],
            "cost": {
                "prefilled_tokens": self.prompt_tokens,
                "prefilled_tokens_total": total,
                "projected_kimi_prefill_s": round(total / self.prompt_rate_tok_s, 1),
                "prompt_rate_tok_s": self.prompt_rate_tok_s,
                "seconds": round(self.seconds, 1),
            },
        }


def wording_changes(a: str, b: str) -> list[tuple[str, str]] | None:
    """Word-level changes from quote a to quote b, [(old, new), ...]; None when the two
    share too little wording for a change list to mean anything."""
    from difflib import SequenceMatcher

    wa, wb = a.split(), b.split()
    sm = SequenceMatcher(a=[w.lower().strip(".,;:") for w in wa], b=[w.lower().strip(".,;:") for w in wb], autojunk=False)
    if sm.ratio() < 0.5:
        return None
    spans: list[list[int]] = []  # [i1, i2, j1, j2]; two changes one word apart read as one
    ops = sm.get_opcodes()
    for k, (tag, i1, i2, j1, j2) in enumerate(ops):
        if tag == "equal":
            continue
        prev = ops[k - 1] if k else None
        if spans and prev and prev[0] == "equal" and prev[2] - prev[1] == 1 and spans[-1][1] == prev[1]:
            spans[-1][1], spans[-1][3] = i2, j2
        else:
            spans.append([i1, i2, j1, j2])
    return [(" ".join(wa[i1:i2]).strip(".,;:"), " ".join(wb[j1:j2]).strip(".,;:")) for i1, i2, j1, j2 in spans]

def same_substance(a: str, b: str, share: float = 0.6) -> bool:
    """Whether two quotes say the same: the shorter one's content words (stemmed) are
    mostly in the other ("may retain ... backup or record retention policies" in
    Bonterms and in Common Paper, worded apart)."""
    wa, wb = words(a), words(b)
    small, big = (wa, wb) if len(wa) <= len(wb) else (wb, wa)
    return bool(small) and len(small & big) / len(small) >= share


def agree_on_same_quotes(row: Row, no_min: float | None = 0.5) -> None:
    """Labels that their quotes contradict never reach the page: where two documents'
    quotes say the same and their Yes/No labels differ, the label is decided once for
    both, on the two quotes' scores together (the sum of their log-probabilities), and
    the cells say so; where even that is a near tie, they say Uncertain. With `no_min`
    None the model never answers No (only contrary wording does), so there is nothing to
    reconcile."""
    if no_min is None:
        return
    scored = [(d, f) for d, f in row.findings.items() if f.quote and f.scores and f.label in ("Yes", "No")]
    for i, (d1, f1) in enumerate(scored):
        for d2, f2 in scored[i + 1:]:
            if f1.label == f2.label or not same_substance(f1.quote, f2.quote):
                continue
            both = renormalised({o: f1.scores[o] + f2.scores[o] for o in ("Yes", "No") if o in f1.scores and o in f2.scores})
            label = "No" if math.exp(both.get("No", -math.inf)) >= no_min else "Yes"
            conf = math.exp(both[label])
            if conf < UNCERTAIN_BELOW:
                label, conf = "Uncertain", None
            for f, other in ((f1, d2), (f2, d1)):
                f.label, f.confidence = label, (round(conf, 3) if conf is not None else None)
                f.note = ((f.note + "; ") if f.note else "") + f"decided with {other}: the two quotes say the same"


UNCERTAIN_BELOW = 0.6  # a joint Yes/No below this probability is shown as Uncertain, with its quotes


def cost_line(c: Comparison) -> str:
    """"Prefilled tokens: a.pdf 1,234, b.md 567 (total 1,801); projected ...": the cost in words, not a dict."""
    j = c.to_json()["cost"]
    per = ", ".join(f"{d} {n:,}" for d, n in j["prefilled_tokens"].items())
    return (f"Prefilled tokens: {per} (total {j['prefilled_tokens_total']:,}); projected Kimi K2 prefill at "
            f"{j['prompt_rate_tok_s']:,.0f} tok/s: {j['projected_kimi_prefill_s']} s; took {j['seconds']} s.")


def claim_support(f: Finding) -> str:
    """" · answer: 2 of 3 claims supported": for a free-text item, how much of the model's
    answer the document supports (the quote is what to rely on)."""
    if not f.claims:
        return ""
    ok = sum(1 for c in f.claims if c.get("supported"))
    return f" · answer: {ok} of {len(f.claims)} claims supported"


def missing(f: Finding | None) -> str:
    """The cell of a document with no quote for the item."""
    if f is None:
        return "-: not found"
    if f.closest:
        return f"{f.label}: no clause on point (the closest passage is about something else)"
    return f"{f.label}: not found"


def confidence_note(f: Finding) -> str:
    """" (62%)": the model's probability of its Yes/No label, so a reader knows which
    labels to check first."""
    return f" ({f.confidence:.0%})" if f.confidence is not None else ""


def to_markdown(c: Comparison) -> str:
    lines = [f"# Clause comparison ({c.checklist})", "", "| clause | " + " | ".join(c.docs) + " | difference |",
             "|---|" + "---|" * len(c.docs) + "---|"]
    for r in c.rows:
        cells = []
        for d in c.docs:
            f = r.findings.get(d)
            if f is None or not f.quote:
                cells.append(missing(f).replace("|", "\\|"))
            else:
                loc = format_location(f.page, f.section)
                hint = " (closest clause)" if f.label == "Not mentioned" else ""
                warn = f" ⚠ {f.note}" if f.note else ""
                cells.append(f"**{f.label}**{confidence_note(f)}{hint}: “{f.quote}”{f' ({loc})' if loc else ''}{claim_support(f)}{warn}".replace("|", "\\|"))
        lines.append(f"| {r.item.title} | " + " | ".join(cells) + f" | {r.difference} |")
    lines += ["", cost_line(c)]
    return "\n".join(lines) + "\n"


def to_html(c: Comparison, paths: dict[str, str] | None) -> str:
    """A self-contained page; with `paths` (the command line's memo, for the machine it runs
    on) each quote links to its document's file at its page; without (a memo exported by
    the web page, for a reader elsewhere) quotes carry no link, so no server path leaks."""
    e = html.escape
    head = "".join(f"<th>{e(d)}</th>" for d in c.docs)
    body = []
    for r in c.rows:
        cells = []
        for d in c.docs:
            f = r.findings.get(d)
            if f is None or not f.quote:
                cells.append(f"<td class='nf'>{e(missing(f))}</td>")
                continue
            quote = f"“{e(f.quote)}”"
            if paths is not None:
                href = Path(paths.get(d, d)).resolve().as_uri() + (f"#page={f.page}" if f.page else "")
                quote = f"<a href='{e(href)}'>{quote}</a>"
            loc = format_location(f.page, f.section)
            hint = " (closest clause)" if f.label == "Not mentioned" else ""
            hint += f"<br><small class='warn'>⚠ {e(f.note)}</small>" if f.note else ""
            cells.append(f"<td><b>{e(f.label)}</b>{e(confidence_note(f))}{hint}<blockquote>{quote}</blockquote><small>{e(loc)}{e(claim_support(f))}</small></td>")
        cls = "diff" if r.difference.startswith("differs") else ""
        body.append(f"<tr class='{cls}'><th>{e(r.item.title)}<br><small>{e(r.item.question)}</small></th>{''.join(cells)}<td>{e(r.difference)}</td></tr>")
    return (
        "<!doctype html><html><head><meta charset='utf-8'><title>Clause comparison</title><style>"
        "body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:6px;vertical-align:top;max-width:28em}"
        "tr.diff{background:#fff4e5}td.nf{color:#888}.warn{color:#a40}blockquote{margin:4px 0 4px 8px}</style></head><body>"
        f"<h1>Clause comparison ({e(c.checklist)})</h1><table><tr><th>clause</th>{head}<th>difference</th></tr>{''.join(body)}</table>"
        f"<p>{e(cost_line(c))}</p>"
        "</body></html>"
    )


def renormalised(logprobs: dict[str, float]) -> dict[str, float]:
    top = max(logprobs.values())
    norm = math.log(sum(math.exp(v - top) for v in logprobs.values())) + top
    return {o: v - norm for o, v in logprobs.items()}
