"""Clause comparison across contracts: a checklist walked over each document, answered
from that document only, with a quote a lawyer can check.

Documents are processed one after the other and every checklist item of a document
shares one prompt prefix (the document, whole when it fits), so from the second item
on the KV cache covers the document and only the question is prefilled.
"""

from __future__ import annotations

import html
import re
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ragkit.config import Settings
from ragkit.errors import ConfigError, UsageError
from ragkit.paths import prompts_dir
from ragkit.retrieve.prompt import format_location

LABELS = ("Yes", "No", "Not mentioned", "Unclear", "Found")
NLI = {"Yes": "Entailment", "No": "Contradiction", "Not mentioned": "NotMentioned"}


@dataclass
class ChecklistItem:
    id: str
    title: str
    question: str
    hypothesis: str | None = None


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

    def to_json(self) -> dict:
        return {
            "doc": self.doc, "label": self.label, "answer": self.answer, "quote": self.quote, "page": self.page,
            "section": self.section, "prompt_tokens": self.prompt_tokens, "cached_tokens": self.cached_tokens,
        }


@dataclass
class Row:
    item: ChecklistItem
    findings: dict[str, Finding] = field(default_factory=dict)

    @property
    def difference(self) -> str:
        labels = {d: f.label for d, f in self.findings.items()}
        if len(set(labels.values())) <= 1:
            return f"same: {next(iter(labels.values()), '-')}"
        return "differs: " + "; ".join(f"{d} says {lab}" for d, lab in labels.items())


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


def load_checklist(name_or_path: str) -> tuple[str, list[ChecklistItem]]:
    p = Path(name_or_path)
    if not (p.suffix == ".toml" and p.exists()):
        p = prompts_dir() / "checklists" / f"{name_or_path}.toml"
    if not p.exists():
        have = ", ".join(sorted(x.stem for x in (prompts_dir() / "checklists").glob("*.toml")))
        raise ConfigError(f"checklist {name_or_path!r} not found", hint=f"built in: {have}; or give a .toml path")
    try:
        data = tomllib.loads(p.read_text(encoding="utf-8"))
        items = [ChecklistItem(**{k: v for k, v in it.items() if k in ("id", "title", "question", "hypothesis")}) for it in data["items"]]
    except (tomllib.TOMLDecodeError, KeyError, TypeError) as exc:
        raise ConfigError(f"checklist {p} is not valid: {exc}", hint="see prompts/checklists/nda.toml for the format") from None
    if not items or len({i.id for i in items}) != len(items):
        raise ConfigError(f"checklist {p} needs at least one item and unique ids")
    return data.get("name", p.stem), items


_LABEL_RE = re.compile(r"^\W*(yes|no|not mentioned|not stated|the documents do not say)\b", re.I)


def label_of(answer: str) -> str:
    """Yes / No / Not mentioned from the start of an answer; Unclear when it hedges
    ("Yes, No.", which small models like to write)."""
    low = answer.strip().lower()
    if not low or "do not say" in low[:60] or low.startswith(("not mentioned", "not stated")):
        return "Not mentioned"
    m = _LABEL_RE.match(low)
    if not m:
        return "Unclear"
    first = m.group(1)
    rest = low[m.end(): m.end() + 30]
    if first in ("yes", "no") and re.search(r"\b(yes|no)\b", rest) and not rest.lstrip(" ,.").startswith(first):
        return "Unclear"
    return {"yes": "Yes", "no": "No"}.get(first, "Not mentioned")


def _best_quote(contexts, item: "ChecklistItem", answer: str):
    """The clause that answers the item, found without trusting the model: among the
    sources in the prompt, the one whose section title and text share most words with
    the item's title and question (title words count double), ties broken by retrieval
    rank; then, in it, the sentence sharing most words. A lawyer checks this quote,
    whatever the model said."""
    import snowballstemmer

    from ragkit.retrieve.bm25 import tokenize
    from ragkit.retrieve.citations import best_quote

    if not contexts:
        return None
    stem = snowballstemmer.stemmer("english").stemWords  # "independently developed" ~ "independent development"

    def words(text: str) -> set[str]:
        return set(stem(tokenize(text)))

    want = words(item.title + " " + item.question)
    title_words = words(item.title)
    bags = [(words(c.section or ""), words(c.text)) for c in contexts]
    # words found in every section of the document ("confidential", "party") tell
    # nothing: weight each word by its inverse document frequency across the sections
    import math

    n = len(bags)
    idf = {w: math.log((n + 1) / (1 + sum(1 for sec, body in bags if w in sec or w in body))) for w in want}
    fits = {}
    for c, (sec, body) in zip(contexts, bags):
        fits[id(c)] = (
            # a section whose heading names the item ("6. Term and Termination" for "Term")
            # is the strongest sign, whatever the word's frequency
            sum((idf[w] + 1.0) * 3 if w in title_words else idf[w] for w in want & sec) + sum(idf[w] for w in want & body),
            c.score,
        )

    def fit(c) -> tuple:
        return fits[id(c)]

    top = max(contexts, key=fit)
    return top, best_quote(top.text, item.title + " " + item.question + " " + answer)


