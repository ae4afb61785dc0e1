"""Quote choice: which sentence or list item of a source text is quoted, read the same way
by the checklist's clause quote (ragkit.compare.quotes) and the passages `ask` shows
(ragkit.answer.passages).

    clause_quote(text, want, weight)   the unit of a clause that best matches the wanted
                                       (stemmed) words, with its lead-in
    with_lead_in(units, i)             a list item with the lead-in it completes
    quotable(units)                    the units that can be a quote (no heading, no lead-in alone)
    lexical_score(unit_words, want, weight)
                                       a unit's weighted word match, per square root of its length

A quote is a unit of the one sentence splitter (ragkit.evidence.sentences), never a chunk
fragment: a list item keeps its lead-in ("... do not apply to information that it can
demonstrate: … (d) it independently developed ..."), so the quote reads as the clause says it.
"""

from __future__ import annotations

import re
from typing import Callable

from ragkit.evidence.sentences import LIST_ITEM, split_units
from ragkit.evidence.words import words

LEXICAL_WEIGHT = 0.3  # the best word match adds this much to a sentence's cosine (ContractNLI quotes: 0.600 of gold spans; cosine alone 0.553, words alone 0.612 but it quotes Bonterms §7's duty to destroy for "retain")


def is_heading(unit: str) -> bool:
    """"Return or Destruction of Confidential Information.": short, every long word capitalised."""
    found = re.findall(r"[A-Za-z][\w’'-]*", unit)
    long = [w for w in found if len(w) > 3]
    return len(found) <= 10 and bool(long) and all(w[0].isupper() for w in long)


def quotable(units: list[str]) -> list[int]:
    """Units that can be a quote: not headings, not lead-ins alone (a lead-in comes back with its item)."""
    return [j for j in range(len(units)) if len(units[j].split()) >= 4 and not units[j].endswith(":") and not is_heading(units[j])]


def with_lead_in(units: list[str], i: int) -> str:
    """Unit `i`, and when it is a list item, the lead-in it completes ("...: … (d) ...")."""
    quote = units[i]
    if LIST_ITEM.match(quote):
        lead = next((units[j] for j in range(i - 1, -1, -1) if not LIST_ITEM.match(units[j])), None)
        if lead is not None and lead.rstrip().endswith(":"):
            lead = lead if len(lead) <= 160 else "…" + lead[-159:]
            quote = f"{lead} … {quote}"
    return quote


def lexical_score(unit_words: set[str], want: set[str], weight: dict[str, float]) -> float:
    """The weight of the wanted words a unit holds, per square root of its length."""
    # matched weight per square root of the unit's length: a long list of duties that
    # mentions "return" and "destroy" should not outrank the one sentence on "retain"
    # (a heading alone, "Term and Termination.", is not a quote: short units count as 12 words)
    return sum(weight.get(x, 1.0) for x in unit_words & want) / max(12, len(unit_words)) ** 0.5


def clause_quote(text: str, want: set[str], weight: dict[str, float], limit: int = 320,
                 similarity: Callable[[list[str]], list[float]] | None = None,
                 names_item: Callable[[str], bool] | None = None) -> str:
    """The sentence or list item of a clause that shares most (weighted, stemmed) words with
    the checklist item. A list item keeps its lead-in ("... do not apply to information
    that it can demonstrate: … (d) it independently developed ..."), so the quote reads as
    the clause says it."""
    units = split_units(text)
    if not units:
        return text[:limit]

    def score(i: int) -> tuple:
        return (lexical_score(words(units[i]), want, weight), -abs(len(units[i]) - 200))

    cand = quotable(units) or list(range(len(units)))
    if names_item is not None:
        # a sentence that names the item ("reverse engineer") before one that only sounds like it
        cand = [j for j in cand if names_item(with_lead_in(units, j))] or cand
    if similarity is not None:
        # the embedder reads meaning: "may retain ... backup copies" answers "retain after
        # returning or destroying" better than the list of duties that names "return" and
        # "destroy" (measured on Bonterms §7)
        cos = similarity([units[j] for j in cand])
        lex = [score(j)[0] for j in cand]
        top_lex = max(lex) or 1.0
        sims = [c + LEXICAL_WEIGHT * x / top_lex for c, x in zip(cos, lex)]
        order = sorted(range(len(cand)), key=lambda k: (sims[k], score(cand[k])), reverse=True)
        picked = [cand[order[0]]]
        # a near tie (Common Paper §6: the duty to destroy, then the exception that lets the
        # recipient retain copies) quotes both sentences, in the clause's order
        if len(order) > 1 and sims[order[0]] - sims[order[1]] < 0.03:
            picked = sorted(picked + [cand[order[1]]])
            limit += 160
    else:
        picked = [max(cand, key=score)]

    quote = " … ".join(with_lead_in(units, i) for i in picked)
    return quote if len(quote) <= limit else quote[: limit - 1].rstrip() + "…"


__all__ = ["LEXICAL_WEIGHT", "LIST_ITEM", "clause_quote", "is_heading", "lexical_score", "quotable", "split_units",
           "with_lead_in"]
