"""The checklist: its items (question, hypothesis, the words that name it, the contrary
wording that answers it No) and the TOML files they are read from."""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ragkit.errors import ConfigError
from ragkit.paths import prompts_dir

if TYPE_CHECKING:
    pass


LABELS = ("Yes", "No", "Not mentioned", "Unclear", "Found")
FINDINGS = ("clauses", "date", "parties", "name")
NLI = {"Yes": "Entailment", "No": "Contradiction", "Not mentioned": "NotMentioned"}


@dataclass
class ChecklistItem:
    id: str
    title: str
    question: str
    hypothesis: str | None = None
    # words a sentence about the item names ("reverse engineer*", "decompil*"; a trailing
    # * matches any ending): a document none of whose sentences names one does not
    # mention the item, whatever the nearest passage scores
    terms: list[str] = field(default_factory=list)
    # wording that says the opposite of the hypothesis ("whether or not marked" against
    # "all Confidential Information shall be marked"): a sentence of the document that
    # holds it makes the label No, and is the quote
    contrary: list[str] = field(default_factory=list)
    # wording that says the hypothesis holds, for an item that asks whether something is
    # allowed at all ("may disclose" against "may share some Confidential Information with
    # third parties"): a sentence that names a term and holds it, not negated ("no party may
    # disclose"), makes the label Yes, and is the quote; it is read before `contrary`, since
    # one permission answers such an item whatever prohibitions the document also makes
    affirm: list[str] = field(default_factory=list)
    # only the words decide (an item that nearly every document touches in passing, "copies"
    # in a return clause): affirm -> Yes, contrary -> No, anything else Not mentioned
    words_only: bool = False
    # whom or what a permission must name, for an item about a permission towards someone
    # (sharing with third parties: consultants, advisors, agents ...): an affirming phrase
    # counts only when it names one of these words, after its verb in the sentence ("may
    # disclose ... to its advisors"; not "may disclose certain information to the other
    # party") or, for a phrase without one ("need to know"), before it from the exception
    # that opens it (`_permitted`), and an exception
    # lifts a contrary prohibition only when it names one ("shall not disclose ... to any
    # third party except to its own employees" still says No: employees are not third parties)
    objects: list[str] = field(default_factory=list)
    # the checklist's label model (its TOML's top-level `label_model`: a registry name or a
    # folder, relative to the TOML), set by load_checklist
    label_model: str | None = None
    # what a review's cell holds for the item (`ragkit review`, ragkit.compare.review): "clauses"
    # to quote; a "date", the "parties" or the contract's "name" (the passage that states it)
    finding: str = "clauses"
    # what counts as evidence for the item, in a reviewer's words (shown beside the column)
    evidence: str = ""
    # the checklist's kinds model (its TOML's top-level `kind_model`: a registry name or a
    # folder, relative to the TOML), set by load_checklist: a review reads each unit's kind from it
    kind_model: str | None = None

    def __post_init__(self) -> None:
        if self.finding not in FINDINGS:
            raise TypeError(f"item {self.id!r}: finding must be one of {', '.join(FINDINGS)}")
        if not isinstance(self.evidence, str):
            raise TypeError(f"item {self.id!r}: evidence must be text")
        for name in ("terms", "contrary", "affirm", "objects"):
            v = getattr(self, name)
            if not (isinstance(v, list) and all(isinstance(t, str) and t.strip() for t in v)):
                raise TypeError(f"item {self.id!r}: {name} must be a list of non-empty strings")
            if any(t.split()[0] == "..." or t.split()[-1] == "..." for t in v):
                raise TypeError(f"item {self.id!r}: a phrase of {name} cannot begin or end with \"...\"")
        if not isinstance(self.words_only, bool) or (self.words_only and not (self.affirm or self.contrary)):
            raise TypeError(f"item {self.id!r}: words_only must be true or false, and true needs affirm or contrary words")
        self._terms = term_pattern(self.terms)
        self._contrary = [term_pattern([t]) for t in self.contrary] or None
        self._affirm = [term_pattern([t]) for t in self.affirm] or None
        self._objects = term_pattern(self.objects)

    def names_item(self, text: str) -> bool:
        """Whether a sentence names one of the item's terms (True when it has none)."""
        return self._terms is None or bool(self._terms.search(text))

    def affirm_in(self, text: str) -> str | None:
        """The affirming wording the sentence holds, if any (`affirm_scope`), naming one of
        the item's `objects` after it when it has them."""
        return _shortest(self._affirm, _masked(text), lambda t, a, b: affirm_scope(t, a, b, self._objects))

    def contrary_in(self, text: str) -> str | None:
        """The contrary wording the sentence holds, if any, read in its scope
        (`contrary_scope`): a prohibition the same sentence makes an exception to ("shall
        not copy ... except as reasonably necessary") and wording the sentence excludes
        ("technical information only and excludes business plans") are not contrary; with
        `objects`, an exception that names none of them leaves the prohibition standing."""
        return _shortest(self._contrary, _masked(text), lambda t, a, b: contrary_scope(t, a, b, self._objects))


