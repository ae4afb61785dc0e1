"""The words of a text, as the checks that compare texts read them.

    words(text)          stemmed words, as the lexical index reads them ("independently
                         developed" ~ "independent development"): quotes, passages, compare
    content_words(text)  the same, less words under three letters and one-digit numbers:
                         claims and inferred citations
    name_words(doc)      the content words of a document's file name
    plain_words(text)    lower-cased words of three letters or more, not stemmed: the
                         sentence a marker [n] is quoted from (ragkit.answer.citations)

Every stemmed word set is the lexical index's `tokenize` (Snowball, English stopwords
dropped): the store's index and these checks never disagree on what a word is.
"""

from __future__ import annotations

import re

_WORD = re.compile(r"\w+", re.U)


def words(text: str) -> set[str]:
    """The text's words as the lexical index reads them: stemmed with Snowball ("independently
    developed" ~ "independent development")."""
    from ragkit.store.lexical_text import tokenize

    return set(tokenize(text))  # tokenize already stems (Snowball); stemming twice is not idempotent ("agree" -> "agr")


def content_words(text: str) -> set[str]:
    """Stemmed content words: English stopwords dropped (bm25s's list, as retrieval
    uses), words of three letters or more and numbers of two digits or more
    ("confidential" and "confidentiality" are one word)."""
    from ragkit.store.lexical_text import tokenize

    kept = [w for w in tokenize(text) if (len(w) >= 3 and not w.isdigit()) or (w.isdigit() and len(w) >= 2)]
    return set(kept)  # tokenize already stems with Snowball (stemming twice is not idempotent)


def name_words(doc: str) -> set[str]:
    """The content words of a document's name, its extension dropped and "-" and "_" read
    as spaces ("bonterms-mutual-nda.md" -> bonterm, mutual, nda)."""
    return content_words(re.sub(r"\.\w+$", "", doc).replace("-", " ").replace("_", " "))


def plain_words(text: str) -> set[str]:
    """The text's words of three letters or more, lower-cased, not stemmed."""
    return {w.lower() for w in _WORD.findall(text) if len(w) > 2}


__all__ = ["content_words", "name_words", "plain_words", "words"]
