"""Clause comparison across contracts: a checklist walked over each document, answered
from that document only, with a quote a lawyer can check.

Documents are processed one after the other and every checklist item of a document
shares one prompt prefix (the document, whole when it fits), so from the second item
on the KV cache covers the document and only the question is prefilled.

The package, by job: `checklist.py` (the items and their TOML), `quotes.py` (the quote
chosen from the sources and its evidence), `item_label.py` (one item's label,
`check_item`), `compare.py` (`compare`, the checklist over documents), `label_model.py`
(the label model), `report.py` (findings, rows, Markdown and HTML), `docx.py` (the Word
report), `review.py` and `kinds.py` (a data room reviewed against a checklist, and the kinds
model that reads each sentence's clause kind). The quote rules, the words and the figure check are the evidence floor's
(ragkit.evidence), shared with `ask`; the public names scripts imported from
`ragkit.compare` are still here.
"""

from ragkit.compare.checklist import (  # noqa: F401
    LABELS,
    NLI,
    ChecklistItem,
    contrary_scope,
    load_checklist,
    term_pattern,
)
from ragkit.compare.compare import compare  # noqa: F401
from ragkit.compare.item_label import (  # noqa: F401
    YES_NO,
    calibrated,
    check_item,
    clause_prompt,
    on_point,
)
from ragkit.compare.quotes import (  # noqa: F401
    choose_quote,
    document_sentences,
    evidence,
    place_of,
)
from ragkit.compare.report import (  # noqa: F401
    UNCERTAIN_BELOW,
    Comparison,
    Finding,
    Row,
    agree_on_same_quotes,
    claim_support,
    confidence_note,
    cost_line,
    missing,
    renormalised,
    same_substance,
    to_html,
    to_markdown,
    wording_changes,
)
from ragkit.evidence.figures import unsupported_figures  # noqa: F401  (the one figure check of ask, chat, compare and serve)
from ragkit.evidence.quotes import (  # noqa: F401  (the quote rules, shared with ask)
    LEXICAL_WEIGHT,
    LIST_ITEM,
    clause_quote,
    is_heading,
    quotable,
    split_units,
    with_lead_in,
)
from ragkit.evidence.words import words  # noqa: F401
