"""The rollout engine's microbenchmark for ``wb project --sweep``: step costs and completion lengths.

For the baseline and for every drafter × k of a sweep, one engine step (target verification
forward over n × (k+1) tokens, drafter passes, sampling and rejection sampling, bookkeeping) is
timed at n = 1 .. batch rows kept constant (EOS ignored, m1 and m2 new tokens, seconds per step =
Δtime / Δsteps, the fastest of ``reps`` interleaved rounds) and fitted as a + b·n (per-step
overhead + per-row cost); the remainder at the full batch is the per-batch cost P (prefill, first
token, retiring rows): a :class:`workbench.perf.steps.StepCost`. Completion lengths are sampled
by the target itself on the sweep's task prompts. Torch is imported inside the functions, so the
package imports without it. The costs and lengths can be saved and reloaded (``--save-costs``,
``--costs``) to check a sweep again without measuring.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from workbench.perf.steps import StepCost, fit_affine
from workbench.perf.sweep_runs import SweepRun, config_key, workload_key


def save_costs(path: str | Path, costs: dict[str, StepCost], lengths: dict[str, list[list[int]]], meta: dict) -> None:
    """Write step costs (per :func:`config_key`), sampled lengths (per :func:`workload_key`) and
    ``meta`` (date, torch threads, reps, device) as JSON, for ``--costs`` later."""
    Path(path).write_text(json.dumps({"meta": meta, "configs": {k: c.to_json() for k, c in costs.items()}, "lengths": lengths}, indent=1))


def load_costs(path: str | Path) -> tuple[dict[str, StepCost], dict[str, list[list[int]]], dict]:
    """A ``--save-costs`` file: (step costs per :func:`config_key`, sampled lengths per :func:`workload_key`, meta).

    Raises:
        OSError: unreadable file. ValueError: not JSON. KeyError: not a ``--save-costs`` file.
    """
    d = json.loads(Path(path).read_text())
    return {k: StepCost.from_json(v) for k, v in d["configs"].items()}, {k: [list(map(int, b)) for b in v] for k, v in d["lengths"].items()}, d.get("meta", {})


def spec_from_params(params: dict[str, str]):
    """An ExperimentSpec from a run's flat dotted params (keys the current spec lacks are ignored)."""
    import yaml

    from workbench.specs import ExperimentSpec

    d = ExperimentSpec().model_dump(mode="json")
    for key, raw in params.items():
        node, parts = d, key.split(".")
        for p in parts[:-1]:
            node = node.get(p) if isinstance(node, dict) else None
            if node is None:
                break
        if parts[0] == "tracking" or not isinstance(node, dict) or parts[-1] not in node:
            continue
        if raw == "None" or isinstance(node[parts[-1]], str):
            v = None if raw == "None" else raw
        else:
            try:
                v = yaml.safe_load(raw)
            except yaml.YAMLError:
                v = raw
        node[parts[-1]] = v
    return ExperimentSpec.model_validate(d)


