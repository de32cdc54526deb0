"""`wb audit`: the statistical exactness audit of speculative rollouts."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape
from rich.table import Table

from workbench.cli.common import _fail, _load, app, console, err


@app.command(context_settings={"allow_extra_args": False})
def audit(
    spec: Optional[str] = typer.Argument(
        None, help="Spec YAML path or a name under experiments/ (default: quickstart). May be omitted."
    ),
    overrides: Optional[list[str]] = typer.Argument(
        None, help="Dotted-key overrides, e.g. rollout.temperature=0.7 drafter.k=2"
    ),
    alpha: float = typer.Option(
        1e-3, "--alpha", min=1e-12, max=0.5, help="Family-wise false-alarm rate (Bonferroni over all chi-square tests)."
    ),
    samples: int = typer.Option(
        0,
        "--samples",
        "-n",
        min=0,
        help="Rows per drafter and prompt; 0 = sized for a 1 % shift (power 0.9), capped by --max-samples.",
    ),
    max_samples: int = typer.Option(
        0, "--max-samples", min=0, help="Cap on the auto sample size (0 = no cap: a 1 % shift)."
    ),
    prompts: Optional[int] = typer.Option(
        None,
        "--prompts",
        min=1,
        help="Task eval prompts: of the sampled tests (default 1; the greedy check uses at least 8), or with "
        "--identity each decoded grpo.group_size times (default 64).",
    ),
    max_new_tokens: Optional[int] = typer.Option(
        None,
        "--max-new-tokens",
        min=1,
        help="Completion tokens per row (positions tested); default k+2: the prefill token and one whole "
        "verification step; with --identity, rollout.max_new_tokens (whole completions).",
    ),
    k: Optional[int] = typer.Option(None, "--k", help="Speculation length (default: the spec's drafter.k)."),
    drafters_opt: Optional[str] = typer.Option(
        None,
        "--drafters",
        help="Comma-separated drafter kinds (default: every registered kind; with --identity, the spec's "
        "drafter.kind).",
    ),
    identity: bool = typer.Option(
        False,
        "--identity",
        help="Instead of the statistical tests: decode many prompts (grpo.group_size samples each, whole completions) "
        "plainly and speculatively with the same row seeds and compare token for token; exits 1 unless identical up "
        "to counted float ties. Sampler: rollout.sampler (keyed by default; rejection shows the check fail).",
    ),
    adaptive: bool = typer.Option(
        False,
        "--adaptive",
        help="Choose k per step with the adaptive policy (drafter.adaptive's, over fixed roofline-shaped costs); on "
        "with drafter.adaptive.",
    ),
    buckets: bool = typer.Option(
        False,
        "--buckets",
        help="Retire finished rows only to capture sizes 1, 2, 4, ... (retire buckets); on with rollout.cuda_graphs.",
    ),
    compile_: bool = typer.Option(
        False, "--compile", help="torch.compile the target's (and draft model's) steps; on with rollout.compile."
    ),
    pilot_rows: int = typer.Option(
        256,
        "--pilot-rows",
        min=8,
        help="Rows of the autoregressive pilot that finds each prompt's first uncertain position (fewer: faster on a "
        "large model).",
    ),
    pilot_tokens: int = typer.Option(
        64, "--pilot-tokens", min=1, help="Completion tokens the pilot scans for an uncertain position."
    ),
    context: str = typer.Option(
        "uncertain",
        "--context",
        help="Where the sampled tests run: uncertain (one token before the target's first uncertain position) or "
        "accepted (per drafter, the first cut of the target's own completion where its first draft is accepted at "
        "a rate in 0.3-0.9, probed with --pilot-rows rows: tests the accept path, e.g. ngram on a real model).",
    ),
    verdicts_file: Optional[Path] = typer.Option(
        None,
        "--verdicts-file",
        help="rollout.backend=vllm: the JSON file the verdicts are recorded in (default: vllm-verdicts.json in the "
        "workbench cache).",
    ),
    biased: bool = typer.Option(
        False,
        "--biased",
        hidden=True,
        help="Debug: verify with a sampler that accepts every draft (the audit must fail).",
    ),
) -> None:
    """Check that speculative rollouts follow the target's distribution, per drafter (exits 1 on a failure).

    Tests speculative samples against the target's exact law (teacher-forced conditionals):
    per-position token histograms and the joint law of the first two tokens (chi-square
    goodness of fit, Bonferroni to --alpha), and greedy token-for-token identity.
    With --identity: plain against speculative decoding of whole completions with the same row
    seeds (keyed sampling), token for token, float ties counted.
    Example: wb audit micro --samples 2000; wb audit quickstart --identity
    """
    from drafters import DRAFTERS, drafter_class
    from workbench.audit import (
        EngineOptions,
        accept_all_rejection_sample,
        informative_prompts,
        plan,
        run_audit,
        summary_rows,
    )
    from workbench.audit.setup import audit_setup
    from workbench.grpo.build import resolve_device
    from workbench.specs.resolve import rollout_config

    s = _load(spec, overrides)
    kinds = [x.strip() for x in drafters_opt.split(",")] if drafters_opt else list(DRAFTERS)
    unknown = [x for x in kinds if x not in DRAFTERS]
    if unknown:
        _fail(f"--drafters: unknown kind(s) {', '.join(unknown)}; registered: {', '.join(DRAFTERS)}")
    opts = EngineOptions(
        adaptive or s.drafter.adaptive,
        buckets or s.rollout.cuda_graphs,
        compile_ or s.rollout.compile or s.rollout.cuda_graphs,
    )
    if context not in ("uncertain", "accepted"):
        _fail(f"--context: {context!r}; allowed values: uncertain, accepted")
    if identity:
        from workbench.cli.audit_identity import run_identity_audit

        if context != "uncertain":
            _fail("--context places the statistical tests; --identity decodes whole task prompts: drop one")
        if biased:
            _fail("--biased plants a wrong rejection sampler; --identity checks keyed sampling: drop one")
        run_identity_audit(s, kinds if drafters_opt else None, prompts or 64, k or s.drafter.k, max_new_tokens, opts)
        return
    prompts = prompts or 1
    on_vllm = s.rollout.backend == "vllm"
    if context == "accepted" and on_vllm:
        _fail("--context accepted probes the workbench engine's drafters: drop rollout.backend=vllm or the option")
    if on_vllm and biased:
        _fail("--biased plants a wrong sampler in the workbench engine; drop it with rollout.backend=vllm")
    try:  # rollout.backend=vllm: workbench drafters are built only to be handed to vLLM (draft_model, eagle3, dflash)
        setup = audit_setup(
            s,
            [x for x in kinds if drafter_class(x) is not None and drafter_class(x).vllm_weights] if on_vllm else kinds,
            prompts,
            resolve_device(s.model.device),
        )
    except ValueError as e:
        _fail(str(e))
    lm, tok, drafters, skipped, prompt_ids, all_ids = (
        setup.lm,
        setup.tokenizer,
        setup.drafters,
        setup.skipped,
        setup.prompt_ids,
        setup.greedy_ids,
    )
    kk = k or s.drafter.k
    if on_vllm:
        drafters, skipped = _vllm_arms(s, setup, kinds, kk)
    max_new_tokens = max_new_tokens or kk + 2
    # the run's sampling (rollout.*) at the audit's length, ending where the run's rows end
    sampling = rollout_config(s, max_new_tokens=max_new_tokens).sampling
    sp = replace(sampling, eos_token_id=tok.eos_token_id, stop_token_ids=setup.stop_token_ids)
    if biased:  # the planted wrong sampler replaces rejection sampling's verification
        sp = replace(sp, sampler="rejection")
    m, a, n_req = plan(len(drafters), len(prompt_ids), max_new_tokens, alpha)
    n = samples or (min(n_req, max_samples) if max_samples else n_req)
    console.print(
        f"audit: target {s.model.target}, drafters {', '.join(drafters) or '-'}, k={kk}, {len(prompt_ids)} prompts, "
        f"{max_new_tokens} tokens, T={sp.temperature} top_p={sp.top_p} top_k={sp.top_k}, engine: {opts.label()}"
        f"{' [red](biased sampler)[/]' if biased else ''}\n"
        f"{m} chi-square tests against the target's exact law, Bonferroni: each at {a:.1e} (family-wise false-alarm "
        f"rate {alpha:g}); n for a 1 % shift at p=0.5, power 0.9: {n_req} rows per drafter and prompt; using n={n}",
        highlight=False,
    )
    with console.status("sampling") as status:
        if context == "accepted":
            contexts, probed = _accepting(
                lm, drafters, prompt_ids, sp, kk, pilot_rows, pilot_tokens, s.seed, opts, status
            )
        else:
            status.update("pilot: finding uncertain positions")
            contexts = informative_prompts(lm, prompt_ids, sp, pilot=pilot_rows, scan=pilot_tokens, seed=s.seed)
        res = run_audit(
            lm,
            drafters,
            contexts,
            sp,
            k=kk,
            n=n,
            alpha=alpha,
            skipped=skipped,
            greedy_prompts=all_ids,
            rejection_fn=accept_all_rejection_sample if biased else None,
            on_progress=lambda msg: status.update(msg),
            engine=opts,
        )
        if on_vllm:
            from workbench.vllm.measure import hf_greedy_tests

            status.update("greedy: vLLM against transformers generate()")
            res.tests += hf_greedy_tests(s, drafters, all_ids, max(max_new_tokens, 16), sp.stop_ids, setup.device)
    table = Table(
        title=f"audit ({res.wall_s:.0f} s): detectable shift at n={n}: {100 * res.shift:.1f} % (1 df, p=0.5, power 0.9)"
    )
    for col in ("drafter", "test", "min p (over prompts)", "result", "detail (worst)"):
        table.add_column(col)
    for d, name, p, ok, detail in summary_rows(res):
        color = {"pass": "green", "FAIL": "bold red"}.get(ok, "yellow")  # "pass (low power)": yellow
        table.add_row(d, name, p, f"[{color}]{ok}[/]", escape(detail))
    for kind, why in res.skipped.items():
        table.add_row(kind, "-", "-", "[yellow]skipped[/]", why)
    console.print(table)
    if context == "accepted":
        _print_accepting(contexts, probed, tok)
    else:
        console.print(
            "contexts (prompt + target's own prefix, ending one token before its first uncertain position, which is "
            "the first a draft verifies): " + " | ".join(repr(tok.decode(c)[-40:]) for c in contexts),
            highlight=False,
        )
    if res.acceptance:
        console.print(
            "acceptance rate: " + ", ".join(f"{d} {v:.2f}" for d, v in res.acceptance.items()), highlight=False
        )
        console.print(
            "first-position acceptance (draft position 0, per verification with a draft): "
            + ", ".join(
                f"{d} {a / b:.2f}" if b else f"{d} - (no drafts)" for d, (a, b) in res.first_acceptance.items()
            ),
            highlight=False,
        )
    if opts.adaptive or opts.buckets:  # what the options reached: k chosen per step, batch sizes stepped through
        console.print(
            "engine paths: "
            + "; ".join(
                f"{d} k_t {sorted({k_t for _, k_t in st})}, rows {sorted({r for r, _ in st}, reverse=True)}"
                for d, st in res.steps.items()
            ),
            highlight=False,
        )
    if on_vllm:
        from workbench.vllm.measure import record_verdicts

        for method, key in record_verdicts(
            res,
            list(drafters),
            sp,
            kk,
            s.rollout.vllm.draft_sample_method,
            s.rollout.vllm.cpu_expand_fix,
            target=s.model.target,
            user=verdicts_file,
            dtype=s.model.dtype,
            draft_vocab=s.drafter.draft_vocab_size,
        ).items():
            ok = all(t.passed for t in res.tests if t.drafter == method)
            console.print(
                f"verdict recorded: {key}: {'[green]pass[/]' if ok else '[bold red]FAIL[/]'}", highlight=False
            )
        for arm in drafters.values():
            arm.close()
    if not res.passed:
        err.print("[bold red]audit FAILED:[/] speculative rollouts differ from autoregressive ones")
        raise typer.Exit(1)
    console.print("[green]audit passed[/]")


def _vllm_arms(s, setup, kinds: list[str], k: int):
    """rollout.backend=vllm: one vLLM backend per method (plain sampling included) -> (arms, skipped)."""
    from workbench.vllm.measure import vllm_arms
    from workbench.vllm.runtime import vllm_missing_reason

    why = vllm_missing_reason()
    if why:
        _fail(why)
    try:
        arms, skipped = vllm_arms(s, setup, kinds, k)
    except ImportError as e:
        _fail(str(e))
    return arms, {**setup.skipped, **skipped}


def _accepting(lm, drafters, prompt_ids, sp, k, rows, scan, seed, opts, status):
    """Per drafter, its ``--context accepted`` contexts and their probed first-position acceptance (None
    where no cut was in the band: that prompt is audited at its uncertain context instead)."""
    from workbench.audit import ACCEPT_BAND, accepting_contexts, informative_prompts

    (lo, hi), contexts, probed = ACCEPT_BAND, {}, {}
    for name, d in drafters.items():
        status.update(f"{name}: probing for a context whose first draft is accepted at {lo}-{hi}")
        found = accepting_contexts(lm, d, prompt_ids, sp, k, probe_rows=rows, scan=scan, seed=seed, engine=opts)
        contexts[name], probed[name] = [c for c, _ in found], [r for _, r in found]
    if any(r is None for rs in probed.values() for r in rs):
        status.update("pilot: finding uncertain positions")
        fallback = informative_prompts(lm, prompt_ids, sp, pilot=rows, scan=scan, seed=seed)
        for name, rs in probed.items():
            contexts[name] = [c if r is not None else f for c, r, f in zip(contexts[name], rs, fallback)]
    return contexts, probed


def _print_accepting(contexts, probed, tok) -> None:
    """The ``--context accepted`` contexts (their last 40 characters) and the probes' acceptance, per drafter."""
    from workbench.audit import ACCEPT_BAND

    lo, hi = ACCEPT_BAND
    for name, ctxs in contexts.items():
        shown = [
            escape(repr(tok.decode(c)[-40:])) + (f" (probe {r:.2f})" if r is not None else " [yellow](none in band)[/]")
            for c, r in zip(ctxs, probed[name])
        ]
        console.print(
            f"{escape(name)} contexts (first draft accepted at {lo}-{hi} in the probe; none in band: the uncertain "
            "context): " + " | ".join(shown),
            highlight=False,
        )
