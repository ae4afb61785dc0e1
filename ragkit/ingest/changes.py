"""Tracked changes a Word file still carries (insertions, deletions and moves nobody has
accepted or rejected): read by ragkit.ingest.docx, kept with the chunk whose text they
touch (chunk metadata "changes") and summed per document (`ragkit docs`). The stored
text is the document as it reads with every change accepted; these records say which
words are not yet agreed, and what was struck."""

from __future__ import annotations

import json
from dataclasses import dataclass

_VERB = {"inserted": "inserted", "deleted": "deleted", "moved-in": "moved here", "moved-out": "moved away"}


@dataclass
class TrackedChange:
    kind: str  # "inserted" | "deleted" | "moved-in" | "moved-out"
    text: str  # the inserted, moved or struck words
    author: str = ""
    date: str = ""  # the day Word stamped (YYYY-MM-DD), "" when it gave none
    id: str = ""  # unique within the document
    start: int = 0  # where it stands in its block's text (a deletion: start == end, where the words were)
    end: int = 0
    before: str = ""  # a deletion: the accepted words just before and after the struck ones
    after: str = ""

    @property
    def in_text(self) -> bool:
        """Its words are part of the stored (accepted) text."""
        return self.kind in ("inserted", "moved-in")

    def describe(self) -> str:
        """'“five (5)”: inserted by Counsel on 2026-12-01, not yet accepted'."""
        who = f" by {self.author}" if self.author else ""
        when = f" on {self.date}" if self.date else ""
        return f"“{_clip(self.text)}”: {_VERB.get(self.kind, self.kind)}{who}{when}, not yet accepted"

    def to_json(self) -> dict:
        d = {"kind": self.kind, "text": self.text, "author": self.author, "date": self.date, "id": self.id}
        if not self.in_text:
            d["before"], d["after"] = self.before, self.after
        return d

    @classmethod
    def from_json(cls, d: dict) -> "TrackedChange":
        return cls(kind=str(d.get("kind", "")), text=str(d.get("text", "")), author=str(d.get("author", "")),
                   date=str(d.get("date", "")), id=str(d.get("id", "")), before=str(d.get("before", "")),
                   after=str(d.get("after", "")))


def _clip(s: str, limit: int = 120) -> str:
    s = " ".join(s.split())
    return s if len(s) <= limit else s[: limit - 1].rstrip() + "…"


def dumps(changes: list[TrackedChange]) -> str:
    """The chunk metadata value (Chroma keeps scalars only: a JSON list as text)."""
    return json.dumps([c.to_json() for c in changes], ensure_ascii=False)


def loads(value) -> list[TrackedChange]:
    """A chunk's changes from its metadata value (none when absent or unreadable)."""
    if not value:
        return []
    try:
        items = json.loads(value) if isinstance(value, str) else value
        return [TrackedChange.from_json(d) for d in items if isinstance(d, dict)]
    except (ValueError, TypeError):
        return []


def _norm(s: str) -> str:
    return " ".join(s.split()).lower()


def touching(changes: list[TrackedChange], quote: str) -> list[TrackedChange]:
    """The changes a quoted passage shows or stands beside: inserted or moved words it
    contains, and struck words whose place (the accepted words around them) it holds."""
    q = _norm(quote)
    if not q:
        return []
    out = []
    for c in changes:
        if c.in_text:
            t = _norm(c.text)
            if t and t in q:
                out.append(c)
        else:
            before, after = _norm(c.before)[-24:].strip(), _norm(c.after)[:24].strip()
            if (before and before in q) or (after and after in q):
                out.append(c)
    return out


def summary(changes: list[TrackedChange]) -> dict:
    """A document's unaccepted changes: how many, by whom, when (first and last day)."""
    seen: dict[str, TrackedChange] = {}
    for c in changes:
        seen.setdefault(c.id or f"{c.kind}|{c.text}|{c.author}|{c.date}", c)
    dates = sorted(c.date for c in seen.values() if c.date)
    return {
        "count": len(seen),
        "authors": sorted({c.author for c in seen.values() if c.author}),
        "first": dates[0] if dates else "",
        "last": dates[-1] if dates else "",
    }


def summary_line(count: int, authors: str, dates: str) -> str:
    """'2 unaccepted changes by Counsel, 2026-12-01' (empty when there are none)."""
    if not count:
        return ""
    s = f"{count} unaccepted change{'s' if count != 1 else ''}"
    if authors:
        s += f" by {authors}"
    if dates:
        s += f", {dates}"
    return s
