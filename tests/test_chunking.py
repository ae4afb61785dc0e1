"""chunk_sections never hands the embedder more than its limit and never drops text, on
random documents: CJK without spaces, mixed scripts, very long words and URLs, very long
headings and deep section paths. Token counts are the real MiniLM tokenizer's."""

from __future__ import annotations

import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ragkit.ingest.blocks import Block, Chunk
from ragkit.ingest.sections import build_sections, chunk_sections


@pytest.fixture(scope="module")
def embedder():
    from ragkit.config import load_settings
    from ragkit.embed import load_embedder

    return load_embedder(load_settings())


def _nows(s: str) -> str:
    return re.sub(r"\s+", "", s)


_CJK = st.text(st.characters(min_codepoint=0x4E00, max_codepoint=0x9FFF), min_size=1, max_size=40)
_KANA = st.text(st.characters(min_codepoint=0x3041, max_codepoint=0x30FF), min_size=1, max_size=20)
_LATIN = st.text(st.sampled_from("abcdefghijklmnopqrstuvwxyzABCDEFGHIJ0123456789éüß"), min_size=1, max_size=12)
_CYRILLIC_ARABIC = st.text(st.characters(min_codepoint=0x0410, max_codepoint=0x044F) | st.characters(min_codepoint=0x0627, max_codepoint=0x064A), min_size=1, max_size=12)
_LONG_WORD = st.text(st.sampled_from("abcdefghijklmnopqrstuvwxyz0123456789"), min_size=150, max_size=900)
_URL = st.builds(
    lambda host, segs, q: f"https://{host}.example.com/" + "/".join(segs) + "?q=" + q,
    _LATIN, st.lists(_LATIN, min_size=5, max_size=80), _LONG_WORD,
)
_PUNCT = st.sampled_from([" ", " ", " ", "  ", "\n", ". ", "。", "，", "；", "! ", ", ", "-", "/", "(a) "])
_WORD = st.one_of(_LATIN, _LATIN, _CJK, _CJK, _KANA, _CYRILLIC_ARABIC, _LONG_WORD, _URL)


@st.composite
def _text(draw, max_words: int) -> str:
    parts = draw(st.lists(st.tuples(_WORD, _PUNCT), min_size=1, max_size=max_words))
    text = "".join(w + p for w, p in parts)
    if draw(st.booleans()):  # a long run of Chinese with no space or punctuation at all
        text += draw(st.text(st.characters(min_codepoint=0x4E00, max_codepoint=0x9FFF), min_size=0, max_size=1500))
    return text if text.strip() else "x"


_HEADING = st.one_of(
    _text(4),  # short
    _text(60),  # very long headings
    st.builds(lambda n, t: f"{n}. {t}", st.integers(1, 99), _text(8)),
    st.text(st.characters(min_codepoint=0x4E00, max_codepoint=0x9FFF), min_size=200, max_size=800),
)


@st.composite
def _document(draw) -> list[Block]:
    blocks: list[Block] = []
    for _ in range(draw(st.integers(1, 7))):
        if draw(st.integers(0, 2)) == 0:
            blocks.append(Block(" ".join(draw(_HEADING).split()), kind="heading", level=draw(st.integers(1, 6))))
        else:
            blocks.append(Block(draw(_text(120))))
    if all(b.kind == "heading" for b in blocks):
        blocks.append(Block(draw(_text(20))))
    return blocks


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large])
@given(blocks=_document(), limit=st.sampled_from([16, 48, 128, 254]), min_tokens=st.sampled_from([0, 20, 40]))
def test_no_chunk_exceeds_the_limit_and_no_text_is_lost(embedder, blocks, limit, min_tokens):
    limit = min(limit, embedder.max_tokens)
    sections = build_sections(blocks)
    chunks = chunk_sections(sections, embedder.count_tokens, limit, min_tokens)
    real = embedder.count_tokens([c.embed_text() for c in chunks])
    assert all(n <= limit for n in real), [(n, c.embed_text()[:80]) for n, c in zip(real, chunks) if n > limit]
    assert [c.tokens for c in chunks] == real  # the recorded count is the real one
    # every character of the sections' text is in some chunk, in order (whitespace aside)
    assert "".join(_nows(c.text) for c in chunks) == "".join(_nows(b.text) for s in sections for b in s.blocks)
    # the full path stays in the metadata; what is embedded starts with it or a shortened form
    paths = {s.path_str for s in sections}
    for c in chunks:
        assert c.section in paths
        assert c.text.strip()
        if c.embed_section is not None:  # shortened: headings elided in front or the title cut
            assert c.embed_section == "" or c.embed_section.startswith("… > ") or c.embed_section.endswith("…")