def _shortest(patterns, text: str, in_scope) -> str | None:
    """The shortest in-scope match of any of the phrases (each its own pattern, so a long
    "means ... business" does not hide the "business information" inside it): the words
    the note quotes."""
    found = [next((m.group(0) for m in pat.finditer(text) if in_scope(text, m.start(), m.end())), None)
             for pat in patterns or []]
    return min((f for f in found if f), key=len, default=None)


# negation and exception scope of a contrary phrase, inside its clause (up to ; or :)
_NEGATION = re.compile(r"\b(?:not|no|nor|never|neither|without)\b|n[’']t\b", re.I)
_EXCLUDES = re.compile(r"\b(?:exclud\w*|other\s+than|except(?:ing)?|apart\s+from|save\s+for|not|no|nor|never|neither)\b",
                       re.I)
# idioms with a negation word that exclude nothing ("including but not limited to")
_NOT_EXCLUDING = re.compile(r"\b(?:(?:but\s+)?(?:is\s+|are\s+)?not\s+limited\s+to|without\s+limit\w*|whether\s+or\s+not)\b",
                            re.I)
_EXCEPTION = re.compile(r"\b(?:except|excepting|unless|other\s+than|save\s+(?:as|for|that)|provided\s*,?\s*(?:however|that)|"
                        r"but\s+(?:may|can|shall\s+be\s+permitted)|to\s+the\s+extent)\b", re.I)


# idioms whose words are not the words an item looks for: "means" as a noun ("by any means",
# "by means of") is not a definition ("... means business information"); masked (same length,
# so the offsets hold) before any phrase is matched
_IDIOMS = re.compile(r"\bby\s+(?:any|all|whatever|other|such|electronic|the)?\s*means\b|\bmeans\s+of\b", re.I)


def _masked(text: str) -> str:
    return _IDIOMS.sub(lambda m: " " * len(m.group(0)), text)


def _sentence_after(text: str, end: int) -> str:
    """The text after position `end`, to the end of its sentence (a list after a colon included)."""
    return re.split(r"(?<=[.!?])\s", text[end:], maxsplit=1)[0]


def _names_object(objects, text: str) -> bool:
    return objects is None or bool(objects.search(text))


_PERMITTING_VERB = re.compile(r"\b(?:disclos|shar|provid|furnish|communicat|reveal|make|divulg|releas|transfer|giv)\w*", re.I)


def _permitted(phrase: str, before: str, after: str) -> str:
    """The words that say whom a permission is for: after a phrase with its verb ("may
    disclose ... to its advisors"); before one without ("except to its employees and
    professional advisers who need to know"), from the exception that opens it or the
    clause's start."""
    if _PERMITTING_VERB.search(phrase):
        return after
    opened = list(_EXCEPTION.finditer(before))
    return before[opened[-1].start():] if opened else before


def contrary_scope(text: str, start: int, end: int, objects: "re.Pattern | None" = None) -> bool:
    """Whether the contrary phrase at text[start:end] says the opposite of the item in its
    clause. A phrase that is itself a prohibition ("not copy", "no copies") does not when
    the same sentence makes an exception to it after it ("shall not copy ... except as
    reasonably necessary for the Purpose": copies are allowed in some circumstances); a
    phrase that names something ("business plans") does not when its clause excludes it
    ("technical information only and excludes business plans", "other than business
    information", "does not include financial information"): the words then agree with
    the item. Clause: back to the last ";", ":" or sentence end, on to the sentence end."""
    phrase = text[start:end]
    before = re.split(r"[;:.!?]\s", text[:start])[-1]
    after = re.split(r"(?<=[.!?])\s", text[end:], maxsplit=1)[0]
    if _NEGATION.search(phrase):
        # the exception may also sit inside a phrase with a gap ("not disclose, except to its
        # advisers, to any third party"); with objects it must name one ("except to its own
        # employees" lifts nothing from a ban on third parties)
        m = _EXCEPTION.search(after)
        if m is not None and _names_object(objects, after[m.end():]):
            return False
        m = _EXCEPTION.search(phrase)
        # (inside the phrase: what the exception names, less the phrase's own "to any third party")
        return not (m is not None and _names_object(objects, re.sub(r"\bto\s+any\b.*$", "", phrase[m.end():], flags=re.I)))
    # ... and the exclusion inside one ("means technical information only and excludes business")
    return not _EXCLUDES.search(_NOT_EXCLUDING.sub(" ", before[-80:] + " " + phrase))