class EngineBench:
    """Times the rollout engine (see the module doc, "Cost") and samples completion lengths.

    Models are loaded once per (target, dtype, device) and drafters once per configuration without
    k; every measurement uses the sweep runs' own spec params (target, drafter, k, sampling, batch
    shape). Timings are interleaved: ``reps`` rounds over every batch size, generation length and
    configuration (configurations innermost), the fastest of the rounds counts per cell (a load
    spike on a shared machine then hits one round of a cell, and neighbouring configurations alike).
    """

    def __init__(self, reps: int = 3, length_batches: int = 4):
        self.reps, self.length_batches = reps, length_batches
        self._targets: dict = {}
        self._drafters: dict = {}
        self._prompts: dict[str, list[list[int]]] = {}
        self._mean_len: dict[str, float] = {}

    def _target(self, spec):
        import torch

        from workbench.models import load_model, resolve_model
        from workbench.rollout.model import LeanLM

        key = (spec.model.target, spec.model.dtype, spec.model.device)
        if key not in self._targets:
            auto = "cuda" if torch.cuda.is_available() else "cpu"
            dev = torch.device(auto if spec.model.device == "auto" else spec.model.device)
            hf, tok = load_model(resolve_model(spec.model.target, what="model.target"), device=dev, dtype=getattr(torch, spec.model.dtype))
            self._targets[key] = (LeanLM.from_hf(hf, what="model.target"), tok, dev)
        return self._targets[key]

    def _engine(self, spec):
        from workbench.drafter_init import drafter_as_run
        from workbench.models import resolve_model
        from workbench.rollout.engine import RolloutEngine

        lm, tok, dev = self._target(spec)
        dkey = (spec.model.target, spec.model.dtype, spec.model.device,
                json.dumps(spec.drafter.model_dump(mode="json", exclude={"k"}), sort_keys=True))
        if dkey not in self._drafters:  # as `wb run` builds it (init checkpoint, eagle3's V/4 draft vocabulary)
            path = resolve_model(spec.model.target, what="model.target")
            self._drafters[dkey] = drafter_as_run(spec, lm, tok, path, dev)
        return RolloutEngine(lm, self._drafters[dkey], k=spec.drafter.k, max_batch_size=spec.rollout.max_batch_size,
                             continuous=spec.rollout.continuous_batching)

    def _sampling(self, spec, max_new: int, eos: bool):
        from workbench.models import resolve_model
        from workbench.models.chat import generation_config_of, run_prompt_format
        from workbench.rollout.sampling import SamplingParams

        r = spec.rollout
        tok = self._target(spec)[1]
        stops = run_prompt_format(spec.task, tok).stop_token_ids(generation_config_of(resolve_model(spec.model.target))) if eos else ()
        return SamplingParams(r.temperature, r.top_p, r.top_k, max_new, tok.eos_token_id if eos else None, stops)

    def lengths(self, run: SweepRun) -> list[list[int]]:
        """Completion lengths of ``length_batches`` GRPO-shaped batches (prompts_per_step prompts ×
        group_size) sampled by the target (autoregressive, EOS on) from random task prompts; fixed seeds."""
        import random

        import torch

        from workbench.models.chat import run_prompt_format
        from workbench.tasks.loading import spec_task_data

        spec = spec_from_params(run.params)
        lm, tok, dev = self._target(spec)
        t, g = spec.task, spec.grpo
        data = spec_task_data(t, "train", t.num_train, spec.seed)
        rng = random.Random(spec.seed)
        fmt = run_prompt_format(t, tok)
        engine = self._engine(spec.model_copy(update={"drafter": spec.drafter.model_copy(update={"kind": "none"})}))
        sp = self._sampling(spec, spec.rollout.max_new_tokens, eos=True)
        gen = torch.Generator(dev).manual_seed(spec.seed)
        out = []
        with torch.no_grad():
            for _ in range(self.length_batches):
                prompts = [fmt.encode(data[rng.randrange(len(data))]["prompt"]) for _ in range(g.prompts_per_step)]
                prompts = [p for p in prompts for _ in range(g.group_size)]
                out.append([len(x) for x in engine.generate(prompts, sp, gen).tokens])
        wk = workload_key(run.params)
        self._prompts[wk] = prompts[: run.chunk]
        self._mean_len[wk] = float(np.mean([x for b in out for x in b]))
        return out

    def step_costs(self, runs: list[SweepRun], progress=lambda s: None) -> dict[str, StepCost]:
        """:class:`StepCost` per :func:`config_key` of ``runs``: seconds per engine step at
        n = 1, N/8, N/4, N/2, 3N/4, N rows (N = the run's chunk; EOS ignored so n stays constant),
        from the difference of an m1- and an m2-token generation, fitted a + b·n."""
        import torch

        from workbench.timing import timed

        cells = {}  # config key -> (engine, prompts, m1, m2, device)
        for run in runs:
            ck = config_key(run.params)
            if ck in cells:
                continue
            spec = spec_from_params(run.params)
            wk = workload_key(run.params)
            if wk not in self._prompts:
                progress(f"sampling completion lengths for {wk}")
                self.lengths(run)
            m1 = max(2, min(8, spec.rollout.max_new_tokens // 2))
            m2 = int(min(spec.rollout.max_new_tokens, max(m1 + 8, round(self._mean_len[wk]))))
            cells[ck] = (spec, self._engine(spec), self._prompts[wk], m1, m2, self._target(spec)[2])

        def sizes(N: int) -> list[int]:
            return sorted({1, max(1, N // 8), max(1, N // 4), max(1, N // 2), max(1, 3 * N // 4), N})

        # (n, m) -> every config measured there back to back, so a change of machine load between
        # cells shifts the configs together and their ratios (what the prediction uses) stay put
        order: dict[tuple[int, int], list[str]] = {}
        for ck, (spec, engine, prompts, m1, m2, dev) in cells.items():
            for n in sizes(len(prompts)):
                for m in (m1, m2):
                    order.setdefault((n, m), []).append(ck)
        best: dict[tuple, tuple[float, int]] = {}  # (config, n, m) -> (fastest seconds, verification steps)
        with torch.no_grad():
            for rnd in range(self.reps + 1):  # round 0 warms up and is not kept
                progress(f"timing engine steps of {len(cells)} configurations, round {rnd}/{self.reps}")
                for (n, m), cks in sorted(order.items()):
                    for ck in cks:
                        spec, engine, prompts, m1, m2, dev = cells[ck]
                        N = len(prompts)
                        rows = [prompts[i * N // n] for i in range(n)]
                        sp = self._sampling(spec, m, eos=False)
                        dt, res = timed(lambda: engine.generate(rows, sp, torch.Generator(dev).manual_seed(0)), dev)
                        if rnd and ((ck, n, m) not in best or dt < best[(ck, n, m)][0]):
                            best[(ck, n, m)] = (dt, res.counters.num_verify_steps)
        out = {}
        for ck, (spec, engine, prompts, m1, m2, dev) in cells.items():
            grid = {}
            for n in sorted({n for (c, n, m) in best if c == ck}):
                (t1, s1), (t2, s2) = best[(ck, n, m1)], best[(ck, n, m2)]
                grid[n] = (t2 - t1) / max(s2 - s1, 1)
            a, b = fit_affine(list(grid), list(grid.values()))
            N = max(grid)
            t1, s1 = best[(ck, N, m1)]
            # per-batch cost: what the fitted steps leave of the short run at the full batch
            out[ck] = StepCost(max(t1 - s1 * (a + b * N), 0.0), a, b, grid)
        return out


def measure(pairs: list[tuple[SweepRun, SweepRun]], threads: int | None = None, reps: int = 3,
            progress=lambda s: None) -> tuple[dict[str, StepCost], dict[str, list[list[int]]], dict]:
    """Step costs and completion lengths of every (point, baseline) pair, measured here and now.

    ``threads``: torch threads (match the sweep's; None: torch's default). Returns (step costs per
    :func:`config_key`, lengths per :func:`workload_key`, meta: date, threads, reps, device).
    """
    import time

    import torch

    if threads:
        torch.set_num_threads(threads)
    bench = EngineBench(reps=reps)
    lengths: dict[str, list[list[int]]] = {}
    for r, b in pairs:
        wk = workload_key(b.params)
        if wk not in lengths:
            progress(f"sampling completion lengths ({b.params.get('model.target')}, {b.rows} rows × {bench.length_batches})")
            lengths[wk] = bench.lengths(b)
    step_costs = bench.step_costs(list({r.run_id: r for pair in pairs for r in pair}.values()), progress=progress)
    meta = {"date": time.strftime("%Y-%m-%d %H:%M:%S"), "threads": torch.get_num_threads(), "reps": reps,
            "device": "cuda" if torch.cuda.is_available() else "cpu"}
    return step_costs, lengths, meta