@pytest.mark.parametrize("shape", ["deep", "one long Chinese title"])
def test_a_long_section_path_leaves_the_body_room(embedder, shape):
    """A path over the whole limit: the embedded path is shortened to a quarter of it, the
    stored one is whole, and the body still gets the rest of each chunk."""
    if shape == "deep":  # 16 nested headings (each title is cut to six words by build_sections)
        heads = [f"Heading {i} " + " ".join(f"word{i}x{j}" for j in range(40)) for i in range(16)]
    else:  # a Chinese title without punctuation is kept whole as a path component
        heads = ["第一章 " + "保密信息的范围和接收方的义务以及违约责任" * 30]
    body = " ".join(f"Sentence {i} states an obligation of the recipient." for i in range(60))
    blocks = [Block(h, kind="heading", level=i + 1) for i, h in enumerate(heads)] + [Block(body)]
    limit = embedder.max_tokens
    *above, section = build_sections(blocks)
    assert len(section.path) == len(heads)
    # a heading too long to be a title whole keeps its words as text, where it stands
    assert [b.text for s in above for b in s.blocks] == (heads[:-1] if shape == "deep" else [])
    assert embedder.count_tokens([section.path_str])[0] > limit, "the path alone is over the limit"
    chunks = chunk_sections([section], embedder.count_tokens, limit, 40)
    assert all(c.section == section.path_str for c in chunks)  # metadata keeps the full path
    for c in chunks:
        assert embedder.count_tokens([c.embed_text()])[0] <= limit
        assert c.embed_section and c.embed_text().startswith(c.embed_section + "\n")
        assert embedder.count_tokens([c.embed_section])[0] <= limit // 4
    assert " ".join(c.text for c in chunks).count("Sentence ") == 60
    body_tokens = embedder.count_tokens([" ".join(b.text for b in section.blocks)])[0]
    assert len(chunks) <= body_tokens // (limit // 2) + 1, "each chunk carries a real share of the body"
    if shape == "deep":  # the deepest headings are the ones kept
        assert chunks[0].embed_section.startswith("… > ") and "Heading 15" in chunks[0].embed_section
    else:
        assert chunks[0].embed_section.endswith("…") and chunks[0].embed_section.startswith("第一章 保密信息")


def test_chinese_without_spaces_splits_by_characters(embedder):
    text = "本协议所称保密信息是指披露方以任何形式提供的技术信息和经营信息" * 40  # no spaces, no stops
    [section] = build_sections([Block("第一条 保密信息"), Block(text)])
    chunks = chunk_sections([section], embedder.count_tokens, 64, 10)
    assert len(chunks) > 5
    assert all(embedder.count_tokens([c.embed_text()])[0] <= 64 for c in chunks)
    assert "".join(_nows(c.text) for c in chunks) == _nows("第一条 保密信息" + text)


def test_a_table_row_too_long_for_a_chunk_is_split_under_its_header(embedder):
    cjk = "营业收入净利润资产负债" * 120  # one cell, no spaces: about 1,300 tokens
    header = "| Item | 2023 | 2022 |\n|---|---|---|"
    rows = ["| Revenue | " + cjk + " | 5 |", "| Costs | 5 | 7 |"]
    md = header + "\n" + "\n".join(rows)
    chunks = chunk_sections(build_sections([Block(md, kind="table")]), embedder.count_tokens, 96, 10)
    assert len(chunks) > 10
    assert all(embedder.count_tokens([c.embed_text()])[0] <= 96 for c in chunks)
    assert all(c.kind == "table" and c.text.startswith(header + "\n") for c in chunks)
    bodies = "".join(_nows(c.text[len(header) :]) for c in chunks)
    assert bodies == "".join(_nows(r) for r in rows)


def test_a_table_header_too_big_to_repeat_goes_once(embedder):
    header = "| Item | " + " | ".join(f"Period {i} ended December 31" for i in range(30)) + " |\n|---|" + "---|" * 30
    rows = [f"| Line {i} | " + " | ".join(str(i * j) for j in range(30)) + " |" for i in range(12)]
    md = header + "\n" + "\n".join(rows)
    chunks = chunk_sections(build_sections([Block(md, kind="table")]), embedder.count_tokens, 96, 10)
    assert embedder.count_tokens([header])[0] > 96, "the header alone is over the limit"
    assert all(embedder.count_tokens([c.embed_text()])[0] <= 96 for c in chunks)
    assert "".join(_nows(c.text) for c in chunks) == _nows(md)


def test_embed_text_uses_the_shortened_path_only_when_set():
    """A unit test of Chunk.embed_text (no tokenizer involved)."""
    c = Chunk(text="body", section="A > B", page_start=None, page_end=None, char_start=0, char_end=4)
    assert c.embed_text() == "A > B\nbody"
    c.embed_section = "… > B"
    assert c.embed_text() == "… > B\nbody"
    c.embed_section = ""
    assert c.embed_text() == "body"


# Unit tests of the final check with fake tokenizers (each says how it is fake): the real
# MiniLM tokenizer counts joins additively, so it never reaches the re-split path.


def test_final_check_resplits_a_chunk_whose_joins_cost_more_than_planned():
    """Fake tokenizer: one token per word, plus 6 per newline, so pieces joined with
    newlines cost more than the packer's estimate and the final check must re-split."""

    def fake_count(texts):
        return [len(t.split()) + 6 * t.count("\n") for t in texts]

    blocks = [Block("ARTICLE 1 TERMS")] + [Block(" ".join(f"w{b}x{i}" for i in range(5))) for b in range(12)]
    sections = build_sections(blocks)
    chunks = chunk_sections(sections, fake_count, 30, 0)
    assert all(n <= 30 for n in fake_count([c.embed_text() for c in chunks]))
    assert [c.tokens for c in chunks] == fake_count([c.embed_text() for c in chunks])
    assert "".join(_nows(c.text) for c in chunks) == "".join(_nows(b.text) for s in sections for b in s.blocks)


def test_final_check_raises_when_a_chunk_cannot_fit():
    """Fake tokenizer that prices any text holding a newline far over every limit: the
    embedded text (path, newline, body) can never fit, and the chunker says so instead of
    returning an over-limit chunk (a real check, not an assert that python -O removes)."""
    from ragkit.ingest.sections import ChunkingError

    def fake_count(texts):
        return [10**6 if "\n" in t else len(t.split()) for t in texts]

    with pytest.raises(ChunkingError):
        chunk_sections(build_sections([Block("1. Scope"), Block("The recipient keeps it secret.")]), fake_count, 40, 0)
