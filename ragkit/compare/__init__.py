"""Clause comparison across contracts: a checklist walked over each document, answered
from that document only, with a quote a lawyer can check.

Documents are processed one after the other and every checklist item of a document
shares one prompt prefix (the document, whole when it fits), so from the second item
on the KV cache covers the document and only the question is prefilled.

The package, by job: `checklist.py` (the items and their TOML), `quotes.py` (the quote
chosen from the sources and its evidence), `item_label.py` (one item's label, and `compare`),
`report.py` (findings, rows, Markdown and HTML), `docx.py` (the Word report). Every name
scripts imported from `ragkit.compare` is still here.
"""

from ragkit.answer.numbers import unsupported_figures  # noqa: F401  (the one figure check of ask, chat, compare and serve)
from ragkit.answer.passages import (  # noqa: F401  (the quote rules live with the sources, shared with ask)
    _LIST_ITEM,
    LEXICAL_WEIGHT,
    _is_heading,
    _quotable,
    _words,
    clause_quote,
    split_units,
    with_lead_in,
)
from ragkit.compare.checklist import (  # noqa: F401
    _EXCEPTION,
    _EXCLUDES,
    _NEGATION,
    _NOT_EXCLUDING,
    LABELS,
    NLI,
    ChecklistItem,
    contrary_scope,
    load_checklist,
    term_pattern,
)
from ragkit.compare.item_label import (  # noqa: F401
    YES_NO,
    _calibrate,
    _clause_builder,
    calibrated,
    check_item,
    clause_prompt,
    compare,
    on_point,
)
from ragkit.compare.quotes import (  # noqa: F401
    _best_quote,
    _document_sentences,
    _document_units,
    _hypothesis_support,
    _similarity,
    _where,
    evidence,
)
from ragkit.compare.report import (  # noqa: F401
    UNCERTAIN_BELOW,
    Comparison,
    Finding,
    Row,
    _conf,
    _renormalised,
    agree_on_same_quotes,
    claim_support,
    cost_line,
    missing,
    same_substance,
    to_html,
    to_markdown,
    wording_changes,
)