def compare(
    docs: list[str],
    settings: Settings,
    checklist: str = "nda",
    *,
    items: list[str] | None = None,
    on_progress: Callable[[str, str], None] | None = None,
) -> Comparison:
    from ragkit.ask import ask

    if len(docs) < 1:
        raise UsageError("compare needs at least one document")
    name, all_items = load_checklist(checklist)
    chosen = [i for i in all_items if not items or i.id in items]
    if items and len(chosen) != len(set(items)):
        missing = sorted(set(items) - {i.id for i in chosen})
        raise UsageError(f"unknown checklist item(s): {', '.join(missing)}")
    rows = [Row(i) for i in chosen]
    prefilled: dict[str, int] = {}
    t0 = time.perf_counter()
    for doc in docs:
        prefilled[doc] = 0
        for row in rows:
            yes_no = row.item.hypothesis is not None
            q = f"{row.item.question} Answer Yes, No or Not mentioned." if yes_no else row.item.question
            r = ask(q, settings, [doc])
            if not r.prompt.contexts:
                raise UsageError(f"{doc} could not be represented in the prompt", hint="raise generator.n_ctx")
            g = r.generation
            label = ("Not mentioned" if r.abstained else label_of(r.answer)) if yes_no else ("Not mentioned" if r.abstained else "Found")
            # the quote: the clause of this document that matches the checklist item best
            # (chosen from the sources, not from the model's citation: a small model often
            # cites the wrong block)
            found = _best_quote(r.prompt.contexts, row.item, r.answer)
            top, quote = found if found else (None, None)
            page, section = (top.page_start, top.section) if top else (None, None)
            row.findings[doc] = Finding(
                doc=r.prompt.contexts[0].doc,
                label=label,
                answer=r.answer,
                quote=quote,
                page=page,
                section=section,
                path=None,
                prompt_tokens=len(r.prompt.ids),
                cached_tokens=g.cached_tokens if g else 0,
                seconds=r.timings.get("total_s", 0.0),
            )
            prefilled[doc] += len(r.prompt.ids) - (g.cached_tokens if g else 0)
            if on_progress:
                on_progress(doc, row.item.id)
    return Comparison(name, docs, rows, prefilled, time.perf_counter() - t0, settings.generator.prompt_rate_tok_s)


def to_markdown(c: Comparison) -> str:
    lines = [f"# Clause comparison ({c.checklist})", "", "| clause | " + " | ".join(c.docs) + " | difference |",
             "|---|" + "---|" * len(c.docs) + "---|"]
    for r in c.rows:
        cells = []
        for d in c.docs:
            f = r.findings.get(d)
            if f is None or not f.quote:
                cells.append(f"{f.label if f else '-'}: not found")
            else:
                loc = format_location(f.page, f.section)
                hint = " (closest clause)" if f.label == "Not mentioned" else ""
                cells.append(f"**{f.label}**{hint}: “{f.quote}” ({loc})".replace("|", "\\|"))
        lines.append(f"| {r.item.title} | " + " | ".join(cells) + f" | {r.difference} |")
    j = c.to_json()["cost"]
    lines += ["", f"Prefilled tokens: {j['prefilled_tokens']} (total {j['prefilled_tokens_total']}); "
              f"projected Kimi K2 prefill at {j['prompt_rate_tok_s']:.0f} tok/s: {j['projected_kimi_prefill_s']} s."]
    return "\n".join(lines) + "\n"


def to_html(c: Comparison, paths: dict[str, str]) -> str:
    """A self-contained page; each quote links to its document at its page."""
    e = html.escape
    head = "".join(f"<th>{e(d)}</th>" for d in c.docs)
    body = []
    for r in c.rows:
        cells = []
        for d in c.docs:
            f = r.findings.get(d)
            if f is None or not f.quote:
                cells.append(f"<td class='nf'>{e(f.label if f else '-')}: not found</td>")
                continue
            href = Path(paths.get(d, d)).resolve().as_uri() + (f"#page={f.page}" if f.page else "")
            loc = format_location(f.page, f.section)
            hint = " (closest clause)" if f.label == "Not mentioned" else ""
            cells.append(f"<td><b>{e(f.label)}</b>{hint}<blockquote><a href='{e(href)}'>“{e(f.quote)}”</a></blockquote><small>{e(loc)}</small></td>")
        cls = "diff" if r.difference.startswith("differs") else ""
        body.append(f"<tr class='{cls}'><th>{e(r.item.title)}<br><small>{e(r.item.question)}</small></th>{''.join(cells)}<td>{e(r.difference)}</td></tr>")
    j = c.to_json()["cost"]
    return (
        "<!doctype html><html><head><meta charset='utf-8'><title>Clause comparison</title><style>"
        "body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:6px;vertical-align:top;max-width:28em}"
        "tr.diff{background:#fff4e5}td.nf{color:#888}blockquote{margin:4px 0 4px 8px}</style></head><body>"
        f"<h1>Clause comparison ({e(c.checklist)})</h1><table><tr><th>clause</th>{head}<th>difference</th></tr>{''.join(body)}</table>"
        f"<p>Prefilled tokens: {e(str(j['prefilled_tokens']))}; projected Kimi K2 prefill at {j['prompt_rate_tok_s']:.0f} tok/s: {j['projected_kimi_prefill_s']} s.</p>"
        "</body></html>"
    )
