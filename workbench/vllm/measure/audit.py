"""`wb audit rollout.backend=vllm`: vLLM engines as audited arms, greedy identity against
transformers' ``generate()``, and the verdicts recorded per vLLM build and method.

Every method runs in its own vLLM engine over the spec's target: ``none`` (vLLM's plain sampler,
audited too), ``ngram``, ``draft_model`` and ``eagle3`` (the drafters ``wb run`` would use, their
inits trained and cached, handed to vLLM as Hugging Face / EAGLE-3 folders), ``suffix`` where
arctic-inference is installed. The statistical test is the workbench's own
(:func:`workbench.audit.law.run_audit`) at the same power, against the target's exact law.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import torch

from workbench.audit.joint import stop_tuple
from workbench.audit.law import AuditResult, AuditTest
from workbench.rollout.backend import RolloutBackend
from workbench.rollout_builder import VLLMTarget, build_backend
from workbench.specs.resolve import rollout_config
from workbench.vllm import record_verdict, sampling_settings, target_id
from workbench.vllm.runtime import build_id

METHODS = ("none", "ngram", "draft_model", "eagle3", "dflash", "suffix", "mtp")


def vllm_arms(spec, setup, kinds: list[str], k: int) -> tuple[dict[str, RolloutBackend], dict[str, str]]:
    """One vLLM backend per method in ``["none", *kinds]`` (kinds as drafter.kind), each its own
    engine; returns (arms, skipped: method -> why it cannot run in vLLM here). No guard: the audit
    is what makes the verdicts the guard reads. Each backend keeps its drafter's export until closed."""
    from workbench.models import resolve_model

    target_path = resolve_model(spec.model.target, what="model.target")
    device_type = setup.device.type
    arms: dict[str, RolloutBackend] = {}
    skipped: dict[str, str] = {}
    for kind in ["none", *[x for x in kinds if x != "none"]]:
        ks = spec.model_copy(update={"drafter": spec.drafter.model_copy(update={"kind": kind, "k": k})})
        try:
            cfg = replace(rollout_config(ks), backend="vllm")  # each method its own vLLM engine
            arms[kind] = build_backend(
                cfg, None, setup.drafters.get(kind), VLLMTarget(target_path, device_type, target_cfg=setup.lm.cfg)
            )
        except (ValueError, OSError) as e:
            skipped[kind] = str(e).splitlines()[0][:160]
    return arms, skipped


@torch.no_grad()
def hf_greedy_tests(
    spec,
    arms: dict[str, RolloutBackend],
    prompts: list[list[int]],
    max_new_tokens: int,
    stop_ids: int | Sequence[int] | None,
    device: torch.device,
) -> list[AuditTest]:
    """Greedy vLLM output (every arm) token for token against transformers' ``generate()`` on the
    target (no speculation). stop_ids: the ids that end a row, one id or several (eos first, then the
    other stop ids, as ``SamplingParams.stop_ids``); both sides stop at every one of them."""
    from workbench.models import load_model, resolve_model
    from workbench.rollout.sampling import SamplingParams

    stops = list(stop_tuple(stop_ids))
    hf, _ = load_model(resolve_model(spec.model.target, what="model.target"), device=device, dtype=spec.model.dtype)
    ref = []
    for p in prompts:
        ids = torch.tensor([p], device=device)
        out = hf.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            do_sample=False,
            max_new_tokens=max_new_tokens,
            eos_token_id=stops or None,
            pad_token_id=stops[0] if stops else 0,
        )
        ref.append(cut_at_stop(out[0, len(p) :].tolist(), stops))
    sp = SamplingParams(0.0, 1.0, 0, max_new_tokens, stops[0] if stops else None, tuple(stops[1:]))
    tests = []
    for name, arm in arms.items():
        got = arm.generate(prompts, sp).tokens
        same = sum(a == b for a, b in zip(got, ref))
        tests.append(
            AuditTest(
                name, "greedy vs transformers", -1, None, same == len(ref), f"{same}/{len(ref)} prompts identical"
            )
        )
    return tests


def cut_at_stop(row: list[int], stops: Sequence[int]) -> list[int]:
    """``row`` (token ids) up to and including its first stop id (whole if none): generate() pads
    past the end of a row."""
    end = next((i for i, x in enumerate(row) if x in stops), None)
    return row if end is None else row[: end + 1]


def record_verdicts(
    res: AuditResult,
    methods: list[str],
    sampling,
    k: int,
    draft_sample_method: str | None = None,
    cpu_expand_fix: bool = False,
    target: str = "tiny",
    user: Path | None = None,
    dtype: str = "float32",
    draft_vocab: int | None = None,
) -> dict[str, str]:
    """Record one verdict per audited method at the settings it sampled at (``target``: ``model.target``,
    named by :func:`workbench.vllm.verdicts.target_id`; ``dtype``; ``sampling``: the audit's
    ``SamplingParams``; ``k``; ``draft_sample_method``; ``draft_vocab``: eagle3's
    ``drafter.draft_vocab_size``), pass = every test of that method passed; returns method -> verdict
    key. The evidence kept: worst p-value, its test and detail, and the power and coverage (n rows per
    prompt, prompts, tokens, alpha, detectable shift), the target. ``user``: the verdict file
    (default: the user's, in the workbench cache)."""
    build = build_id(cpu_expand_fix)
    keys = {}
    for m in methods:
        ts = [t for t in res.tests if t.drafter == m]
        if not ts:
            continue
        passed = all(t.passed for t in ts)
        sampled = [t for t in ts if t.pvalue is not None]
        worst = min(sampled, key=lambda t: t.pvalue) if sampled else ts[0]
        failed = [t for t in ts if not t.passed]
        summary = (
            f"{len(failed)} of {len(ts)} tests failed; worst {worst.test}: p={worst.pvalue:.2e}, {worst.detail}"
            if failed and worst.pvalue is not None
            else f"{len(ts) - len(failed)}/{len(ts)} tests passed"
        )
        settings = sampling_settings(
            m,
            sampling.temperature,
            sampling.top_p,
            sampling.top_k,
            k,
            draft_sample_method,
            target_id(target),
            dtype,
            draft_vocab,
        )
        evidence = {
            "summary": summary,
            "n": res.n,
            "alpha": res.alpha,
            "detectable_shift": round(res.shift, 5),
            "num_prompts": len({t.prompt for t in sampled}),
            "max_new_tokens": sampling.max_new_tokens,
            "target": target,
        }
        keys[m] = record_verdict(build, m, passed, evidence, user=user, settings=settings)
    return keys
