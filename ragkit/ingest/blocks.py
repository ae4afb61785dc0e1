"""Data passed between the ingest stages."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Block:
    """A unit of extracted text in reading order: a paragraph, a heading or a whole table."""

    text: str
    page: int | None = None  # 1-based; None when the format has no pages (DOCX, MD, TXT)
    kind: str = "text"  # "text" | "heading" | "table" | "comment" (a reviewer's, never contract text)
    level: int | None = None  # heading level when the format says it (DOCX styles, Markdown #)
    # unaccepted tracked changes (ragkit.ingest.changes.TrackedChange), placed in `text`
    changes: list = field(default_factory=list)


@dataclass
class Section:
    path: list[str]  # ["Article 5", "5.2 Term"]
    blocks: list[Block] = field(default_factory=list)
    changes: list = field(default_factory=list)  # tracked changes of its heading
    heading: Block | None = None  # the format's own heading block that opened it (Word style, Markdown #)

    @property
    def path_str(self) -> str:
        return " > ".join(self.path)


@dataclass
class Chunk:
    text: str  # body text as it appears in the document
    section: str  # section path, " > " joined
    page_start: int | None
    page_end: int | None
    char_start: int
    char_end: int
    kind: str = "text"  # "text" | "table" | "comment"
    tokens: int = 0  # embedder tokens of embed_text()
    # the section path as embedded when the full one would crowd out the body
    # ("… > 5.2 Term"); None: the full `section`, which is always what is stored and cited
    embed_section: str | None = None
    changes: list = field(default_factory=list)  # unaccepted tracked changes its text shows or stands beside

    def embed_text(self) -> str:
        """What the embedder sees: the section path repeated in each piece (shortened when
        it is too long to leave the body room), then the body."""
        head = self.section if self.embed_section is None else self.embed_section
        return f"{head}\n{self.text}" if head else self.text
