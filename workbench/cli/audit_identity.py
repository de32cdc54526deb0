"""`wb audit --identity`: plain against speculative decoding with the same row seeds, token for token."""

from __future__ import annotations

from dataclasses import replace

import typer
from rich.table import Table

from workbench.cli.common import _fail, console, err

SHOWN = 8  # divergences printed per drafter


def run_identity_audit(s, kinds: list[str] | None, num_prompts: int, k: int, max_new_tokens: int | None, opts) -> None:
    """Build the spec's target, prompts and drafters (``kinds``; None: the spec's drafter.kind), decode
    each prompt grpo.group_size times plainly and speculatively with the same row seeds, print the
    counts and every divergence, log them to the spec's MLflow experiment (a run tagged
    ``workbench.audit=identity``: ``identity/<drafter>/*`` metrics, the divergences as ``identity.json``;
    none with tracking.enabled=false), and exit 1 unless identical up to counted float ties."""
    from workbench.audit.identity import grpo_groups, plain_completions, run_identity
    from workbench.audit.setup import audit_setup
    from workbench.grpo.build import resolve_device
    from workbench.rollout.keyed import seeded
    from workbench.specs.resolve import rollout_config

    if s.rollout.backend == "vllm":
        _fail("--identity runs the workbench engine (keyed sampling is the workbench's); drop rollout.backend=vllm")
    kinds = kinds or ([s.drafter.kind] if s.drafter.kind != "none" else [])
    if not kinds:
        _fail("--identity compares speculative with plain decoding: drafter.kind is none; set it or --drafters")
    tracker = _tracker(s)
    try:
        setup = audit_setup(s, kinds, num_prompts, resolve_device(s.model.device))
    except ValueError as e:
        _fail(str(e))
    sampler = s.rollout.sampler  # keyed by default on this backend; rejection when set, to see the check fail
    sampling = rollout_config(s, max_new_tokens=max_new_tokens).sampling
    sp = replace(sampling, eos_token_id=setup.tokenizer.eos_token_id, stop_token_ids=setup.stop_token_ids)
    G, batch = s.grpo.group_size, s.rollout.max_batch_size
    prompts, groups = grpo_groups(setup.prompt_ids, G)
    sp = seeded(sp, s.seed, 0, group_ids=groups, group_size=G)  # keyed: the trainer's row seeds, as at a step 0
    console.print(
        f"audit --identity: target {s.model.target}, drafters {', '.join(setup.drafters) or '-'}, k={k}, "
        f"{len(setup.prompt_ids)} prompts x {G} samples = {len(prompts)} rows, whole completions (at most "
        f"{sp.max_new_tokens} tokens), {batch} rows at a time, T={sp.temperature} top_p={sp.top_p} top_k={sp.top_k}, "
        f"sampler {sampler}, engine: {opts.label()}"
        + (
            " [yellow](rejection sampling is not drafter-invariant: differences are expected)[/]"
            if sampler != "keyed"
            else ""
        ),
        highlight=False,
    )
    reports = []
    with tracker, console.status("plain decoding") as status:
        plain = plain_completions(setup.lm, prompts, sp, batch, s.seed, groups)
        for name, drafter in setup.drafters.items():
            status.update(f"{name} k={k}: speculative decoding and the comparison")
            reports.append(
                run_identity(
                    setup.lm, drafter, prompts, sp, k, batch, name=name, group_ids=groups, seed=s.seed, plain=plain,
                    engine=opts,
                )
            )  # fmt: skip
        _log(tracker, s, reports, setup.skipped, sp, k, len(prompts), opts.label())
    table = Table(title="identity: plain vs speculative decoding, same row seeds")
    for col in (
        "drafter",
        "k",
        "rows",
        "tokens",
        "rows differing",
        "tokens differing",
        "float ties",
        "acceptance",
        "result",
    ):
        table.add_column(col)
    for r in reports:
        c = r.comparison
        ok = (
            "[green]identical[/]"
            if not c.differing_rows
            else "[green]pass (ties)[/]"
            if r.passed
            else "[bold red]FAIL[/]"
        )
        table.add_row(
            r.drafter, str(r.k), str(c.rows), str(c.tokens), str(c.differing_rows), str(c.differing_tokens),
            str(r.ties), f"{r.acceptance:.2f}", ok,
        )  # fmt: skip
    for kind, why in setup.skipped.items():
        table.add_row(kind, "-", "-", "-", "-", "-", "-", "-", "[yellow]skipped[/]", why)
    console.print(table)
    for r in reports:
        for d in r.divergences[:SHOWN]:
            console.print(f"{r.drafter}: {d.describe()}", highlight=False)
        if len(r.divergences) > SHOWN:
            console.print(f"{r.drafter}: ... and {len(r.divergences) - SHOWN} more differing rows", highlight=False)
    console.print(
        "tie rule: at a row's first differing position the two candidates' keyed scores (log p + Gumbel noise) at a "
        "reference forward lie within 2·64 ulps·max|logit|/T, or one sits on the top-k/top-p edge (docs/exactness.md)",
        highlight=False,
    )
    if not reports:
        _fail("--identity: no drafter could be built: " + "; ".join(f"{k}: {v}" for k, v in setup.skipped.items()))
    if not all(r.passed for r in reports):
        err.print("[bold red]audit FAILED:[/] speculative completions differ from plain ones with the same seeds")
        raise typer.Exit(1)
    console.print("[green]audit passed[/]: speculative completions equal plain ones (up to the counted float ties)")


def _tracker(s):
    """The audit's MLflow run (not started), after checking the store: an unusable one fails here, before
    any model is built (one line, exit 2)."""
    from workbench.tracking import StoreError, Tracker, check_store

    if s.tracking.enabled:
        try:
            check_store(s.tracking.tracking_uri, s.tracking.experiment)
        except StoreError as e:
            _fail(str(e))
    tags = {"workbench.audit": "identity", "workbench.spec": s.name}
    return Tracker(s.tracking.tracking_uri, s.tracking.experiment, f"audit-identity-{s.name}", s.tracking.enabled, tags)


def _log(tracker, s, reports, skipped: dict[str, str], sp, k: int, rows: int, engine: str) -> None:
    """Parameters, one metric set per drafter (rows, tokens, differing rows and tokens, float ties, acceptance,
    passed 0/1) and ``identity.json`` with every divergence, as :func:`run_identity_audit` prints them."""
    tracker.log_params(
        {
            "target": s.model.target, "dtype": s.model.dtype, "k": k, "rows": rows, "seed": s.seed,
            "temperature": sp.temperature, "top_p": sp.top_p, "top_k": sp.top_k,
            "max_new_tokens": sp.max_new_tokens, "sampler": sp.sampler, "keyed_draft": sp.keyed_draft,
            "engine": engine,
        }
    )  # fmt: skip
    metrics: dict[str, float] = {}
    for r in reports:
        c, pre = r.comparison, f"identity/{r.drafter}/"
        metrics.update(
            {
                pre + "rows": c.rows, pre + "tokens": c.tokens, pre + "differing_rows": c.differing_rows,
                pre + "differing_tokens": c.differing_tokens, pre + "ties": r.ties,
                pre + "acceptance": r.acceptance, pre + "passed": float(r.passed),
            }
        )  # fmt: skip
    tracker.log_metrics(metrics, step=0)
    tracker.log_dict(
        {
            "drafters": {r.drafter: [d.describe() for d in r.divergences] for r in reports},
            "skipped": skipped,
        },
        "identity.json",
    )
