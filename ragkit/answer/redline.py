"""Questions about a Word file's unaccepted tracked changes ("What did the other side
strike?", "Which words were inserted?") answered from the changes ingest kept with each
clause (ragkit.ingest.changes), not generated: struck words are in no sentence of the
stored text, so a model reading the sources could only guess, and the checks would then
call the documents silent on what they hold."""

from __future__ import annotations

import re

from ragkit.ingest import changes as tracked

_ASKS = re.compile(
    r"\b(struck|strikes?|stricken|strike-?through|deleted|deletions?|inserted|insertions?|redlin\w*|"
    r"tracked[- ]changes?|track[- ]changes|mark-?ups?|unaccepted|not (yet )?accepted|revisions?)\b"
    r"|\bwhat (did|has|have|was|were)\b.{0,60}\b(changed?|added|add|removed?|cut|edit(ed)?|struck|strike)\b",
    re.I)
_REMOVED = re.compile(r"\b(struck|strikes?|stricken|strike-?through|deleted|deletions?|removed?|cut)\b", re.I)
_ADDED = re.compile(r"\b(inserted|insertions?|added|add|additions?)\b", re.I)
MAX_LISTED = 40


def asks_about_changes(question: str) -> bool:
    """The question asks what was struck, inserted or changed in a draft."""
    return bool(_ASKS.search(question)) and not re.search(r"\bchange (of|in) control\b", question, re.I)


def wanted(question: str, change: tracked.TrackedChange) -> bool:
    """A deletion for "what was struck", an insertion for "what was inserted", any otherwise."""
    removed, added = bool(_REMOVED.search(question)), bool(_ADDED.search(question))
    if removed == added:
        return True
    return (not change.in_text) if removed else change.in_text


def where_it_stood(c: tracked.TrackedChange) -> str:
    """The struck words in their place: '… survive for [struck: two (2)] five (5) years …'."""
    if c.in_text:
        return ""
    before, after = " ".join(c.before.split()), " ".join(c.after.split())
    # the context was cut at a length (ragkit.ingest.docx): drop a word it cut in two
    if len(c.before) >= 40 and " " in before:
        before = before.split(" ", 1)[1]
    if len(c.after) >= 40 and " " in after:
        after = after.rsplit(" ", 1)[0]
    return f"“…{before} [struck: {' '.join(c.text.split())}] {after}…”"


def listing(question: str, records, hits) -> tuple[str, list[tuple[object, tracked.TrackedChange]]]:
    """The answer's text and the (chunk hit, change) pairs it lists: per document with
    changes, each change the question asks about, with its clause."""
    lines: list[str] = []
    shown: list[tuple[object, tracked.TrackedChange]] = []
    by_doc: dict[str, list] = {}
    for h in hits:
        by_doc.setdefault(h.meta.get("doc_id", ""), []).append(h)
    for rec in records:
        if not rec.tracked_changes:
            continue
        seen: set[str] = set()
        pairs = []
        for h in sorted(by_doc.get(rec.doc_id, []), key=lambda h: int(h.meta.get("chunk_index", 0))):
            for c in tracked.loads(h.meta.get("changes")):
                if c.id not in seen:
                    seen.add(c.id)
                    pairs.append((h, c))
        asked = [(h, c) for h, c in pairs if wanted(question, c)]
        head = f"{rec.name}: {tracked.summary_line(rec.tracked_changes, rec.change_authors, rec.change_dates)}"
        if not asked:
            lines.append(f"{head}; none of the kind asked about. All of them:")
            asked = pairs
        else:
            lines.append(f"{head}:")
        for h, c in asked[:MAX_LISTED]:
            section = h.meta.get("section")
            lines.append(f"- {c.describe()}" + (f" (§ {section})" if section else "")
                         + (f": {where_it_stood(c)}" if not c.in_text else ""))
            shown.append((h, c))
        if len(asked) > MAX_LISTED:
            lines.append(f"- … and {len(asked) - MAX_LISTED} more")
    return "\n".join(lines), shown
