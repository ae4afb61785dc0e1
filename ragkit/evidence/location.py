"""Where a quote stands in its document, as every reader is told it: "p. 3, § 5.2 Term"
(the prompt's source lines, citations, passages, the comparison memo, the CLI and the
server's sources)."""

from __future__ import annotations


def format_location(page: int | None, section: str | None, page_end: int | None = None) -> str:
    """'p. 3, § 5.2 Term' (or 'pp. 3-4'); empty when there is neither."""
    parts = []
    if page is not None:
        parts.append(f"p. {page}" if page_end in (None, page) else f"pp. {page}-{page_end}")
    if section:
        parts.append(f"§ {section}")
    return ", ".join(parts)


__all__ = ["format_location"]
