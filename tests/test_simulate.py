"""`ragkit doctor --simulate`: real-width Kimi K2 slices, written block by block, loaded
through ragkit's own llama.cpp path, measured, projected. Everything here runs on the real
path (llama-cpp-python loads and evaluates every file written); sizes are reduced where a
test must run in seconds, the layout rules are checked at Kimi K2's real width."""

from __future__ import annotations

from pathlib import Path

import pytest
from fixtures.tiny_kimi import HPARAMS, build_tiny_kimi
from typer.testing import CliRunner

from ragkit.cli import app
from ragkit.config import load_settings
from ragkit.doctor import simulate as S
from ragkit.errors import UsageError
from ragkit.generate.gguf_files import read_header

# the tiny fixture's sizes, in the simulator's terms (the fixture mirrors the tensor
# names and shapes llama.cpp's convert_hf_to_gguf.py writes for Kimi K2)
TINY = dict(S.KIMI_K2, n_vocab=HPARAMS["n_vocab"], n_embd=HPARAMS["n_embd"], n_ff=HPARAMS["n_ff"],
            n_ff_exp=HPARAMS["n_ff_exp"], n_head=HPARAMS["n_head"], q_lora_rank=HPARAMS["q_lora_rank"],
            kv_lora_rank=HPARAMS["kv_lora_rank"], qk_rope=HPARAMS["qk_rope"], qk_nope=HPARAMS["qk_nope"],
            v_head=HPARAMS["v_head"], n_expert=HPARAMS["n_expert"], n_expert_used=HPARAMS["n_expert_used"], n_layer=3)
F16_MIX = {k: "F16" for k in S.QUANT_MIXES["UD-TQ1_0"]["mix"]}

# every row length a multiple of 256, so every K/IQ type of the published mixes applies
SMALL256 = dict(S.KIMI_K2, n_vocab=2048, n_embd=512, n_ff=1024, n_ff_exp=256, n_head=4, q_lora_rank=256,
                kv_lora_rank=256, qk_rope=32, qk_nope=32, v_head=64, n_expert=8, n_expert_used=2, n_layer=4)


def _settings(tmp_path: Path, **gen):
    return load_settings(cache_dir=tmp_path / "cache", generator={"n_threads": 2, **gen})


