"""The quote a lawyer checks: the clause of a document that answers a checklist item,
chosen from the sources (not from the model's citation, `choose_quote`), and how well it
matches the item (`evidence`, calibrated on the document itself). The quote rules (which
unit of a clause, with its lead-in) are the evidence floor's (ragkit.evidence.quotes),
shared with `ask`'s passages."""

from __future__ import annotations

from ragkit.compare.checklist import ChecklistItem
from ragkit.config import Settings
from ragkit.evidence.quotes import clause_quote, quotable
from ragkit.evidence.sentences import split_units
from ragkit.evidence.words import words
from ragkit.session import Session


def _similarity(session: Session | Settings | None, item: "ChecklistItem"):
    """Cosine of each text to the checklist item, with the store's embedder."""
    if session is None:
        return None
    import numpy as np

    emb = Session.of(session).embedder
    q = np.asarray(emb.embed_query(f"{item.title}. {item.question} {item.hypothesis or ''}".strip()), dtype=np.float32)

    def sim(texts: list[str]) -> list[float]:
        return [float(x) for x in np.asarray(emb.embed_documents(texts), dtype=np.float32) @ q]

    return sim


def choose_quote(contexts, item: "ChecklistItem", session: Session | Settings | None = None):
    """The clause that answers the item, found without trusting the model: among the
    sources in the prompt, the one whose section title and text share most words with
    the item's title and question (title words count double), ties broken by retrieval
    rank; then, in it, the sentence or list item sharing most words. A lawyer checks
    this quote, whatever the model said."""
    import math

    if not contexts:
        return None
    want = words(item.title + " " + item.question)
    title_words = words(item.title)
    bags = [(words(c.section or ""), words(c.text)) for c in contexts]
    # words found in every section of the document ("confidential", "party") tell
    # nothing: weight each word by its inverse document frequency across the sections
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
    # a section with a sentence that names the item (its checklist terms) before one that
    # only shares words with it
    named = [c for c in contexts if any(item.names_item(u) for u in split_units(c.text))] if item.terms else []
    top = max(named or contexts, key=lambda c: fits[id(c)])
    weight = {w: idf[w] + (1.0 if w in title_words else 0.1) for w in want}
    return top, clause_quote(top.text, want, weight, similarity=_similarity(session, item),
                             names_item=item.names_item if item.terms else None)


def document_sentences(contexts, session: Session | Settings) -> list[tuple[str, object]]:
    """Every quotable sentence of the documents the contexts come from (all their chunks
    in the store, not only those retrieved into the prompt), in document order, each with
    the chunk it is in (its page and section); kept by the session per document version."""
    session = Session.of(session)
    memo = session.memo("compare.sentences")
    key = tuple(sorted({c.doc_id for c in contexts}))
    if key not in memo:
        # the contract's own words: a reviewer's comment is never quoted as the clause
        hits = [h for h in session.store.chunks(list(key)) if h.meta.get("kind") != "comment"] or list(contexts)
        pairs = [(u, h) for h in hits for u in split_units(h.text)]
        keep = quotable([u for u, _ in pairs])
        seen: dict[str, object] = {}
        for j in keep:
            seen.setdefault(pairs[j][0], pairs[j][1])
        memo[key] = list(seen.items()) or pairs
    return memo[key]


def _document_units(contexts, session: Session | Settings) -> list[str]:
    """The documents' quotable sentences (`document_sentences`), so the calibration sees
    the whole document."""
    return [u for u, _ in document_sentences(contexts, session)]


def place_of(hit) -> tuple[int | None, str | None]:
    """A store hit's or a prompt context's page and section."""
    meta = getattr(hit, "meta", None)
    if meta is not None:
        return meta.get("page_start"), meta.get("section")
    return getattr(hit, "page_start", None), getattr(hit, "section", None)


def evidence(item: "ChecklistItem", contexts, quote: str | None, session: Session | Settings) -> dict:
    """How well the quote matches the checklist item, calibrated on the document itself,
    so the rule holds whatever the embedder's cosine range (MiniLM's and e5's differ):
    `z` is the quote's cosine to the item (its hypothesis, else its question) in standard
    deviations above the mean cosine of every sentence of the sources; `coverage` the
    share of the item's content words (idf-weighted over the sentences, stemmed) that the
    quote holds. A quote a few deviations above the rest, that holds the item's rarer
    words, is on point; the nearest row of a cover page is not."""
    import math

    import numpy as np

    session = Session.of(session)
    units = _document_units(contexts, session)
    if not quote or len(units) < 2:
        return {"z": None, "cos": None, "coverage": None, "units": len(units)}
    emb = session.embedder  # remembers the vectors: a document's sentences are embedded once per session
    vecs = np.asarray(emb.embed_documents(units + [quote]), dtype=np.float32)
    q = np.asarray(emb.embed_query(item.hypothesis or f"{item.title}. {item.question}"), dtype=np.float32)
    cos = vecs[:-1] @ q
    qc = float(vecs[-1] @ q)
    sd = float(cos.std()) or 1e-6
    want = words(item.hypothesis or item.question)
    bags = [words(u) for u in units]
    n = len(bags)
    idf = {w: math.log((n + 1) / (1 + sum(1 for b in bags if w in b))) + 0.1 for w in want}
    have = words(quote)
    coverage = sum(idf[w] for w in want & have) / (sum(idf.values()) or 1.0)
    return {"z": round((qc - float(cos.mean())) / sd, 3), "cos": round(qc, 4), "coverage": round(coverage, 3), "units": n,
            "support": round(_hypothesis_support(item, quote, emb), 3)}


def _hypothesis_support(item: "ChecklistItem", quote: str, embedder) -> float:
    """The shared claims mechanism (ragkit.answer.claims.attribute) reading the item's
    hypothesis as a claim against the quote: its support, 0-1."""
    from types import SimpleNamespace

    from ragkit.answer.claims import attribute

    src = SimpleNamespace(n=1, doc="-", doc_id="-", page_start=None, page_end=None, section=None, text=quote)
    claims = attribute(item.hypothesis or item.question, [src], embedder)
    return max((c.support for c in claims), default=0.0)