def affirm_scope(text: str, start: int, end: int, objects: "re.Pattern | None" = None) -> bool:
    """Whether the affirming phrase at text[start:end] says the item holds: not when the
    phrase itself is negated ("may not disclose") or its clause negates it before it
    ("neither party may disclose", "no Confidential Information may be disclosed"), unless
    the phrase is the exception to that negation ("shall not disclose ... other than to",
    "shall not copy ... except as"). An exception is a permission only when it lifts a
    prohibition: "return or destroy all copies ... to the extent practicable" permits no
    copy. With `objects` (the item's), the permission must name one (`_permitted`)."""
    phrase = text[start:end]
    before = re.split(r"[;:.!?]\s", text[:start])[-1]
    if objects is not None and not _names_object(objects, _permitted(phrase, before, _sentence_after(text, end))):
        return False
    negated_before = bool(_NEGATION.search(_NOT_EXCLUDING.sub(" ", before[-60:])))
    exception = _EXCEPTION.search(phrase)
    if exception is not None:
        return negated_before or bool(_NEGATION.search(phrase[: exception.start()]))
    if re.search(r"\bonly\b", phrase, re.I):
        return True
    if _NEGATION.search(phrase):
        return False
    return not negated_before


# "..." inside a phrase: up to this many words between its two sides ("disclos* ... only to")
GAP_WORDS = 8


def term_pattern(terms: list[str]) -> "re.Pattern | None":
    """One case-insensitive pattern for a list of phrases: words match whole ("copy" does
    not match "copyright"), a trailing * any ending ("decompil*"), words apart by spaces
    or hyphens ("reverse engineer*" matches "reverse-engineering"), "..." for up to
    GAP_WORDS words in between, inside one clause ("disclos* ... only to"). Phrases, not
    regular expressions: a checklist is written by lawyers."""
    if not terms:
        return None
    alts = []
    for t in terms:
        parts = []
        for w in t.split():
            if w == "...":
                parts.append(None)
            else:
                parts.append(re.escape(w[:-1]) + r"\w*" if w.endswith("*") else re.escape(w))
        out = ""
        for i, w in enumerate(parts):
            if w is None:
                continue
            if i:
                # between words: a space or hyphen, or after "..." a few words of the same clause
                out += rf"(?:[\s\-]+[^\s;:.!?]+){{0,{GAP_WORDS}}}?[\s\-]+" if parts[i - 1] is None else r"[\s\-]+"
            out += w
        alts.append(r"\b" + out + r"\b")
    return re.compile("|".join(alts), re.IGNORECASE)

ITEM_KEYS = frozenset({"id", "title", "question", "hypothesis", "terms", "contrary", "affirm", "words_only", "objects",
                       "finding", "evidence"})
TOP_KEYS = frozenset({"name", "description", "label_model", "kind_model", "items"})


def load_checklist(name_or_path: str) -> tuple[str, list[ChecklistItem]]:
    p = Path(name_or_path)
    if not (p.suffix == ".toml" and p.exists()):
        p = prompts_dir() / "checklists" / f"{name_or_path}.toml"
    if not p.exists():
        have = ", ".join(sorted(x.stem for x in (prompts_dir() / "checklists").glob("*.toml")))
        raise ConfigError(f"checklist {name_or_path!r} not found", hint=f"built in: {have}; or give a .toml path")
    hint = "see prompts/checklists/nda.toml for the format"
    try:
        data = tomllib.loads(p.read_text(encoding="utf-8"))
        raw = data["items"]
    except (tomllib.TOMLDecodeError, KeyError, TypeError) as exc:
        raise ConfigError(f"checklist {p} is not valid: {exc}", hint=hint) from None
    # a misspelled key ("objets") would drop the words it holds without a word: refused by name
    unknown = sorted(set(data) - TOP_KEYS)
    if unknown:
        raise ConfigError(f"checklist {p}: unknown key {', '.join(map(repr, unknown))}", hint=f"keys: {', '.join(sorted(TOP_KEYS))}")
    items = []
    for n, it in enumerate(raw if isinstance(raw, list) else [], 1):
        where = f"item {it.get('id', n)!r}" if isinstance(it, dict) else f"item {n}"
        if not isinstance(it, dict):
            raise ConfigError(f"checklist {p}: {where} is not a table", hint=hint)
        unknown = sorted(set(it) - ITEM_KEYS)
        if unknown:
            raise ConfigError(f"checklist {p}: {where} has unknown key {', '.join(map(repr, unknown))}",
                              hint=f"an item's keys: {', '.join(sorted(ITEM_KEYS))}")
        try:
            items.append(ChecklistItem(**it))
        except TypeError as exc:
            raise ConfigError(f"checklist {p} is not valid: {exc}", hint=hint) from None
    if not items or len({i.id for i in items}) != len(items):
        raise ConfigError(f"checklist {p} needs at least one item and unique ids")
    # the checklist's models (a registry name, or a folder relative to the TOML), set on each item
    for key in ("label_model", "kind_model"):
        model = data.get(key)
        if model is None:
            continue
        if not isinstance(model, str) or not model.strip():
            raise ConfigError(f"checklist {p}: {key} must be a registry name or a folder")
        from ragkit.models import REGISTRY

        if model not in REGISTRY and not Path(model).expanduser().is_absolute():
            model = str((p.parent / model).resolve())
        for i in items:
            setattr(i, key, model)
    return data.get("name", p.stem), items
