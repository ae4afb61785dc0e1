"""`compare`: a checklist walked over documents, clause by clause (`check_item` for each
item of each document, ragkit.compare.item_label), into a Comparison (ragkit.compare.report).

    from ragkit.compare import compare
    c = compare(["bonterms-mutual-nda.md", "common-paper-mutual-nda.md"], session)
    print(to_markdown(c))
"""

from __future__ import annotations

import time
from typing import Callable

from ragkit.compare.checklist import load_checklist
from ragkit.compare.item_label import check_item
from ragkit.compare.report import Comparison, Row, agree_on_same_quotes
from ragkit.config import Settings
from ragkit.errors import UsageError
from ragkit.session import Session


def compare(
    docs: list[str],
    session: Session | Settings,
    checklist: str = "nda",
    *,
    items: list[str] | None = None,
    on_progress: Callable[[str, str], None] | None = None,
) -> Comparison:
    """Every item of `checklist` (or only `items`, by id) asked of each document, one
    document at a time with all its items in a row, so they share the document's prompt
    prefix; then, per item, labels the documents' same quotes contradict decided once
    (`agree_on_same_quotes`). `on_progress(doc, item_id)` after each item."""
    if len(docs) < 1:
        raise UsageError("compare needs at least one document")
    name, all_items = load_checklist(checklist)
    chosen = [i for i in all_items if not items or i.id in items]
    if items and len(chosen) != len(set(items)):
        missing = sorted(set(items) - {i.id for i in chosen})
        raise UsageError(f"unknown checklist item(s): {', '.join(missing)}")
    session = Session.of(session)  # loaded once for every document and item
    settings = session.settings
    rows = [Row(i) for i in chosen]
    prefilled: dict[str, int] = {}
    t0 = time.perf_counter()
    # one document at a time, all its items in a row: they share the document prefix
    for doc in docs:
        prefilled[doc] = 0
        for row in rows:
            f, _ = check_item(doc, row.item, session)
            row.findings[doc] = f
            prefilled[doc] += f.prompt_tokens - f.cached_tokens
            if on_progress:
                on_progress(doc, row.item.id)
    for row in rows:
        agree_on_same_quotes(row, settings.compare.no_min_confidence)
    return Comparison(name, docs, rows, prefilled, time.perf_counter() - t0, settings.generator.prompt_rate_tok_s)