def test_the_layout_at_real_width_follows_the_published_config():
    specs = {t.name: t for t in S.model_tensors(S.KIMI_K2, S.QUANT_MIXES["UD-TQ1_0"]["mix"], 1, 1)}
    k = S.KIMI_K2
    assert (k["n_embd"], k["n_expert"], k["n_ff_exp"], k["n_vocab"], k["n_layer"]) == (7168, 384, 2048, 163840, 61)
    # ggml order: row length first
    assert specs["token_embd.weight"].shape == (7168, 163840)
    assert specs["output.weight"].shape == (7168, 163840)
    assert specs["blk.0.ffn_up.weight"].shape == (7168, 18432)
    assert specs["blk.1.ffn_up_exps.weight"].shape == (7168, 2048, 384)
    assert specs["blk.1.ffn_down_exps.weight"].shape == (2048, 7168, 384)
    assert specs["blk.1.ffn_gate_shexp.weight"].shape == (7168, 2048)
    assert specs["blk.1.attn_q_b.weight"].shape == (1536, 64 * (128 + 64))
    assert specs["blk.1.attn_kv_a_mqa.weight"].shape == (7168, 512 + 64)
    assert specs["blk.1.attn_k_b.weight"].shape == (128, 512, 64)
    assert specs["blk.1.attn_v_b.weight"].shape == (512, 128, 64)
    assert specs["blk.1.attn_output.weight"].shape == (64 * 128, 7168)
    assert "blk.0.ffn_up_exps.weight" not in specs  # the first layer is dense
    # one MoE layer's routed experts at UD-TQ1_0: 3 x 384 x 2048 x 7168 weights
    exps = sum(S.tensor_bytes(specs[f"blk.1.{n}"]) for n in S.EXPS)
    assert exps == 2 * (7168 * 2048 * 384 // 256 * 54) + 2048 * 7168 * 384 // 256 * 66


@pytest.mark.parametrize("quant", sorted(S.QUANT_MIXES))
def test_the_type_mixes_give_the_published_sizes(quant):
    est = S.estimate_bytes(S.KIMI_K2, S.QUANT_MIXES[quant]["mix"])
    published = S.QUANT_MIXES[quant]["published_gb"] * 1e9
    assert abs(est - published) / published < 0.10, (quant, est / 1e9)


def test_names_and_shapes_match_the_converter_layout(tmp_path):
    fixture = build_tiny_kimi(tmp_path / "fixture", n_shards=1)
    ours = S.write_model(tmp_path / "ours.gguf", TINY, F16_MIX, 1, 2)
    want = {t.name: t.shape for t in read_header(fixture).tensors}
    got = {t.name: t.shape for t in read_header(ours).tensors}
    assert got == want
    mix = S.mix_from_shards(fixture)  # the user's own shards: types read from the headers
    assert mix["ffn_up_exps.weight"] == "F16" and mix["attn_norm.weight"] == "F32"


def test_every_published_type_writes_valid_blocks_that_llama_cpp_runs(tmp_path):
    """Random quant bits with finite fp16 scales: llama.cpp loads the file, and the logits
    after a prompt are finite (a NaN or inf scale would poison them)."""
    import numpy as np

    from ragkit.generate.llama import LlamaCppGenerator

    types = sorted({t for q in S.QUANT_MIXES.values() for t in q["mix"].values()})
    assert {"TQ1_0", "IQ1_M", "IQ2_XXS", "Q2_K", "Q3_K"} <= set(types)
    cfg = _settings(tmp_path, n_ctx=256, chat_template="kimi-k2").generator
    for quant, q in S.QUANT_MIXES.items():
        path = S.write_model(tmp_path / f"{quant}.gguf", SMALL256, q["mix"], 1, 1, seed=3)
        hdr = {t.name: t.ggml_type for t in read_header(path).tensors}
        import gguf

        assert gguf.GGMLQuantizationType(hdr["blk.1.ffn_up_exps.weight"]).name == q["mix"]["ffn_up_exps.weight"]
        assert gguf.GGMLQuantizationType(hdr["blk.1.ffn_down_exps.weight"]).name == q["mix"]["ffn_down_exps.weight"]
        gen = LlamaCppGenerator(path, cfg)
        try:
            import llama_cpp

            gen.llm.eval(list(range(10, 74)))
            ptr = llama_cpp.llama_get_logits_ith(gen.llm._ctx.ctx, -1)  # the last token's logits
            logits = np.ctypeslib.as_array(ptr, shape=(SMALL256["n_vocab"],)).copy()
            assert logits.shape == (SMALL256["n_vocab"],) and np.isfinite(logits).all(), quant
            assert float(np.abs(logits).max()) > 0.0, quant
        finally:
            gen.llm.close()


def test_a_slice_that_does_not_fit_is_refused_before_anything_is_written(tmp_path, monkeypatch):
    # stand-in for the host's memory reading only (ragkit.doctor.fit.ram): 1 GiB free
    import ragkit.doctor.fit as doctor

    monkeypatch.setattr(doctor, "ram", lambda *a, **k: (2 << 30, 1 << 30, None, "test"))
    settings = _settings(tmp_path)
    with pytest.raises(UsageError) as info:
        S.simulate(settings, quant="UD-Q2_K_XL")
    assert "does not fit" in str(info.value)
    d = S.slice_dir(settings)
    assert not d.exists() or not any(d.iterdir())


def test_simulate_measures_slices_and_projects_the_whole_model(tmp_path):
    settings = _settings(tmp_path)
    sim = S.simulate(settings, dims=SMALL256, quant="UD-TQ1_0", lengths=[64, 256], decode_tokens=8)
    j = sim.to_json()
    assert set(j["measured"]) == {"base", "one_moe"}
    base, one = j["measured"]["base"], j["measured"]["one_moe"]
    n_moe = SMALL256["n_layer"] - 1
    assert j["projection"]["moe_layers"] == n_moe
    for p in ("64", "256"):
        whole = base["prefill_s"][p] + n_moe * max(one["prefill_s"][p] - base["prefill_s"][p], 0.0)
        assert j["projection"]["prefill_tok_s"][p] == pytest.approx(int(p) / whole, rel=0.02)
    assert all(Path(s["path"]).exists() for s in j["slices"].values())
    assert j["projection"]["ttft_extrapolated"] == [k for k, n in S.TYPICAL_PROMPTS.items() if n > 256]
    ttft = j["projection"]["ttft_s"]
    assert list(ttft) == list(S.TYPICAL_PROMPTS) and ttft["whole document 32K"] > ttft["whole document 16K"] > 0
    # reused, not rebuilt, the second time
    again = S.simulate(settings, dims=SMALL256, quant="UD-TQ1_0", lengths=[64], decode_tokens=2)
    assert not any(s["built"] for s in again.slices.values())
    assert S.clean(settings) > 0 and not S.slice_dir(settings).exists()


def test_validation_reports_the_error_of_its_own_figures(tmp_path):
    """The rule T = T(base) + n x (T(base + 1 MoE) - T(base)) against a whole random model
    (here 1 dense + 3 MoE layers at a small width, so it runs in seconds). How close the
    projection comes is a speed figure, so it lives in a benchmark
    (`eval/bench_simulate.py`, `ragkit doctor --simulate --validate`), never in the suite:
    a busy machine moves it. What is checked here is that the error reported is the error
    of the figures reported beside it, and that the whole model was really measured."""
    dims = dict(SMALL256, n_dense=1)
    check = S.validate(_settings(tmp_path), tmp_path / "v", dims=dims, lengths=[64, 128], decode_tokens=4, repeats=1)
    errs, whole, proj = check["relative_error"], check["measured_whole_s"], check["projected_s"]
    assert set(errs) == {"prefill_64", "prefill_128", "decode"}
    assert all(whole[k] > 0 and proj[k] > 0 for k in ("prefill_64", "prefill_128"))
    # each figure is rounded (4 decimals for prefill seconds, 5 for decode, 3 for the error):
    # the recomputed error may differ by what that rounding allows, no more
    for k, half_ulp in (("prefill_64", 5e-5), ("prefill_128", 5e-5), ("decode_per_token", 5e-6)):
        e = errs["decode" if k == "decode_per_token" else k]
        tol = 5e-4 + half_ulp * (1 + proj[k] / whole[k]) / whole[k] + 1e-9
        assert e == pytest.approx((proj[k] - whole[k]) / whole[k], abs=tol), (k, check)
    assert check["dims"]["n_layer"] == dims["n_layer"]


def test_cli_usage_errors_and_clean(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    runner = CliRunner()
    res = runner.invoke(app, ["doctor", "--simulate", "--lengths", "ten", "--json"])
    assert res.exit_code == 2 and "--lengths" in res.output
    res = runner.invoke(app, ["doctor", "--simulate", "--quant", "Q9_X", "--json"])
    assert res.exit_code == 2 and "unknown quant" in res.output
    (tmp_path / "xdg" / "ragkit" / "simulate").mkdir(parents=True)
    (tmp_path / "xdg" / "ragkit" / "simulate" / "slice-x.gguf").write_bytes(b"x" * 1000)
    res = runner.invoke(app, ["doctor", "--simulate", "--clean", "--json"])
    assert res.exit_code == 0 and '"removed_bytes": 1000' in res.output
    assert not (tmp_path / "xdg" / "ragkit" / "simulate").exists()
