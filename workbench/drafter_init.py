"""Drafter initialisation (``drafter.init``): train a drafter on the target's own completions before
GRPO starts, save it as a checkpoint folder, cached like the model presets.

Init data (the in-domain vs chat question of docs/design.md §5):
- ``in_domain``: the target's sampled completions (the rollout sampling parameters) of RL-task
  train prompts, drawn from a generator stream no run seed uses (``INIT_SEED_OFFSET``); the eval
  split, hash-partitioned from train, never enters them, so ``eval/acceptance_length`` is held out;
- ``chat``: the target's completions of prompts from the generated general corpus;
- a path: the target's completions of the prompts in a user's jsonl/parquet (``init.prompt_field``).
The drafter learns from the target's teacher-forced logits and hidden states over those sequences
(:mod:`drafters.training`); eagle3's draft vocabulary is the most frequent ids of the data.

The checkpoint lives in ``cache_dir()/drafters/<kind>-<data>-<hash>``; the hash covers the target
checkpoint, the drafter's architecture fields, the init spec, the sampling parameters and
``model.dtype`` (when not float32), so a
changed field builds a new one and an unchanged one is reused.

Everything here reads one record, :class:`DrafterInitConfig` (the drafter, task and rollout sections,
the init's seed, the dtype), resolved from the spec by :func:`workbench.specs.resolve.drafter_init_config`.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from drafters import build_drafter, drafter_class
from drafters.training import completion_loss_mask, evaluate_rows, fit, lean_target_states, split_rows
from workbench.cache import atomic_dir, cache_dir, cached, short_hash
from workbench.files import write_text
from workbench.models.chat import generation_config_of, run_prompt_format
from workbench.progress import progress_bar
from workbench.rollout.drafter import Drafter, DrafterTarget
from workbench.rollout.sampling import SamplingParams
from workbench.rollout_builder import eager, engine_config, plain_backend, sampling_params
from workbench.specs.drafter import DrafterSpec
from workbench.specs.sections import RolloutSpec, TaskSpec

HELD_OUT = 0.1  # fraction of init sequences kept out of training for the reported agreement
INIT_SEED_OFFSET = 104729  # in_domain init prompts: train-partition generator seed = init seed + this


@dataclass(frozen=True)
class DrafterInitConfig:
    """What a drafter init reads.

    drafter: the drafter section (kind, its architecture fields, ``drafter.init.*``,
    ``distill_temperature``, ``model``); task: the task section (in_domain prompts are its train
    partition; the prompt format); rollout: the rollout section (the init completions are sampled as
    the run's rollouts, in its batch settings); seed: the init's seed (``drafter.init.seed``, or the
    run's ``seed`` when that is null); dtype: ``model.dtype`` (the target's outputs are in it).
    """

    drafter: DrafterSpec
    task: TaskSpec
    rollout: RolloutSpec
    seed: int
    dtype: str = "float32"


def init_folder(cfg: DrafterInitConfig, target_path: Path) -> Path | None:
    """Checkpoint folder for the drafter init ``cfg`` describes, or None when there is nothing to
    initialise (``init.data`` none, or a drafter kind without weights)."""
    d = cfg.drafter
    data = d.init_data()
    cls = drafter_class(d.kind)
    if data == "none" or cls is None or not cls.trainable:
        return None
    if cls.given_trained(d):  # a trained head given as drafter.model: nothing to initialise
        return None
    target_cfg = json.loads((Path(target_path) / "config.json").read_text())
    key = {
        "target": str(Path(target_path).resolve()),
        "target_config": target_cfg,
        "kind": d.kind,
        "arch": cls.arch_key(d),
        "init": {**d.init.model_dump(exclude={"seed"}), "data": data},
        "data": data if data in ("in_domain", "chat") else str(Path(data).expanduser().resolve()),
        "task": cfg.task.model_dump(include={"name", "path", "prompt_field"}),
        "seed": cfg.seed,
        # prompt format: keyed only when set away from the defaults (keys of earlier inits unchanged)
        **(
            {"prompt_format": [cfg.task.chat_template, cfg.task.system_prompt]}
            if (cfg.task.chat_template, cfg.task.system_prompt) != ("auto", None)
            else {}
        ),
        "sampling": cfg.rollout.model_dump(include={"temperature", "top_p", "top_k", "max_new_tokens"}),
        "v": 3,  # 2: transformers' lr schedule in drafters.training; 3: init prompts from INIT_SEED_OFFSET
    }
    if d.distill_temperature != 1.0:  # keyed only when set (keys of earlier inits unchanged)
        key["distill_temperature"] = d.distill_temperature
    if cfg.dtype != "float32":  # trained on the target's outputs in that precision (float32 keys unchanged)
        key["dtype"] = cfg.dtype
    tag = data if data in ("in_domain", "chat") else "dataset"
    return cache_dir() / "drafters" / f"{d.kind}-{tag}-{short_hash(key)}"


def init_prompts(cfg: DrafterInitConfig, tokenizer) -> list[list[int]]:
    """Token ids of the prompts the target completes for ``init.data``.

    Raises:
        ValueError: a user dataset that is missing, unreadable or has no ``init.prompt_field`` column.
    """
    from workbench.tasks.loading import _default_cache_dir, _load_user_file, load_general_prompts, spec_task_data

    d, t, n = cfg.drafter, cfg.task, cfg.drafter.init.num_prompts
    data = d.init_data()
    if data == "in_domain":
        # the train partition from a generator stream of its own: a run at any seed below the offset draws
        # other prompts (an init shared across run seeds, init.seed=0, once drew run seed 1's prompts)
        prompts = spec_task_data(t, "train", n, cfg.seed + INIT_SEED_OFFSET)["prompt"]
    elif data == "chat":
        prompts = load_general_prompts(n, cfg.seed)["prompt"]
    else:
        try:
            ds = _load_user_file(data, _default_cache_dir())
        except ValueError as e:
            raise ValueError(str(e).replace("task.path", "drafter.init.data")) from None
        if d.init.prompt_field not in ds.column_names:
            raise ValueError(
                f"drafter.init.prompt_field: column {d.init.prompt_field!r} not in {data} "
                f"(columns: {', '.join(ds.column_names)}); set drafter.init.prompt_field"
            )
        prompts = ds[d.init.prompt_field][:n]
    fmt = run_prompt_format(t, tokenizer)  # the run's prompt format: chat-templated for a chat model
    return [fmt.encode(p) for p in prompts]


def init_completions(
    cfg: DrafterInitConfig, lm, prompts: list[list[int]], sp: SamplingParams, target_path: Path, device
) -> list[list[int]]:
    """The target's sampled completions (token ids, one list per prompt) of the init ``prompts``,
    generated once and cached in ``cache_dir()/drafters/completions-<hash>.json``: every drafter
    kind (and every re-init with other training fields) of the same target, prompts, sampling and
    seed learns from the same sequences without generating them again (minutes on a CPU)."""
    r = cfg.rollout
    key = {
        "target": str(Path(target_path).resolve()),
        "dtype": cfg.dtype,
        "prompts": prompts,
        "sampling": [sp.temperature, sp.top_p, sp.top_k, sp.max_new_tokens, sp.eos_token_id, list(sp.stop_ids)],
        "seed": cfg.seed,
        "batch": [r.max_batch_size, r.continuous_batching],
        "v": 1,
    }
    file = cache_dir() / "drafters" / f"completions-{short_hash(key)}.json"

    def generate() -> None:
        gen = torch.Generator(device).manual_seed(cfg.seed + 1)
        # the cache key holds the batch settings only: eager, unpacked decoding, so a cached file is what this writes
        out = plain_backend(lm, eager(engine_config(r))).generate(prompts, sp, gen)
        write_text(file, json.dumps(out.tokens))  # atomic and sealed: a killed init leaves no half-written file

    return json.loads(cached(file, generate, "drafter.init").read_text())


def build_init(
    cfg: DrafterInitConfig, lm, tokenizer, target_path: Path, device, progress: bool = True, console=None
) -> Path | None:
    """Train and save the drafter init checkpoint if it is not cached; return its folder (or None).

    ``lm``: the target as a LeanLM; ``tokenizer``: the target's. Writes ``init_info.json`` beside the
    weights (data, sequences, tokens, steps, seconds, held-out loss and top-1 agreement).
    """
    folder = init_folder(cfg, target_path)
    if folder is None:
        return None
    # a damaged checkpoint (truncated weights, a changed file) is trained again, once
    return cached(
        folder, lambda: _train(cfg, lm, tokenizer, target_path, device, folder, progress, console), "drafter.init"
    )


def _train(cfg: DrafterInitConfig, lm, tokenizer, target_path: Path, device, folder: Path, progress, console) -> None:
    """Train the drafter init ``cfg`` describes and save it into ``folder`` (atomically, with ``init_info.json``)."""
    d = cfg.drafter
    t0 = time.perf_counter()
    if console is not None:
        console.print(f"[bold]drafter init[/]: {d.kind} on {d.init_data()} data -> {folder}")
    prompts = init_prompts(cfg, tokenizer)
    sp = sampling_params(cfg.rollout, cfg.task, tokenizer, generation_config_of(target_path))  # the run's, its stops
    completions = init_completions(cfg, lm, prompts, sp, target_path, device)
    seqs = [p + c for p, c in zip(prompts, completions)]

    # Count tokens (eagle3's draft vocabulary) over the completions the drafter will be asked to draft.
    counts = torch.bincount(
        torch.tensor([x for c in completions for x in c], dtype=torch.long), minlength=lm.cfg.vocab_size
    ).float()
    ref = DrafterTarget(lm, tokenizer, token_counts=counts, path=Path(target_path))
    drafter = build_drafter(d.kind, d, target=ref, device=device)

    rows = []
    # target states in chunks of (n, L, V) logits, n bounded so a chunk's logits stay under ~1 GB
    # (a 49k vocabulary: 30 sequences of 180 tokens); rows keep them compact (drafters.training.TopKLogits)
    step = max(1, min(64, (1 << 28) // (max(map(len, seqs)) * lm.cfg.vocab_size)))
    for i in range(0, len(seqs), step):
        chunk = seqs[i : i + step]
        L = max(map(len, chunk))
        ids = torch.full((len(chunk), L), tokenizer.pad_token_id, dtype=torch.long)
        for j, s in enumerate(chunk):
            ids[j, : len(s)] = torch.tensor(s)
        mask = completion_loss_mask([len(p) for p in prompts[i : i + step]], list(map(len, chunk)), L)
        rows += split_rows(lean_target_states(lm, ids.to(device), mask.to(device), drafter.hidden_layers))
    n_eval = max(1, int(len(rows) * HELD_OUT))
    train, held = rows[n_eval:], rows[:n_eval]
    before = evaluate_rows(drafter, held)

    with progress_bar(progress) as bar:
        task = bar.add_task(f"init {d.kind} ({d.init_data()})", total=d.init.steps, info="")
        fit(
            drafter,
            train,
            d.init.steps,
            d.init.lr,
            d.init.batch_size,
            seed=cfg.seed,
            on_step=lambda s, st: bar.update(
                task, completed=s + 1, info=f"loss {st['draft/loss']:.3f} top1 {st['draft/top1_agreement']:.3f}"
            ),
        )
    after = evaluate_rows(drafter, held)
    info = {
        "kind": d.kind,
        "data": d.init_data(),
        "num_sequences": len(rows),
        "num_train": len(train),
        "num_completion_tokens": int(sum(map(len, completions))),
        "steps": d.init.steps,
        "lr": d.init.lr,
        "batch_size": d.init.batch_size,
        "seconds": round(time.perf_counter() - t0, 2),
        "held_out_before": {k: round(v, 4) for k, v in before.items() if k in ("draft/loss", "draft/top1_agreement")},
        "held_out_after": {k: round(v, 4) for k, v in after.items() if k in ("draft/loss", "draft/top1_agreement")},
        "target": str(target_path),
    }
    with atomic_dir(folder) as tmp:
        drafter.save(tmp)
        (tmp / "init_info.json").write_text(json.dumps(info, indent=2))
    if console is not None:
        console.print(
            f"drafter init done in {info['seconds']} s: held-out top-1 agreement "
            f"{before.get('draft/top1_agreement', 0):.3f} -> {after.get('draft/top1_agreement', 0):.3f}"
        )


def init_info(folder: Path | None) -> dict | None:
    """The ``init_info.json`` of an init checkpoint folder (None if absent)."""
    if folder is None or not (Path(folder) / "init_info.json").is_file():
        return None
    return json.loads((Path(folder) / "init_info.json").read_text())


def drafter_as_run(
    cfg: DrafterInitConfig, lm, tokenizer, target_path: Path, device: torch.device, progress: bool = False
) -> Drafter | None:
    """The drafter ``cfg`` describes (:func:`workbench.specs.resolve.drafter_init_config` of a spec)
    exactly as ``wb run`` builds it: its init checkpoint (cached; trained here first if missing, see
    :func:`build_init`) loaded for the target ``lm`` (a ``LeanLM``).

    Every instrument that times or audits a drafter (bench, audit, the performance model) builds it
    here, so what they measure is what a run uses (e.g. eagle3's draft vocabulary of V/4 tokens).
    None for ``drafter.kind: none``.

    Raises:
        ValueError: an unknown drafter kind, a checkpoint made for another target, a mismatched
            tokenizer (the message names the spec field).
    """
    init = build_init(cfg, lm, tokenizer, target_path, device, progress=progress)
    return build_drafter(
        cfg.drafter.kind,
        cfg.drafter,
        target=DrafterTarget(lm, tokenizer, init_path=init, path=Path(target_path)),
        device=device,
    )
