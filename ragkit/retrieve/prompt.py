"""Prompt building: the chat template, numbered source blocks, and a hard token budget
counted with the generator's own tokenizer.

The prompt is assembled as token ids, segment by segment: template text (turn markers)
is tokenized with special-token parsing on, while the system prompt, document text and
the question are tokenized with it off. A contract that contains `<|im_end|>` therefore
stays plain text and cannot open a new turn. The ids are what is sent to the model, so
the count is exact: budget = n_ctx - max_new_tokens - everything that is not a source.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ragkit.errors import UsageError
from ragkit.evidence.location import format_location
from ragkit.generate.chat_template import render_chat_parts
from ragkit.ingest import changes as tracked
from ragkit.paths import read_prompt
from ragkit.store import Hit

# Earlier turns of a conversation (`build(..., context=...)`) go after the sources and
# before the question, so the documents-first prefix stays byte-identical across turns.
CONTEXT_HEAD = "\n\nEarlier in this conversation:\n"


class BudgetExceeded(UsageError):
    """The question (and earlier turns) alone leave no room for sources within n_ctx."""


@dataclass
class Context:
    n: int
    doc: str
    doc_id: str
    chunk_id: str
    chunk_index: int
    section: str | None
    page_start: int | None
    page_end: int | None
    text: str
    score: float = 0.0
    tokens: int = 0  # generator tokens of the whole numbered block
    kind: str = "text"  # ingest's kind: "text" | "table" | "comment" (a reviewer's comment, not contract text)
    changes: list = field(default_factory=list)  # unaccepted tracked changes (ragkit.ingest.changes.TrackedChange)
    excerpt: bool = False  # the chunk's units on the question, not its whole text (ragkit.retrieve.packing)

    @property
    def page(self) -> int | None:
        return self.page_start

    def location(self) -> str:
        return format_location(self.page_start, self.section, self.page_end) or "(no page or section)"

    def to_json(self) -> dict[str, Any]:
        return {
            "n": self.n,
            "doc": self.doc,
            "page": self.page_start,
            "page_end": self.page_end,
            "section": self.section,
            "chunk_id": self.chunk_id,
            "score": round(self.score, 4),
            "text": self.text,
            "tokens": self.tokens,
            "kind": self.kind,
            "tracked_changes": [c.to_json() for c in self.changes],
            "excerpt": self.excerpt,
        }

    def notes_for(self, quote: str) -> list[str]:
        """What a reader must know of this source besides the words quoted from it: that it
        is a reviewer's comment, not contract text; the unaccepted tracked changes the
        quote shows or stands beside ("“five (5)”: inserted by Counsel on 2026-12-01, not
        yet accepted")."""
        notes = ["a reviewer's comment, not contract text"] if self.kind == "comment" else []
        return notes + [t.describe() for t in tracked.touching(self.changes, quote)]

    def changes_note(self) -> str:
        """What the prompt tells the model of the source's unaccepted tracked changes (the
        text it shows is the document with every change accepted): empty when none."""
        if not self.changes:
            return ""
        return "(Tracked changes not yet accepted: " + "; ".join(c.describe() for c in self.changes) + ".)"


@dataclass
class Prompt:
    ids: list[int]
    text: str
    contexts: list[Context]
    n_ctx: int
    max_tokens: int
    prefix_tokens: int  # tokens before the question: reusable from the KV cache
    mode: str  # "whole" (every section of the selected documents) | "retrieved"
    budget: int  # tokens available to sources
    dropped: int = 0  # candidate sections that did not fit
    segments: list[tuple[str, bool]] = field(default_factory=list)  # (text, special) in order
    best_similarity: float | None = None  # cosine of the best source to the question (dense modes)


class PromptBuilder:
    def __init__(self, generator, *, n_ctx: int, max_tokens: int):
        self.gen = generator
        self.n_ctx = n_ctx
        self.max_tokens = max_tokens
        self.pre, self.mid, self.post = render_chat_parts(generator.chat_template)
        self.system = read_prompt("system.txt").strip()
        user = read_prompt("user.txt")
        if user.count("{contexts}") != 1 or user.count("{question}") != 1 or user.index("{contexts}") > user.index("{question}"):
            raise UsageError("prompts/user.txt must contain {contexts} once, then {question} once")
        self.user_head, rest = user.split("{contexts}")
        self.user_mid, self.user_tail = rest.split("{question}")
        self.user_tail = self.user_tail.rstrip("\n")
        self.block_tmpl = read_prompt("context.txt")

    # ------------------------------------------------------------ pieces

    def _tok(self, text: str, special: bool, add_bos: bool = False) -> list[int]:
        return self.gen.tokenize(text, special=special, add_bos=add_bos)

    def block_text(self, ctx: Context, first: bool) -> str:
        text = ctx.text.strip()
        note = ctx.changes_note()
        if note:
            text = f"{text}\n{note}"
        location = ctx.location() + (" | a reviewer's comment, not contract text" if ctx.kind == "comment" else "")
        body = self.block_tmpl.format(n=ctx.n, doc=ctx.doc, location=location, text=text)
        return body if first else "\n\n" + body

    @staticmethod
    def context_segment(context: str | None) -> list[tuple[str, bool]]:
        """The earlier turns as one plain-text segment (none when there are none)."""
        return [(CONTEXT_HEAD + context.strip(), False)] if context and context.strip() else []

    def context_tokens(self, context: str | None) -> int:
        return sum(len(self._tok(t, s)) for t, s in self.context_segment(context))

    def fixed_segments(self, question: str, context: str | None = None) -> tuple[list[tuple[str, bool]], list[tuple[str, bool]]]:
        head = [(self.pre, True), (self.system, False), (self.mid, True), (self.user_head, False)]
        tail = self.context_segment(context) + [
            (self.user_mid, False), (question.strip(), False), (self.user_tail, False), (self.post, True)]
        return head, tail

    def budget_for(self, question: str, context: str | None = None, reserve: int = 0) -> int:
        """Tokens left for sources. `reserve` tokens are set aside for `context` whether or
        not it is given (or shorter), so a first question and its follow-ups pack the same
        sources; a longer context takes what it needs."""
        head, tail = self.fixed_segments(question, context)
        fixed = sum(len(self._tok(t, s, add_bos=(i == 0))) for i, (t, s) in enumerate(head))
        fixed += sum(len(self._tok(t, s)) for t, s in tail)
        return self.n_ctx - self.max_tokens - fixed - max(0, reserve - self.context_tokens(context))

    # ------------------------------------------------------------ build

    def build(self, question: str, candidates: list[Hit], *, whole: list[Hit] | None = None, doc_order: list[str] | None = None,
              context: str | None = None, reserve: int = 0, whole_max: int | None = None,
              numbers: dict[str, int] | None = None) -> Prompt:
        """Pack sources into the budget. `candidates` are ranked best first. `whole`, when
        given, is every chunk of the selected documents in document order: if all of it
        fits, it goes in whole (stable prefix), else the best candidates are packed.
        `context` (earlier turns of a conversation) goes after the sources, before the
        question; `reserve` tokens are kept for it (see `budget_for`). `whole_max`: the
        whole documents go in only when they cost at most this many tokens. `numbers`: chunk
        id -> the source number it keeps (a part of a prompt, cited as the whole one is)."""
        if not question.strip():
            raise UsageError("the question is empty")
        budget = self.budget_for(question, context, reserve)
        if budget <= 0:
            what = "the question, earlier turns and prompt template" if context and context.strip() else "the question and prompt template"
            raise BudgetExceeded(
                f"{what} alone need {self.n_ctx - self.max_tokens - budget} tokens, "
                f"over n_ctx {self.n_ctx} - max_tokens {self.max_tokens}",
                hint="shorten the question or raise generator.n_ctx",
            )
        order = {d: i for i, d in enumerate(doc_order or [])}
        ranked = {h.id: h.score for h in candidates}  # whole-document sources keep their retrieval score

        def ctx_of(h: Hit) -> Context:
            m = h.meta
            return Context(
                n=0, doc=m.get("doc_name", "?"), doc_id=m.get("doc_id", ""), chunk_id=h.id,
                chunk_index=int(m.get("chunk_index", 0)), section=m.get("section") or None,
                page_start=m.get("page_start"), page_end=m.get("page_end"), text=h.text, score=ranked.get(h.id, h.score),
                kind=m.get("kind") or "text", changes=tracked.loads(m.get("changes")), excerpt=bool(m.get("excerpt")),
            )

        def sort_key(c: Context):
            return (order.get(c.doc_id, len(order)), c.doc, c.doc_id, c.chunk_index)

        def cost(c: Context) -> int:
            # an upper bound: the widest number and the separator, so a block never grows
            # when it is renumbered or moved to the front
            c.n = 99999
            return len(self._tok(self.block_text(c, False), False))

        mode = "retrieved"
        chosen: list[Context] = []
        dropped = 0
        if whole:
            all_ctx = sorted((ctx_of(h) for h in whole), key=sort_key)
            total = sum(cost(c) for c in all_ctx)
            if total <= budget and (whole_max is None or total <= whole_max):
                chosen, mode = all_ctx, "whole"
        if mode == "retrieved":
            used = 0
            seen: set[str] = set()
            for h in candidates:
                if h.id in seen:
                    continue
                seen.add(h.id)
                c = ctx_of(h)
                need = cost(c)
                if used + need <= budget:
                    chosen.append(c)
                    used += need
                else:
                    dropped += 1
            if not chosen and candidates:
                c = self._truncate_to(ctx_of(candidates[0]), budget)
                if c is not None:
                    chosen.append(c)
            chosen.sort(key=sort_key)
        while True:
            for i, c in enumerate(chosen, 1):
                c.n = numbers.get(c.chunk_id, i) if numbers else i
            prompt = self._assemble(question, chosen, budget, mode, dropped, context)
            if len(prompt.ids) + self.max_tokens <= self.n_ctx or not chosen:
                return prompt
            # never expected (costs are upper bounds), but never send an over-budget prompt
            worst = min(range(len(chosen)), key=lambda i: chosen[i].score)
            chosen.pop(worst)
            dropped += 1
            mode = "retrieved"

    def _truncate_to(self, c: Context, budget: int) -> Context | None:
        """Cut one oversized source at a word boundary so it fits (tiny n_ctx)."""
        words = c.text.split(" ")
        lo, hi, best = 1, len(words), 0
        while lo <= hi:
            mid = (lo + hi) // 2
            c.text = " ".join(words[:mid]) + " …"
            c.n = 99999
            if len(self._tok(self.block_text(c, True), False)) <= budget:
                best, lo = mid, mid + 1
            else:
                hi = mid - 1
        if best == 0:
            return None
        c.text = " ".join(words[:best]) + " …"
        return c

    def _assemble(self, question: str, contexts: list[Context], budget: int, mode: str, dropped: int,
                  context: str | None = None) -> Prompt:
        head, tail = self.fixed_segments(question, context)
        segments = list(head)
        for i, c in enumerate(contexts):
            segments.append((self.block_text(c, i == 0), False))
        # + user_mid: the question starts after it; earlier turns, when given, come first
        prefix_segments = len(segments) + (0 if self.context_segment(context) else 1)
        segments.extend(tail)
        ids: list[int] = []
        prefix_tokens = 0
        for i, (text, special) in enumerate(segments):
            toks = self._tok(text, special, add_bos=(i == 0))
            if i > len(head) - 1 and i < len(head) + len(contexts):
                contexts[i - len(head)].tokens = len(toks)
            ids.extend(toks)
            if i == prefix_segments - 1:
                prefix_tokens = len(ids)
        return Prompt(
            ids=ids,
            text="".join(t for t, _ in segments),
            contexts=contexts,
            n_ctx=self.n_ctx,
            max_tokens=self.max_tokens,
            prefix_tokens=prefix_tokens,
            mode=mode,
            budget=budget,
            dropped=dropped,
            segments=segments,
        )
