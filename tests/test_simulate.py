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


def test_validation_measures_the_whole_model_beside_its_slices(tmp_path):
    """The rule T = T(base) + n x (T(base + 1 MoE) - T(base)) against a whole random model
    (here 1 dense + 3 MoE layers at a small width, so it runs in seconds). How close the
    projection comes is a speed figure, so it lives in a benchmark
    (`eval/bench_simulate.py`, `ragkit doctor --simulate --validate`), never in the suite:
    a busy machine moves it. Checked here on the real path: the three models written are
    the base (1 layer), the base with one MoE layer (2) and the whole model (4), all three
    loaded and timed, and a prompt twice as long takes the whole model longer."""
    dims = dict(SMALL256, n_dense=1)
    out = tmp_path / "v"
    check = S.validate(_settings(tmp_path), out, dims=dims, lengths=[64, 128], decode_tokens=4, repeats=1)
    written = sorted(out.glob("validate-*.gguf"))
    assert sorted(read_header(f).key("block_count") for f in written) == [1, 2, dims["n_layer"]]
    assert sorted(read_header(f).key("leading_dense_block_count") for f in written) == [1, 1, 1]
    assert check["dims"]["n_layer"] == dims["n_layer"]
    whole, proj = check["measured_whole_s"], check["projected_s"]
    assert set(check["relative_error"]) == {"prefill_64", "prefill_128", "decode"}
    assert all(whole[k] > 0 and proj[k] > 0 for k in ("prefill_64", "prefill_128", "decode_per_token"))
    assert whole["prefill_128"] > whole["prefill_64"], whole


def test_validation_error_is_the_projection_against_the_whole_model(tmp_path, monkeypatch):
    """The arithmetic of `validate` on known timings (the measurement is replaced by fixed
    seconds; the real measurement is the test above): 3 MoE layers, base 1.0 s / 2.0 s
    prefill, base + 1 MoE 1.5 s / 3.0 s, so the projection is 1.0 + 3 x 0.5 = 2.5 s and
    2.0 + 3 x 1.0 = 5.0 s against the whole model's 2.0 s and 5.5 s: errors +0.25 and
    -0.5 / 5.5 = -0.091. Decode: 0.01 + 3 x 0.01 = 0.04 s a token against 0.05 s: -0.2. A
    slice that times faster than the base adds nothing (never a negative layer)."""
    import ragkit.doctor.validation as V
    from ragkit.doctor.timing import Timing

    def timings(base_pre, one_pre, whole_pre, base_dec, one_dec, whole_dec):
        def fake(paths, cfg, lengths, decode_tokens, *, repeats=2, seed=0):
            assert set(paths) == {"base", "one_moe", "whole"} and lengths == [64, 128]
            return {"base": Timing(dict(zip(lengths, base_pre)), base_dec),
                    "one_moe": Timing(dict(zip(lengths, one_pre)), one_dec),
                    "whole": Timing(dict(zip(lengths, whole_pre)), whole_dec)}
        monkeypatch.setattr(V, "measure_many", fake)

    dims = dict(SMALL256, n_dense=1)  # n_layer 4: 3 MoE layers
    timings((1.0, 2.0), (1.5, 3.0), (2.0, 5.5), 0.01, 0.02, 0.05)
    check = S.validate(_settings(tmp_path), tmp_path / "v", dims=dims, lengths=[128, 64], decode_tokens=4, repeats=1)
    assert check["projected_s"] == {"prefill_64": 2.5, "prefill_128": 5.0, "decode_per_token": 0.04}
    assert check["measured_whole_s"] == {"prefill_64": 2.0, "prefill_128": 5.5, "decode_per_token": 0.05}
    assert check["relative_error"] == {"prefill_64": 0.25, "prefill_128": -0.091, "decode": -0.2}
    # one MoE layer timed faster than none (noise): the projection is the base alone
    timings((1.0, 2.0), (0.9, 1.8), (2.0, 4.0), 0.01, 0.008, 0.04)
    check = S.validate(_settings(tmp_path), tmp_path / "v", dims=dims, lengths=[64, 128], decode_tokens=4, repeats=1)
    assert check["projected_s"] == {"prefill_64": 1.0, "prefill_128": 2.0, "decode_per_token": 0.01}
    assert check["relative_error"] == {"prefill_64": -0.5, "prefill_128": -0.5, "decode": -0.75}


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
