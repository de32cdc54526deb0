"""What `wb audit` audits: the spec's target, its prompts and every drafter kind built as `wb run` builds it."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from drafters import draft_cost_of
from workbench.drafter_init import drafter_as_run
from workbench.models import PRESETS, is_built, load_model, resolve_model
from workbench.models.chat import run_prompt_format
from workbench.rollout.drafter import Drafter
from workbench.rollout.model import LeanLM
from workbench.specs import ExperimentSpec
from workbench.specs.resolve import drafter_init_config
from workbench.tasks.loading import spec_task_data


@dataclass
class AuditSetup:
    """lm: the target (LeanLM); tokenizer; prompt_ids: the prompts of the sampled tests (token id lists);
    greedy_ids: at least 8 prompts for the greedy identity check; drafters: kind -> drafter;
    skipped: kind -> why it could not be built (a missing preset, a bad checkpoint)."""

    lm: LeanLM
    tokenizer: object
    device: torch.device
    prompt_ids: list[list[int]]
    greedy_ids: list[list[int]]
    drafters: dict[str, Drafter] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    stop_token_ids: tuple[int, ...] = ()  # besides eos: the chat template's end-of-turn (SamplingParams.stop_token_ids)


def audit_setup(spec: ExperimentSpec, kinds: list[str], num_prompts: int, device: torch.device) -> AuditSetup:
    """Load the spec's target and task prompts, and build each drafter kind in ``kinds`` with the
    spec's drafter fields (its init checkpoint cached, trained first if missing).

    Raises:
        ValueError: an unknown target checkpoint or a corrupt/missing task data file (names the field).
    """
    target_path = resolve_model(spec.model.target, what="model.target")
    hf, tok = load_model(target_path, device=device, dtype=spec.model.dtype)
    t = spec.task
    split = "eval" if t.num_eval else "train"
    rows = spec_task_data(t, split, max(num_prompts, 8), spec.seed)
    lm = LeanLM.from_hf(hf, what="model.target")
    fmt = run_prompt_format(t, tok)
    all_ids = [fmt.encode(r["prompt"]) for r in rows]
    setup = AuditSetup(
        lm, tok, device, all_ids[:num_prompts], all_ids, stop_token_ids=fmt.stop_token_ids(hf.generation_config)
    )
    for kind in kinds:
        try:
            if draft_cost_of(kind) == "model" and spec.drafter.model in PRESETS and not is_built(spec.drafter.model):
                setup.skipped[kind] = f"preset {spec.drafter.model} not built (wb models build {spec.drafter.model})"
                continue
            ks = spec.model_copy(update={"drafter": spec.drafter.model_copy(update={"kind": kind})})
            setup.drafters[kind] = drafter_as_run(drafter_init_config(ks), lm, tok, target_path, device, progress=True)
        except (ValueError, NotImplementedError, ImportError, OSError, TypeError) as e:
            setup.skipped[kind] = str(e).splitlines()[0][:120]
    return setup
