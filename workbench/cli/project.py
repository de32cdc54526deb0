"""`wb project`: the performance model (projection, published seeds, a measured sweep, calibration)."""

from __future__ import annotations

from typing import Optional

import typer
from rich.table import Table

from workbench.cli.common import _fail, _int_list, _named_floats, app, console


@app.command(context_settings={"allow_extra_args": False})
def project(
    gen: Optional[float] = typer.Option(None, "--gen", help="Seconds of the gen stage per step (autoregressive)."),
    logprob: float = typer.Option(0.0, "--logprob", min=0.0, help="Seconds of the logprob stage."),
    train: float = typer.Option(0.0, "--train", min=0.0, help="Seconds of the train stage."),
    prepare: float = typer.Option(0.0, "--prepare", min=0.0, help="Seconds of the prepare stage (weight sync)."),
    data: float = typer.Option(0.0, "--data", min=0.0, help="Seconds of the data stage."),
    other: float = typer.Option(0.0, "--other", min=0.0, help="Other seconds per step (draft_train, reward, untimed)."),
    run_ref: Optional[str] = typer.Option(None, "--run", help="MLflow run id or name: stage times = mean timing_s/<stage>, α from spec/acceptance_rate_pos_<i>."),
    tracking_uri: Optional[str] = typer.Option(None, "--tracking-uri", help="MLflow tracking URI (default $MLFLOW_TRACKING_URI or sqlite:///mlflow.db)."),
    alpha: Optional[list[str]] = typer.Option(None, "--alpha", help="Per-token acceptance α, or DRAFTER=α (repeatable)."),
    per_pos: Optional[str] = typer.Option(None, "--per-pos", help="Per-position acceptance rates 'r0,r1,..' (α fitted from r_i ≈ α^(i+1))."),
    c: Optional[list[str]] = typer.Option(None, "--c", help="Drafter/target step cost ratio, or DRAFTER=c (repeatable; default 0.05)."),
    ks: str = typer.Option("1..8", "--k", help="Speculation lengths: LOW..HIGH or a,b,c."),
    cost_curve: Optional[str] = typer.Option(None, "--cost-curve", help="JSON/CSV of target forward seconds vs tokens in flight."),
    params: Optional[float] = typer.Option(None, "--params", help="Roofline: target parameter count (e.g. 8e9)."),
    flops: float = typer.Option(989e12, "--flops", min=1.0, help="Roofline: GPU FLOP/s (default H100 dense bf16)."),
    bandwidth: float = typer.Option(3.35e12, "--bandwidth", min=1.0, help="Roofline: GPU memory bandwidth, bytes/s (default H100)."),
    bytes_per_param: float = typer.Option(2.0, "--bytes-per-param", min=0.01, help="Roofline: bytes per weight."),
    batch: int = typer.Option(256, "--batch", min=1, help="Rows decoded together (tokens in flight per decode step)."),
    staleness: int = typer.Option(3, "--staleness", min=0, help="Async model: show staleness 1..N."),
    cv: float = typer.Option(0.2, "--cv", min=0.0, help="Async model: coefficient of variation of the per-step gen time."),
    seeds: bool = typer.Option(False, "--seeds", help="Print the check against DESIGN.md §6's published numbers and exit."),
    sweep: Optional[str] = typer.Option(None, "--sweep", help="Check the model on a measured sweep (MLflow sweep name): predicted vs measured step speedup per point."),
    costs: Optional[str] = typer.Option(None, "--costs", help="--sweep: step costs and lengths from a --save-costs JSON instead of the engine microbenchmark."),
    save_costs: Optional[str] = typer.Option(None, "--save-costs", help="--sweep: write the microbenchmark's step costs and lengths to this JSON."),
    threads: Optional[int] = typer.Option(None, "--threads", min=1, help="--sweep: torch threads for the microbenchmark (match the sweep's; default: torch's)."),
    reps: int = typer.Option(3, "--reps", min=1, help="--sweep: repeats per microbenchmark timing (the fastest counts)."),
    tolerance: float = typer.Option(0.10, "--tolerance", min=0.0, help="--sweep: relative error of the step speedup that passes."),
    load_adjust: bool = typer.Option(False, "--load-adjust", help="--sweep: scale each point's predicted gen by its non-gen s / the baseline's (machine speed during the point)."),
    calibrate: bool = typer.Option(False, "--calibrate", help="Fit the unknown cost (--unknown c|knee) to one measured point (--k K, its acceptance, --gen-speedup S) and predict k=1..7."),
    gen_speedup: Optional[float] = typer.Option(None, "--gen-speedup", min=0.0, help="--calibrate: the measured gen speedup at --k (e.g. speedup/gen of a paired run)."),
    acceptance_length: Optional[float] = typer.Option(None, "--acceptance-length", min=1.0, help="--calibrate: the measured acceptance length at --k (α from inverting E[N])."),
    unknown: str = typer.Option("c", "--unknown", help="--calibrate: what to fit: c (drafter/target step cost) or knee (tokens in flight where verification turns compute-bound)."),
    knee: Optional[float] = typer.Option(None, "--knee", min=1.0, help="--calibrate --unknown c: the roofline knee in tokens in flight (default: memory-bound, verification = 1 step)."),
) -> None:
    """Project gen and step speedups per drafter and k, the best k, and async overlap (a performance model).

    Examples: wb project --gen 100 --logprob 20 --train 15 --alpha 0.8 --c 0.05 |
    wb project --run my-run --params 8e9 --batch 64 | wb project --seeds | wb project --sweep note-1 |
    wb project --calibrate --k 3 --acceptance-length 2.4 --gen-speedup 1.6
    """
    from workbench import project as pm

    if calibrate:
        from workbench.calibrate import run_cli

        try:
            return run_cli(console, ks, gen_speedup, acceptance_length, per_pos, alpha, unknown, c, knee, batch)
        except ValueError as e:
            _fail(str(e))

    if (costs or save_costs) and not sweep:
        _fail("--costs and --save-costs go with --sweep NAME")
    if sweep and cost_curve:
        _fail("--cost-curve is the target-forward curve of a projection; with --sweep the step costs come from the engine "
              "microbenchmark or --costs FILE (written by --save-costs)")
    if sweep:
        try:
            runs, uri = pm.load_sweep(sweep, tracking_uri)
        except ValueError as e:
            _fail(str(e))
        finished = [r for r in runs if r.status == "FINISHED"]
        skipped = [f"{r.label()}: {r.status.lower()}" for r in runs if r.status != "FINISHED"]
        pairs = []
        for r in finished:
            if r.is_baseline:
                continue
            b = pm.baseline_for(r, finished)
            miss = pm.missing_metrics(r) + (pm.missing_metrics(b) if b else [])
            if b is None or miss:
                skipped.append(f"{r.label()}: " + ("no finished drafter=none baseline with the same settings" if b is None else "no " + ", ".join(miss)))
            else:
                pairs.append((r, b))
        if not pairs:
            _fail(f"sweep {sweep!r}: no point with a baseline to check" + (" (" + "; ".join(skipped) + ")" if skipped else ""))
        if costs:
            try:
                step_costs, lengths, meta = pm.load_costs(costs)
            except (OSError, ValueError, KeyError) as e:
                _fail(f"--costs: {e}")
            source = f"--costs {costs}" + (f" (measured {meta.get('date', '?')}, {meta.get('threads', '?')} threads)" if meta else "")
        else:
            import time

            import torch

            if threads:
                torch.set_num_threads(threads)
            bench = pm.EngineBench(reps=reps)
            lengths = {}
            with console.status("engine microbenchmark") as st:
                for r, b in pairs:
                    wk = pm.workload_key(b.params)
                    if wk not in lengths:
                        st.update(f"sampling completion lengths ({b.params.get('model.target')}, {b.rows} rows × {bench.length_batches})")
                        lengths[wk] = bench.lengths(b)
                step_costs = bench.step_costs(list({r.run_id: r for pair in pairs for r in pair}.values()), progress=st.update)
            meta = {"date": time.strftime("%Y-%m-%d %H:%M:%S"), "threads": torch.get_num_threads(), "reps": reps,
                    "device": "cuda" if torch.cuda.is_available() else "cpu"}
            source = f"engine microbenchmark, torch {torch.get_num_threads()} thread(s), fastest of {reps}"
            if save_costs:
                pm.save_costs(save_costs, step_costs, lengths, meta)
        preds = []
        for r, b in pairs:
            ck, bk, wk = pm.config_key(r.params), pm.config_key(b.params), pm.workload_key(b.params)
            if ck not in step_costs or bk not in step_costs or wk not in lengths:
                skipped.append(f"{r.label()}: no step cost / lengths for {ck if ck not in step_costs else bk if bk not in step_costs else wk!r}")
                continue
            preds.append(pm.predict_point(r, b, step_costs[ck], step_costs[bk], lengths[wk], load_adjust=load_adjust))
        c = Table(title=f"step costs ({source})")
        for col in ("config", "per batch ms", "per step ms (a)", "per row·step µs (b)", "measured ms/step at n rows"):
            c.add_column(col, justify="left" if col in ("config", "measured ms/step at n rows") else "right")
        for key in dict.fromkeys(k for r, b in pairs for k in (pm.config_key(b.params), pm.config_key(r.params))):
            if key in step_costs:
                sc = step_costs[key]
                c.add_row(key, f"{sc.prefill * 1e3:.1f}", f"{sc.a * 1e3:.2f}", f"{sc.b * 1e6:.1f}",
                          " ".join(f"{n}:{v * 1e3:.2f}" for n, v in sc.grid.items()))
        console.print(c)
        for wk, bl in lengths.items():
            flat = [x for bb in bl for x in bb]
            if flat:
                console.print(f"completion lengths sampled by the target ({len(bl)} batches): mean {sum(flat) / len(flat):.1f}, "
                              f"max per batch {', '.join(str(max(bb)) for bb in bl)}", highlight=False)
        from rich import box

        t = Table(title=f"sweep {sweep}: measured vs predicted step speedup (tolerance {tolerance:.0%}"
                  + (", gen pred × non-gen × (--load-adjust))" if load_adjust else ")"), box=box.SIMPLE_HEAD,
                  caption="E[N] = 1 + Σ per-position acceptance rates (used directly, no geometric α); undrafted: row-steps without a "
                  "draft; S: verification steps per GRPO step (simulated), n̄ = R / S rows in flight; cost/step: one step at n̄ over one "
                  "autoregressive step at the baseline's n̄; gen pred = baseline gen × model(point) / model(baseline); step pred = "
                  "point's non-gen s + gen pred; non-gen ×: point's non-gen s / baseline's (speculation does not change them: "
                  "far from 1 = the machine's speed changed between the runs)")
        for col in ("drafter", "k", "E[N]", "undrafted", "S", "n̄", "cost/step", "gen s", "gen s pred", "non-gen ×", "step ×", "step × pred", "error", "within"):
            t.add_column(col, justify="left" if col in ("drafter", "within") else "right", no_wrap=True)
        base_done = set()
        for p in preds:
            if p.base.run_id not in base_done:
                base_done.add(p.base.run_id)
                t.add_row("none", "-", "1.00", "-", f"{p.base_steps:.1f}", f"{p.base_row_steps / max(p.base_steps, 1e-9):.1f}", "1.00",
                          f"{p.base.gen:.3f}", "(ref)", "1.00", "1.00", "(ref)", "-", "-")
            t.add_row(p.run.kind, str(p.run.k), f"{p.tokens_per_step:.2f}", f"{p.no_draft:.0%}", f"{p.steps:.1f}",
                      f"{p.row_steps / max(p.steps, 1e-9):.1f}", f"{p.step_cost_ratio:.2f}", f"{p.gen_meas:.3f}", f"{p.gen_pred:.3f}",
                      f"{p.non_gen_ratio:.2f}", f"{p.speedup_meas:.3f}", f"{p.speedup_pred:.3f}", f"{p.error:+.1%}",
                      "[green]✓ pass[/]" if p.within(tolerance) else "[red]✗ FAIL[/]")
        console.print(t)
        for p in {p.base.run_id: p for p in preds}.values():
            console.print(f"calibration: the microbenchmark's gen of the baseline {p.model_gen_base:.3f} s vs measured {p.base.gen:.3f} s "
                          f"(×{p.base.gen / p.model_gen_base:.2f} applied to its points)", highlight=False)
        for s_ in skipped:
            console.print(f"[yellow]not checked[/] {s_}", highlight=False)
        n_ok = sum(p.within(tolerance) for p in preds)
        console.print(f"{n_ok}/{len(preds)} points within {tolerance:.0%} (step speedup, store {uri})", highlight=False)
        return

    if seeds:
        rows = pm.seeds_check()
        t = Table(title="DESIGN.md §6 seeds: projected vs published step speedup (tolerance 0.02)")
        t.add_column("quantity")
        for r in rows:
            t.add_column(r["seed"], justify="right")
        fields = [("gen s (autoregressive → speculative)", lambda r: f"{r['gen_s']:.1f} → {r['gen_spec_s']:.1f}"),
                  ("gen speedup S (published)", lambda r: f"{r['gen_speedup']:.3f} ({r['published_gen_speedup']})"),
                  ("non-gen s (backed out)", lambda r: f"{r['non_gen_s']:.2f}"),
                  ("gen fraction of the step", lambda r: f"{r['gen_fraction']:.3f}"),
                  ("projected step speedup", lambda r: f"{r['step_speedup']:.3f}"),
                  ("gen fraction clamped to §6's 65–72 %", lambda r: f"{r['gen_fraction_in_range']:.2f}"),
                  ("projected step speedup (that fraction)", lambda r: f"{r['step_speedup_in_range']:.3f}"),
                  ("published step speedup", lambda r: f"{r['published']:.2f}"),
                  ("within 0.02", lambda r: "[green]yes[/]" if r["ok"] else "[red]NO[/]")]
        for label, fn in fields:
            t.add_row(label, *(fn(r) for r in rows))
        console.print(t)
        console.print("non-gen s: backed out of gen times and the published step speedup; frac §6: gen fraction clamped to "
                      "§6's 65–72 % range; step × = step / (step − gen + gen/S) with S = gen/spec gen", highlight=False)
        if not all(r["ok"] for r in rows):
            raise typer.Exit(1)
        return
    stages: dict[str, float] = {}
    info: dict = {}
    if run_ref:
        try:
            stages, info = pm.stages_from_mlflow(run_ref, tracking_uri)
        except ValueError as e:
            _fail(str(e))
    cli_stages = dict(gen=gen, logprob=logprob, train=train, prepare=prepare, data=data, other=other)
    for key, v in cli_stages.items():
        if v is not None and (v or key not in stages):
            stages[key] = v
    if stages.get("gen") is None or stages["gen"] <= 0:
        _fail("give the gen stage time (--gen SECONDS) or an MLflow run (--run ID_OR_NAME)")
    alphas = _named_floats(alpha, "--alpha")
    if per_pos:
        try:
            alphas.setdefault(info.get("drafter", ""), pm.alpha_from_per_position([float(x) for x in per_pos.split(",")]))
        except ValueError:
            _fail(f"--per-pos: {per_pos!r} is not comma-separated numbers")
    if not alphas and info.get("per_pos"):
        alphas[info["drafter"]] = pm.alpha_from_per_position(info["per_pos"])
    if not alphas:
        _fail("give --alpha, --per-pos, or an MLflow run with spec/acceptance_rate_pos_<i> metrics")
    if "" in alphas and len(alphas) > 1:
        alphas["drafter"] = alphas.pop("")
    alphas = {(d or "drafter"): a for d, a in alphas.items()}
    cvals = _named_floats(c, "--c")
    cs = {d: cvals.get(d, cvals.get("", 0.05)) for d in alphas}
    try:
        k_list = list(_int_list(ks, "--k")) if ".." not in ks else list(range(int(ks.split("..")[0]), int(ks.split("..")[1]) + 1))
    except (ValueError, typer.Exit):
        _fail(f"--k: {ks!r} is not LOW..HIGH or a,b,c")
    if cost_curve:
        try:
            cost = pm.load_cost_curve(cost_curve)
        except (OSError, ValueError, KeyError) as e:
            _fail(f"--cost-curve: {e}")
        cost_desc = f"measured curve {cost_curve}"
    elif params:
        cost = pm.CostModel("roofline", params=params, flops=flops, bandwidth=bandwidth, bytes_per_param=bytes_per_param)
        cost_desc = f"roofline {params:.3g} params, {flops:.3g} FLOP/s, {bandwidth:.3g} B/s"
    else:
        cost = pm.CostModel()
        cost_desc = "memory-bound (verification = 1 target step)"
    rows = pm.project(stages, alphas, cs, k_list, cost, batch)
    step = sum(stages.values())
    console.print(f"step {step:.2f} s = " + " + ".join(f"{k} {v:.2f}" for k, v in stages.items() if v) + f"; cost model: {cost_desc}; batch {batch}", highlight=False)
    best = pm.best_k(rows)
    t = Table(title="synchronous step: projected speedups (Leviathan, S = E[N] / (k·c + verify))")
    for col in ("drafter", "k", "α", "c", "E[N]", "verify/step", "gen ×", "gen s", "step s", "step ×"):
        t.add_column(col)
    for r in rows:
        mark = " *" if best[r.drafter] is r else ""
        t.add_row(r.drafter, f"{r.k}{mark}", f"{r.alpha:.3f}", f"{r.c:.3g}", f"{r.expected_tokens:.2f}", f"{r.verify_ratio:.2f}",
                  f"{r.gen_speedup:.2f}", f"{r.gen_s:.2f}", f"{r.step_s:.2f}", f"{r.step_speedup:.2f}")
    console.print(t)
    train_side = step - stages["gen"]
    a = Table(title=f"asynchronous overlap (gen ‖ train side {train_side:.2f} s, gen cv {cv}): mean step s (× vs sync autoregressive {step:.2f} s)")
    a.add_column("staleness")
    a.add_column("autoregressive")
    for d, r in best.items():
        a.add_column(f"{d} k={r.k}")
    for s in range(0, staleness + 1):
        ar = pm.async_step_time(stages["gen"], train_side, s, cv)
        cells = [f"{ar:.2f} ({step / ar:.2f}×)"]
        for d, r in best.items():
            v = pm.async_step_time(r.gen_s, train_side, s, cv)
            cells.append(f"{v:.2f} ({step / v:.2f}×)")
        a.add_row("0 (sync)" if s == 0 else str(s), *cells)
    console.print(a)
    console.print("best k: " + ", ".join(f"{d} k={r.k} (gen {r.gen_speedup:.2f}×, step {r.step_speedup:.2f}×)" for d, r in best.items()), highlight=False)
