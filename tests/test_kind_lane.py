"""The kind lane (ragkit/retrieve/kinds.py): a question that asks for a clause kind the kinds
model knows (`cuad-kinds`: CUAD's 41) gets the chunks of the named contract the model rates
highest for that kind in the cross-encoder's pool, read from every chunk's stored vector, and
their order fused with the others. On the real path: a CUAD contract that trained and chose
nothing (cuad-train, kept out of every model by sets/cuad-review-split.json), the real store,
embedder, kinds model and cross-encoder."""

from __future__ import annotations

import pytest
from conftest import ROOT, SHARED, make_settings

DOC = "ElPolloLocoHoldingsInc_20200306_10-K_EX-10.16_12041700_EX-10.16_Development Agreement.txt"
ITEM = "cuadkept-elpollolocoholdingsinc-20200306-10-k-ex-exclusivity"


def _with(settings, **retrieve):
    return settings.model_copy(update={"retrieve": settings.retrieve.model_copy(update=retrieve)})


@pytest.fixture(scope="module")
def pollo(tmp_path_factory):
    """El Pollo Loco's development agreement (120 chunks) ingested once into a real store."""
    from ragkit.ingest import ingest

    src = SHARED / "cuad-train" / "txt" / DOC
    if not src.exists():
        pytest.skip(f"needs the shared corpora ({src})")
    settings = make_settings(tmp_path_factory.mktemp("pollo") / "store")
    rep = ingest([src], settings)
    assert not rep.failed
    return settings


def test_a_clause_the_first_stage_misses_reaches_the_prompt_first_through_the_kind_lane(pollo):
    """CUAD's exclusivity question on this contract: without the lane the gold clause is not
    in the first stage's top 10 (the cross-encoder's pool) nor in the prompt; with it (the
    default) the kinds model, reading every chunk's vector, puts it in the pool and it is the
    prompt's best-ranked source."""
    from ragkit.eval.metrics_text import evidence_in_text_strict
    from ragkit.eval.sets import load_set
    from ragkit.retrieve import retrieve
    from ragkit.session import Session

    (item,) = [i for i in load_set(ROOT / "eval/sets/cuad-kept-tune.jsonl") if i.id == ITEM]
    assert pollo.retrieve.kinds_lane > 0 and pollo.retrieve.kinds_model == "cuad-kinds"
    session = Session(pollo)
    gold = {h.id for h in session.store.chunks([d.doc_id for d in session.store.documents()])
            if evidence_in_text_strict(item.evidence, h.text)}
    assert len(gold) == 1

    def best_first(r):
        return [c.chunk_id for c in sorted(r.prompt.contexts, key=lambda c: (-c.score, c.n))]

    off = retrieve(item.question, session.with_settings(_with(pollo, kinds_lane=0)), docs=[DOC])
    assert not gold & set(off.orders["first_stage"][:10]) and not gold & set(best_first(off))
    assert "kinds" not in off.orders

    on = retrieve(item.question, session, docs=[DOC])
    assert gold & set(on.orders["kinds"]) and on.rerank.pool > pollo.retrieve.rerank_pool
    assert best_first(on)[0] in gold, best_first(on)
    session.close()


def test_a_lawyers_question_finds_its_kind_and_other_questions_fire_nothing(pollo):
    """The question is matched to a kind by meaning (its vector against each kind's text in the
    model's kinds.json), so a lawyer's own words reach the lane; an NDA's or a filing's
    question stays under the similarity the lane needs and gets no lane."""
    from ragkit.retrieve.kinds import kind_asked, session_kinds_model
    from ragkit.session import Session

    session = Session(pollo)
    model = session_kinds_model(session)
    assert model is not None and len(model.texts) == 41
    floor = pollo.retrieve.kinds_min_similarity

    def asked(q: str):
        return kind_asked(model, session.embedder.embed_query(q), session)

    for q, kind in [("Which state's law governs this contract?", "governing-law"),
                    ("Is there a cap on either party's liability?", "cap-on-liability"),
                    ("Can a party terminate the agreement without cause?", "termination-for-convenience"),
                    ("Is the source code held in escrow?", "source-code-escrow")]:
        got, similarity = asked(q)
        assert got == kind and similarity >= floor, (q, got, similarity)
    for q in ("What was Verizon's capital expenditure in FY2022?",
              "Does the agreement state that Receiving Party shall not reverse engineer any objects?"):
        assert asked(q)[1] < floor, q
    session.close()


def test_the_lane_reads_only_vectors_of_the_models_own_embedder(tmp_path):
    """A store embedded by another model (here the hash embedder, a fake with no meaning: the
    lane's guard is what is tested) gets no lane: the kinds model's weights read MiniLM's
    space only."""
    from ragkit.config import load_settings
    from ragkit.ingest import ingest
    from ragkit.retrieve import retrieve

    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.md").write_text("# Governing Law\n\nThis Agreement is governed by the laws of Delaware.\n\n"
                               "# Term\n\nThis Agreement lasts two years.\n", encoding="utf-8")
    s = load_settings(store=tmp_path / "store", embed={"backend": "hash"},
                      retrieve={"kinds_lane": 3, "kinds_min_similarity": -1.0},  # any question would fire
                      generator={"n_ctx": 2048})
    assert not ingest([docs / "a.md"], s).failed
    r = retrieve("Which part of this contract concerns Governing Law? Quote it.", s, docs=["a.md"])
    assert "kinds" not in r.orders


def test_fuse_lane_adds_the_lanes_reciprocal_rank():
    from ragkit.retrieve.rerank import fuse_lane
    from ragkit.store import Hit

    ranked = [Hit(id=i, text=i, meta={}, score=s) for i, s in (("a", 0.05), ("b", 0.04), ("c", 0.03))]
    out = fuse_lane(ranked, ["c", "b"], 1.0, k=60)  # b 0.04 + 1/62, a 0.05, c 0.03 + 1/61
    assert [h.id for h in out] == ["b", "a", "c"]
    assert out[0].score == pytest.approx(0.04 + 1 / 62) and out[1].score == 0.05
    assert out[2].score == pytest.approx(0.03 + 1 / 61)
    assert [h.id for h in fuse_lane(ranked, ["c"], 0.0)] == ["a", "b", "c"]


def test_the_shipped_kinds_texts_are_what_tune_kinds_writes():
    """Each kind's text in the shipped kinds.json is `ragkit tune kinds`'s (its title and
    CUAD's description of it), so a retrained model matches questions the same way."""
    import json

    from ragkit.tune.kinds import kind_texts

    shipped = json.loads((ROOT / "ragkit/models_data/cuad-kinds/kinds.json").read_text(encoding="utf-8"))
    assert shipped["texts"] == {k: kind_texts()[k] for k in shipped["kinds"]}
    assert shipped["texts"]["governing-law"].startswith("Governing Law: Which state")
