"""What a question is: the text it is searched with (`search_query`: the question less what
only tells the model how to answer), and whether it asks for the clause itself
(`is_extractive`: answered by quoting the sources).

"Does the agreement state that X? Start your answer with Yes, No or Not mentioned." is
searched as "X": the answer-format instruction and the question frame name no content,
yet their words ("answer", "mentioned", "state", "agreement") are rare in a contract, so
BM25 and the sentence ranking would reward a clause that happens to hold them (a
governing-law clause for "state"). The prompt keeps the question as asked; only the
search text changes. Written by hand: a few patterns of English question framing, which
no library strips.
"""

from __future__ import annotations

import re

# Sentences that only say how to answer (anywhere after the first sentence).
_INSTRUCTION = re.compile(
    r"^\(?\s*(?:please\s+)?(?:start|begin|answer|reply|respond|say|give|quote|cite|keep|be|use|write|choose|"
    r"pick|select|format|limit|return|include)\b[^.?!]*?\b(?:answer|reply|response|yes|no|not mentioned|"
    r"one of|words?|sentences?|brief|concise|short|citations?|sources?|quote|markdown|json|list|bullet)\b.*$",
    re.I | re.S,
)
# "Does the agreement state that ...", "Does the contract say whether ..."
_FRAME = re.compile(
    r"^\s*(?:does|do|did|will|would|is it (?:true|the case) that)\s+(?:the|this|each|either|any)?\s*"
    r"(?:agreement|contract|document|nda|filing|guidance|policy|text|clause|section|documents|parties|it)\s+"
    r"(?:state|say|provide|specify|require|mention|indicate|stipulate|contain|set out|establish)s?\s+"
    r"(?:that|whether|if)?\s*",
    re.I,
)
# CUAD's form: "Highlight the parts (if any) of this contract related to "X" that should be
# reviewed by a lawyer. Details: ..."
_HIGHLIGHT = re.compile(
    r"^\s*(?:highlight|find|show|list|quote)\s+(?:the\s+)?(?:parts|clauses|sections|passages)\s*(?:\(if any\))?\s+"
    r"of\s+(?:this|the)\s+(?:contract|agreement|document)\s+(?:related|relating)\s+to\s+", re.I)
_WHICH_PART = re.compile(
    r"^\s*(?:which|what)\s+(?:part|parts|clause|clauses|section|sections|passage|passages|provision|provisions)\s+"
    r"of\s+(?:this|the)\s+(?:contract|agreement|document|filing)\s+(?:concerns?|covers?|deals? with|addresses|"
    r"is about|are about|relates? to)\s+", re.I)
_SHORT_ORDER = re.compile(r"^(?:please\s+)?(?:quote|cite|explain|answer|be|keep|say|show|list)\b(?:\s+\w+){0,3}[.!]?$", re.I)
_LAWYER = re.compile(r"\s*that should be reviewed by a lawyer\.?", re.I)
_SPLIT = re.compile(r"(?<=[.?!])\s+|\n+")


def search_query(question: str) -> str:
    """`question` without answer-format sentences and without a leading "does the agreement
    state that" frame; the question itself when nothing would be left."""
    parts = [p for p in _SPLIT.split(question.strip()) if p.strip()]
    if not parts:
        return question
    kept = [parts[0]] + [p for p in parts[1:] if not (_INSTRUCTION.match(p.strip()) or _SHORT_ORDER.match(p.strip()))]
    text = " ".join(kept)
    text = _LAWYER.sub(".", _HIGHLIGHT.sub("", text, count=1)).replace("..", ".")
    text = _WHICH_PART.sub("", text, count=1)
    framed = _FRAME.sub("", text, count=1)
    if len(re.findall(r"\w+", framed)) >= 2:
        text = framed[:1].upper() + framed[1:]
    return text.strip() or question


# a question that asks for the clause itself: answered by quoting the sources (ragkit.answer.ask),
# so its prompt keeps whole chunks to quote from (ragkit.retrieve.packing)
_EXTRACTIVE = re.compile(
    r"\bquote\s+(?:it|them|the\s+(?:clause|sentence|passage|provision|section|text)s?)\b"
    r"|^\s*highlight\s+the\s+(?:parts|clauses|sections|passages)\b"
    r"|^\s*(?:which|what)\s+(?:part|parts|clause|clauses|section|sections|passage|passages|provision|provisions)\s+of\s+"
    r"(?:this|the)\s+(?:contract|agreement|document|filing|nda)\s+(?:concerns?|covers?|deals?\s+with|addresses|relates?\s+to|"
    r"is\s+about|are\s+about)\b"
    r"|^\s*(?:quote|cite|show\s+me|find)\s+the\s+(?:clause|clauses|provision|provisions|passage|passages|sentence|sentences)\b",
    re.I)


def is_extractive(question: str) -> bool:
    """Whether the question asks for the clause itself ("Which part of this contract
    concerns X? Quote it.", "Highlight the parts ... related to X", "Quote the clause on
    ..."): answered by quoting the sources, not by generation."""
    return bool(_EXTRACTIVE.search(question or ""))
