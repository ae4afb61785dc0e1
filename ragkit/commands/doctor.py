"""`ragkit doctor`: will the generator fit this machine at these settings?"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer


def _human(n: float | None) -> str:
    if n is None:
        return "unknown"
    for unit, size in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if abs(n) >= size:
            return f"{n / size:.1f} {unit}"
    return f"{int(n)} B"


def register(app: typer.Typer) -> None:
    from ragkit.commands._common import JsonOpt, ProfileOpt, err, fail, out, print_json, settings_for

    @app.command()
    def doctor(
        profile: Optional[str] = ProfileOpt,
        model: Optional[str] = typer.Option(None, "--model", help="a GGUF (first shard of a split model) or a registry name; default: the settings'"),
        simulate: bool = typer.Option(False, "--simulate", help="measure Kimi K2's prefill and decode speed here on a real-width slice (one dense + one MoE layer, random weights), projected to the whole model; nothing is downloaded"),
        quant: Optional[str] = typer.Option(None, "--quant", help="with --simulate: the quant you plan to run (UD-TQ1_0, UD-IQ1_S, UD-Q2_K_XL); default UD-TQ1_0"),
        shards: Optional[Path] = typer.Option(None, "--shards", help="with --simulate: the first shard of your Kimi K2 GGUF, to take its exact type mix from the headers"),
        lengths: Optional[str] = typer.Option(None, "--lengths", help="with --simulate: prompt lengths to time, comma-separated (default 256,1024,4096)"),
        validate: bool = typer.Option(False, "--validate", help="with --simulate: also check the projection against a whole random model at a reduced width"),
        clean: bool = typer.Option(False, "--clean", help="with --simulate: remove the slices written under the cache and exit"),
        as_json: bool = JsonOpt,
    ) -> None:
        """Check that the generator fits this machine: sizes from the GGUF headers, where each part goes
        (GPU or CPU RAM) under n_gpu_layers and tensor overrides, the KV cache at n_ctx, and what to change
        when it does not fit. Exits 0 when it fits (or when host RAM cannot be read: verdict "unknown"),
        3 when it does not fit this machine."""
        from ragkit.doctor.fit import DoesNotFit, diagnose
        from ragkit.errors import RagkitError

        if simulate or clean or validate:
            _simulate(profile, quant, shards, lengths, validate, clean, as_json)
            return

        try:
            settings = settings_for(None, profile)
            plan = diagnose(settings, model)
        except RagkitError as exc:
            fail(exc, as_json)
            return
        # README: exit 3 for "a plan that does not fit this machine", as `ask` exits on DoesNotFit
        code = DoesNotFit.exit_code if plan.fits is False else 0
        if as_json:
            print_json(plan.to_json())
            raise typer.Exit(code)
        m, kv, s, h = plan.model, plan.kv_cache, plan.settings, plan.host
        out.print(f"[bold]model[/]  {Path(m['path']).name}  ({m['arch']}, {len(m['shards'])} file(s), {_human(m['file_bytes'])})", highlight=False)
        out.print(f"  weights {_human(m['tensor_bytes'])}: experts {_human(m['expert_bytes'])}, other {_human(m['non_expert_bytes'])}", highlight=False)
        out.print(
            f"  KV cache {_human(kv['bytes'])} at n_ctx {s['n_ctx']} ({s['type_k']}; {_human(kv['bytes_per_token'])} per token"
            + (", MLA latent" if m["is_mla"] else "") + ")",
            highlight=False,
        )
        for dev in ("gpu", "cpu"):
            d = getattr(plan, dev)
            out.print(
                f"  {dev.upper()}: {_human(d['total'])} = weights {_human(d['weights'])} (experts {_human(d['expert_weights'])})"
                f" + KV {_human(d['kv'])} + compute ~{_human(d['compute'])}",
                highlight=False,
            )
        gpus = ", ".join(f"{g['name']} {_human(g['free'])} free of {_human(g['total'])}" for g in h["gpus"]) or "none"
        limit = f" (cgroup limit {_human(h['ram_limit'])})" if h.get("ram_limit") else ""
        out.print(f"[bold]host[/]  RAM {_human(h['ram_available'])} available of {_human(h['ram_total'])}{limit}; GPUs: {gpus}; "
                  f"disk free {_human(h['disk_free'])} at {h['disk_path']}", highlight=False)
        colour = {"fits": "green", "unknown": "yellow"}.get(plan.verdict, "red")
        out.print(f"[bold {colour}]{plan.verdict}[/]", highlight=False)
        for r in plan.reasons:
            out.print(f"  - {r}", highlight=False)
        for r in plan.recommendations:
            out.print(f"  fix: {r['text']}", highlight=False)
        for n in plan.notes:
            err.print(f"  note: {n}", highlight=False)
        raise typer.Exit(code)


def _simulate(profile, quant, shards, lengths, validate, clean, as_json) -> None:
    import tempfile

    from ragkit.commands._common import err, fail, out, print_json, settings_for
    from ragkit.doctor import simulate as sim
    from ragkit.errors import RagkitError, UsageError

    try:
        settings = settings_for(None, profile)
        if clean:
            freed = sim.clean(settings)
            print_json({"removed_bytes": freed}) if as_json else err.print(f"removed {_human(freed)} of slices from {sim.slice_dir(settings)}", highlight=False)
            return
        try:
            lens = [int(x) for x in lengths.split(",")] if lengths else None
        except ValueError:
            raise UsageError(f"--lengths takes comma-separated token counts, not {lengths!r}") from None
        if lens is not None and (not lens or min(lens) < 8 or max(lens) > 32768):
            raise UsageError("--lengths must be token counts between 8 and 32768")
        say = (lambda m: None) if as_json else (lambda m: err.print(f"[dim]{m}[/]", highlight=False))
        result = sim.simulate(settings, quant=quant, shards=shards, lengths=lens, on_progress=say)
        check = None
        if validate:
            say("validating the projection on a whole random model at reduced width")
            with tempfile.TemporaryDirectory(dir=sim.slice_dir(settings)) as tmp:
                check = sim.validate(settings, Path(tmp))
    except RagkitError as exc:
        fail(exc, as_json)
        return
    if as_json:
        print_json({**result.to_json(), "validation": check})
        return
    pj, ms = result.projection, result.measured
    out.print(f"[bold]Kimi K2 {result.quant}[/] on this machine (type mix: {result.mix_source}); "
              f"whole model {_human(pj['model_bytes'])}", highlight=False)
    st = result.settings
    out.print(f"  settings: n_ubatch {st['n_ubatch']}, n_batch {st['n_batch']}, n_gpu_layers {st['n_gpu_layers']}, "
              f"overrides {st['tensor_overrides'] or 'none'}, KV {st['type_k'] or 'f16'}, flash_attn {st['flash_attn']}, "
              f"mmap {st['use_mmap']}", highlight=False)
    for name, label in (("base", "embedding + dense layer + head"), ("one_moe", "+ one MoE layer (384 experts)")):
        pre = ", ".join(f"{p} tok {float(v):.2f}s" for p, v in ms[name]["prefill_s"].items())
        out.print(f"  measured {label}: prefill {pre}; decode {float(ms[name]['decode_s_per_token']) * 1000:.1f} ms/token", highlight=False)
    by_ub = ms["one_moe"]["prefill_s_by_ubatch"]
    if len(by_ub) > 1:
        longest = max(result.lengths)
        out.print(f"  + one MoE layer, {longest}-token prompt by n_ubatch: "
                  + ", ".join(f"{u}: {float(v):.2f}s" for u, v in by_ub.items()), highlight=False)
    rates = ", ".join(f"{v:.1f} tok/s at {p}" for p, v in pj["prefill_tok_s"].items())
    out.print(f"[bold]projected[/] (1 dense + {pj['moe_layers']} MoE layers): prefill {rates}; decode {pj['decode_tok_s']:.2f} tok/s", highlight=False)
    for k, v in pj["ttft_s"].items():
        flag = " (extrapolated)" if k in pj["ttft_extrapolated"] else ""
        out.print(f"  time to first token, {k}: {v:,.0f} s{flag}", highlight=False)
    for r in result.recommendations:
        out.print(f"  would help: {r}", highlight=False)
    if check:
        e = check["relative_error"]
        out.print("  validation (whole reduced-width model vs its projection): " + ", ".join(f"{k} {v:+.0%}" for k, v in e.items()), highlight=False)
    err.print(f"[dim]took {result.seconds:.0f} s; slices kept in {result.slice_dir} (ragkit doctor --simulate --clean removes them)[/]", highlight=False)
