"""The statement lane: a question about a filing that names one of its primary financial
statements ("according to the cash flow statement", "the statement of financial position"),
or asks for a figure only a statement gives (capital expenditure, working capital, revenue
growth, operating margin), gets that statement's table from the named filing into the prompt
(a question over the store: from the filing of its best-ranked source).

Why a lane of its own: a 10-K of 100-500 pages holds 600-2,000 chunks, more than the
sentence ranking reads (`retrieve.unit_pool_max`), so its first stage is the hybrid top
`candidates`; a statement table is mostly figures and row labels, and prose that names
the same metric (MD&A, the notes, risk factors) outranks it there. On financebench-dev's
tuning half 7 of 15 gold pages missed the prompt, 5 of them a statement the question named or
needed (eval/README.md "The statement lane"). Ingest makes each statement a section
under its own title (`ragkit.ingest.sections`), so the lane reads the statement by that
title, whatever the search ranked.

The words are accounting's own (the four statements of US GAAP and IFRS, and the line items
and metrics each one gives), not fitted to a set; they live here, beside the code that reads
them, since they are what the lane is.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ragkit.evidence.words import content_words
from ragkit.store import Hit

# a primary statement's section title (the leaf of its section path), lower-cased
_TITLES = {
    "income": r"statements? of (?!comprehensive|cash|financial|changes|stock|share|equity)[a-z() ]{0,30}?"
              r"(?:operations|income|earnings|loss)\b|income statements?",
    "balance": r"balance sheets?|statements? of financial (?:position|condition)",
    "cash_flow": r"statements? of cash flows?|cash flows? statements?",
    "equity": r"statements? of (?:changes in )?(?:stockholders|shareholders|shareowners|members|partners)[’'`]? ?"
              r"(?:equity|deficit|investment)|statements? of (?:changes in )?equity",
}
_TITLE = {k: re.compile(v) for k, v in _TITLES.items()}

# what a question says that asks for a statement: its name (first), then the figures it gives
_NAMED = {
    "income": r"income statements?|statements? of (?:income|operations|earnings)|\bp ?& ?l\b|profit and loss",
    "balance": r"balance sheets?|statements? of financial (?:position|condition)",
    "cash_flow": r"cash flows? statements?|statements? of cash flows?",
    "equity": r"statements? of (?:changes in )?(?:stockholders|shareholders|shareowners)[’'`]? ?equity",
}
_IMPLIED = {
    "cash_flow": r"\bcapex\b|capital expenditures?|purchases? of (?:property|land|fixed assets)|free cash ?flows?|\bfcf\b"
                 r"|cash (?:flows? )?(?:from|provided by|used (?:in|for)) (?:operating|investing|financing)"
                 r"|operating cash flows?|cash from operations|depreciation|amortization|\bd ?& ?a\b|dividends? paid"
                 r"|repurchases? of (?:common )?(?:stock|shares)|share repurchases?|buybacks?|capital[- ]intensive",
    "balance": r"working capital|current assets|current liabilities|quick ratio|current ratio|cash ratio"
               r"|total assets|total liabilities|inventor(?:y|ies)|accounts receivable|accounts payable"
               r"|property,? plant|\bpp ?& ?e\b|fixed assets?|asset turnover|return on (?:total )?assets|\broa\b"
               r"|debt[- ]to[- ](?:equity|capital)|book value|(?:stockholders|shareholders)[’'`]? equity"
               r"|debt on (?:its |the )?balance sheet|net debt|capital[- ]intensive",
    "income": r"\brevenues?\b|net sales|total sales|sales growth|gross (?:margin|profit)|operating (?:margin|income|profit)"
              r"|net (?:income|earnings|profit|margin)|\bebitda?\b|cost of (?:goods sold|sales|revenues?)|\bcogs\b"
              r"|\bsg ?& ?a\b|selling, general|effective tax rate|earnings per share|\beps\b|interest expense"
              r"|research and development expenses?|\br ?& ?d\b",
}
_NAMED_RE = {k: re.compile(v) for k, v in _NAMED.items()}
_IMPLIED_RE = {k: re.compile(v) for k, v in _IMPLIED.items()}


def asked(question: str, most: int = 2) -> list[str]:
    """The statements `question` asks for, at most `most`: those it names, in the order it
    names them, then those its figures imply, most cues first (ties: cash flows, balance
    sheet, income statement, the order a filing's analyst checks capital, then results)."""
    q = " ".join(question.lower().split())
    named = sorted((m.start(), k) for k, rx in _NAMED_RE.items() if (m := rx.search(q)))
    out = [k for _, k in named]
    if len(out) >= most:
        return out[:most]
    cues = {k: len(rx.findall(q)) for k, rx in _IMPLIED_RE.items() if k not in out}
    out += [k for k in sorted(cues, key=lambda k: -cues[k]) if cues[k]]
    return out[:most]


def kind_of(section: str | None) -> str | None:
    """The primary statement a chunk's section path puts it in (the leaf is the statement's
    title, as ingest makes it), or None. A note's section is no statement."""
    leaf = " ".join((section or "").rsplit(" > ", 1)[-1].lower().split())
    if not leaf or leaf.startswith(("note", "notes")):
        return None
    return next((k for k, rx in _TITLE.items() if rx.search(leaf)), None)


@dataclass
class Statement:
    kind: str
    doc_id: str
    section: str
    tables: list[Hit]  # its table chunks, in document order


def statements(whole: list[Hit], kinds: list[str]) -> list[Statement]:
    """For each of `kinds`, each named document's first statement of that kind with a table
    (the primary statement comes before any schedule that repeats its title), in the order
    of `kinds`: its table chunks up to the next section. `whole`: every chunk of the named
    documents, in document order."""
    found: dict[tuple[str, str], Statement] = {}
    open_key: tuple[str, str] | None = None  # the statement being read, until its section ends
    for h in whole:
        section = h.meta.get("section") or ""
        key = (kind_of(section) or "", h.meta.get("doc_id", ""))
        if open_key is not None and (key != open_key or section != found[open_key].section):
            open_key = None
        if key[0] not in kinds or h.meta.get("kind") != "table":
            continue
        if key not in found:
            found[key] = Statement(key[0], key[1], section, [])
            open_key = key
        if open_key == key:
            found[key].tables.append(h)
    return sorted(found.values(), key=lambda s: kinds.index(s.kind))


def rows_named(asked_words: set[str], table: Hit) -> int:
    """How many of a table chunk's row labels the question names: each of a label's content
    words ("Total current assets") is one of the question's content words `asked_words`
    ("total current assets divided by ..."); "total" alone names no row."""
    from ragkit.evidence.figures import table_rows

    n = 0
    for row in table_rows(table.text):
        words = content_words(row[0]) - {"total"}
        n += bool(words) and words <= asked_words
    return n


def chosen(question: str, found: list[Statement], reranker=None, per: int = 1) -> list[Hit]:
    """The table chunks of each statement the lane gives the prompt, its best `per`: the
    chunk with the most rows the question names (`rows_named`), then, with a reranker, the
    cross-encoder reading the question against each chunk's headings and row labels
    (`ragkit.retrieve.rerank.table_digest`: a question that says "capital expenditures" names
    no row "Purchases of land, buildings, and equipment"), else the statement's first."""
    out: list[Hit] = []
    asked_words = content_words(question)
    for st in found:
        tables = st.tables
        if len(tables) > per:
            named = [rows_named(asked_words, h) for h in tables]
            ce = [0.0] * len(tables)
            if reranker is not None:
                from ragkit.retrieve.rerank import table_digest

                ce = [float(x) for x in reranker.score(question, [table_digest(h) for h in tables])]
            order = sorted(range(len(tables)), key=lambda i: (-named[i], -ce[i], i))
            tables = [tables[i] for i in order]
        out += tables[:per]
    return out
