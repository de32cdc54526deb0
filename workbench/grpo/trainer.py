"""The GRPO loop (docs/design.md §3): one :meth:`GRPOTrainer.step` is one GRPO step, top to bottom.

One step: data -> prepare (the policy's weights into the rollout backend) -> gen (speculative or
autoregressive rollouts) -> reward -> logprob (policy, and reference if beta > 0) -> train (GRPO
loss, one optimiser step) -> draft_train (online drafter adaptation, if on). Each stage is timed by
:class:`workbench.timing.StageTimer`; everything measured is returned per step so the caller can
log it (MLflow) and show it (Rich). The trainer builds nothing: its parts (policy, reference,
rollout backend and its paired twin, drafter and its online adaptation, optimiser, data) come from
the builders of :mod:`workbench.grpo.build`; which engine generates is the backend's business
(:mod:`workbench.rollout.backend`).
Method: DeepSeekMath GRPO (arXiv 2402.03300), DAPO's clip-higher/token-mean (2503.14476), Dr. GRPO (2503.20783).
"""

from __future__ import annotations

import contextlib
import random
from typing import Callable

import torch

from drafters.targets import DraftBatch
from drafters.training import capture_hidden
from drafters.training import evaluate as evaluate_drafter
from workbench import metrics as M
from workbench.grpo.advantages import frac_zero_std, group_advantages, has_learning_signal
from workbench.grpo.async_rollout import RolloutWorker
from workbench.grpo.batch import pack_rollouts, sequence_logprobs
from workbench.grpo.build import TrainerParts
from workbench.grpo.completions import completion_metrics
from workbench.grpo.distributed import shard_range
from workbench.grpo.loss import grpo_loss, token_logprobs, truncated_is_weight
from workbench.grpo.mismatch import logprob_gaps
from workbench.grpo.optim_step import optimiser_step
from workbench.grpo.rewards import RewardState, score_rows
from workbench.models.tokenizer import decode_completion
from workbench.rollout.engine import RolloutOutput
from workbench.rollout.graphs import cudagraph_skips
from workbench.rollout.keyed import seeded
from workbench.rollout.paired import generate_interleaved, paired_metrics, twin_divergence
from workbench.rollout.sampling import SamplingParams
from workbench.timing import StageTimer

EVAL_SEED_OFFSET = 2_000_003  # evaluation's RNG stream (a fresh one per evaluate): seed + this


class GRPOTrainer:
    """GRPO steps on built parts (``GRPOTrainer(build_parts(spec))``) with the settings they carry
    (``parts.config``, a :class:`workbench.grpo.config.TrainerConfig`): it never reads the spec.

    ``modeled``: the instrument behind ``speedup/gen_modeled`` (``metrics(out) -> dict``,
    :mod:`workbench.perf.modeled`), None = not logged; ``k_policy``: adaptive speculation's k policy
    (:meth:`set_k_policy`), None = the drafter's fixed k.
    """

    def __init__(self, parts: TrainerParts, modeled=None, k_policy=None):
        self.parts, self.config = parts, parts.config
        cfg = self.config
        self.device, self.dp = parts.ranks.device, parts.ranks.dp
        pol, dr, opt = parts.policy, parts.drafter, parts.optimiser
        self.policy, self.tokenizer, self.ref, self.target_path = pol.model, pol.tokenizer, pol.ref, pol.path
        self.drafter, self.drafter_init_path, self.online = dr.drafter, dr.init_path, dr.online
        self.backend, self.paired = parts.backend, parts.paired  # paired: the plain twin of measure.paired, or None
        self.optimizer, self.train_engine, self.forward = opt.optimizer, opt.train_engine, opt.forward
        self.sampling, self.generator = parts.rollout.sampling, parts.generator
        self.paired_generator = parts.paired_generator
        self.task, self.train_data, self.eval_data = parts.task, parts.train_data, parts.eval_data
        self.rewards = parts.rewards  # the reward functions (workbench.grpo.rewards): task.reward or the task's own
        self.prompt_format = parts.prompt_format  # plain text, or the model's chat template (task.chat_template)
        self.completion_lengths: list[int] = []  # the last step's tokens per completion (N,), grouped by prompt
        self._order: list[int] = []
        self._rng = random.Random(cfg.seed)
        self.timer = StageTimer(self.device)
        # measure.drafter_drift: the drafter measured on each step's fresh rollouts, also when it is not adapted
        self._drift = cfg.drafter_drift and self.drafter is not None and self.drafter.trainable
        # Asynchronous GRPO: rollouts come from a worker process, grpo.async.staleness steps ahead.
        self.is_async = cfg.grpo.async_.enabled
        self.worker: RolloutWorker | None = None  # started with the first step (not while cost curves are measured)
        self._requested: dict[int, tuple[list[dict], list[list[int]], list[int]]] = {}  # step -> rows, prompts, groups
        self._version = 0  # optimiser steps taken (the version of the weights sent to the worker)
        self.modeled = modeled  # speedup/gen_modeled (docs/design.md §8)
        if k_policy is not None:
            self.set_k_policy(k_policy)

    def main_first(self):
        """Rank 0 first, then the others (building into the shared cache); a no-op in one process."""
        return self.parts.ranks.main_first()

    # ------------------------------------------------------------------ one step

    def step(self, step: int, on_stage: Callable[[str], None] | None = None) -> tuple[dict[str, float], list[dict]]:
        """Run one GRPO step; return its metrics and a few rollout samples."""
        g = self.config.grpo
        G = g.group_size
        timer = self.timer
        stage = lambda name: (on_stage(name) if on_stage else None, timer.stage(name))[1]  # noqa: E731
        timer.start_step()

        paired = None
        if self.is_async:
            rows, prompts, out, async_m = self._async_rollouts(step, stage)
        else:
            rows, prompts, out, paired, paired_first = self._sync_rollouts(step, stage)

        with stage("reward"):
            texts = [decode_completion(self.tokenizer, t) for t in out.tokens]
            answers = [r["answer"] for r in rows for _ in range(G)]
            scores = score_rows(self.rewards, rows, G, texts, out.tokens, RewardState(step - 1, g.steps))
            rewards = torch.tensor(scores.total, device=self.device)

        with stage("logprob"):
            ids, mask, rollout_logp = pack_rollouts(prompts, out, self.tokenizer.pad_token_id, self.device)
            temp = self.sampling.temperature or 1.0
            # One optimiser step per batch, so pi_old = pi_theta: the train stage uses its own forward's
            # log p, detached, as old log p (no policy forward here). Online adaptation still needs one,
            # for the hidden states and logits the drafter learns from (detached; docs/design.md §5).
            old_logp = None
            with torch.no_grad():
                if self.online is not None or self._drift:
                    logits: list[torch.Tensor] = []
                    with capture_hidden(self.policy, self.drafter.hidden_layers) as cap:
                        old_logp = sequence_logprobs(self.forward, ids, temp, g.micro_batch_size, keep_logits=logits)
                    # loss mask (N, L): position p's next token is a completion token
                    draft_batch = DraftBatch(
                        ids,
                        torch.nn.functional.pad(mask, (0, 1)),
                        torch.cat(logits),
                        {i: torch.cat(h) for i, h in cap.hidden.items()},
                    )
                ref_logp = sequence_logprobs(self.ref, ids, temp, g.micro_batch_size) if self.ref is not None else None

        with stage("train"):
            batch_std = None
            if g.scale_rewards == "batch" and self.dp is not None:  # the std of the whole step's rewards, every rank's
                batch_std = torch.tensor([r for part in self.dp.gather(rewards.tolist()) for r in part]).std()
            adv = group_advantages(rewards, G, scale_rewards=g.scale_rewards, batch_std=batch_std)
            stats = self._train(ids, mask, rollout_logp, ref_logp, adv, old_logp)
            self._version += 1

        draft_stats: dict[str, float] = {}
        if self.online is not None:
            with stage("draft_train"):
                draft_stats = self.online.update(step, draft_batch)  # measures on the fresh rollouts first
        elif self._drift:  # the frozen drafter on the fresh rollouts (a measurement, outside the step's stages)
            with self.timer.stage("drafter_drift", measurement=True):
                ev = evaluate_drafter(self.drafter, draft_batch)
            draft_stats = {M.DRAFT_TOP1: ev[M.DRAFT_TOP1], M.DRAFT_HELDOUT_LOSS: ev[M.DRAFT_LOSS]}
        if self.config.drafter_drift:
            draft_stats[M.KL_FROM_INIT] = stats["kl"]  # the reference is the initial policy

        m = timer.end_step()
        if self.is_async:
            m.update(async_m)
        if self.modeled is not None:  # this rank's rollouts (averaged over ranks below)
            m.update(self.modeled.metrics(out))
        if self.dp is not None:  # the whole step's rollouts, rewards and slowest-rank timings, on every rank
            m, out, rewards, paired = self.dp.gather_step(m, out, rewards, paired)
        n_tok, self.completion_lengths = out.counters.num_generated_tokens, [len(t) for t in out.tokens]
        m.update(out.counters.metrics())
        if self.backend.k_policy is not None:  # adaptive speculation: the k_t chosen this step
            m.update(out.counters.k_metrics())
        if paired is not None:
            m.update(paired_metrics(m, paired.counters, paired_first) | twin_divergence(out.tokens, paired.tokens))
        if self.config.cuda_graphs:
            m["engine/cudagraph_skips"] = float(cudagraph_skips())  # graphs torch declined to record, so far
        m.update(
            {
                M.TOKENS_PER_S: n_tok / max(m[M.GEN_S], 1e-9),
                M.NUM_TOKENS: float(n_tok),
                M.REWARD_MEAN: rewards.mean().item(),
                **scores.metrics(),
                M.REWARD_STD: rewards.std().item() if rewards.numel() > 1 else 0.0,
                "frac_reward_zero_std": frac_zero_std(rewards, G),
                **completion_metrics(self.completion_lengths, out.finish_reasons),
                **stats,
                **draft_stats,
            }
        )
        samples = [
            {
                "prompt": rows[i // G]["prompt"],
                "completion": texts[i],
                "answer": answers[i],
                "reward": rewards[i].item(),
            }
            for i in range(min(g.num_samples_logged, len(texts)))
        ]
        return m, samples

    # ------------------------------------------------------------------ rollouts

    def _load_weights(self) -> None:
        """The policy's weights (gathered from ZeRO-3 shards) into the rollout backend, and the
        drafter adapted online into the backend's drafter."""
        ctx = self.dp.gathered(self.policy, self.config.grpo.zero_stage) if self.dp else contextlib.nullcontext()
        with ctx:
            self.backend.load_policy_weights(self.policy)
        if self.online is not None:  # in place, as NeMo RL's refit; the adapted drafter is never lost on refit
            self.backend.load_drafter_weights(self.drafter)

    def _sync_rollouts(self, step: int, stage):
        """Step ``step``'s rollouts generated here with the current weights (data, prepare, gen);
        with ``measure.paired``, interleaved forward by forward with plain decoding of the same
        prompts by the backend's twin (docs/design.md §8), whose rollouts are timed and counted,
        never rewarded or trained on. A twin with weights of its own loads them outside the step
        (the measurement ``prepare_autoregressive``)."""
        with stage("data"):
            rows, prompts, group_ids = self._step_prompts()
        with stage("prepare"):
            self._load_weights()
        paired, paired_first = None, step % 2 == 0  # which arm opens alternates per step (and per round inside)
        if self.paired is not None and self.paired.owns_weights:
            with self.timer.stage("prepare_autoregressive", measurement=True):
                self.paired.load_policy_weights(self.policy)
        G, first = self.config.grpo.group_size, len(set(group_ids)) * (self.dp.rank if self.dp else 0)
        # keyed sampling: a seed per row from (seed, step, group, sample)
        sp = seeded(self.sampling, self.config.seed, step, group_ids=group_ids, group_size=G, first_group=first)
        with stage("gen"):
            if self.paired is None:
                out = self.backend.generate(prompts, sp, self.generator, group_ids)
            else:
                (out, paired), (_, ar_s) = generate_interleaved(
                    [
                        self.backend.generate_steps(prompts, sp, self.generator, group_ids),
                        self.paired.generate_steps(prompts, sp, self.paired_generator, group_ids),
                    ],
                    self.timer.now,
                    first=1 if paired_first else 0,
                )
        if paired is not None:
            self.timer.move("gen", "gen_autoregressive", ar_s)
        return rows, prompts, out, paired, paired_first

    def _step_prompts(self) -> tuple[list[dict], list[list[int]], list[int]]:
        """The next step's prompt rows, its N = prompts_per_step * G token-id prompts (groups
        contiguous) and their group ids; with data-parallel ranks, this rank's share of the groups
        (every rank draws the same rows, as one process would, and keeps its slice)."""
        G = self.config.grpo.group_size
        rows = self._next_prompts()
        if self.dp is not None:
            rows = rows[shard_range(len(rows), self.dp.rank, self.dp.world_size)]
        prompt_ids = [self.prompt_format.encode(r["prompt"]) for r in rows]
        return rows, [p for p in prompt_ids for _ in range(G)], [i for i in range(len(rows)) for _ in range(G)]

    def _async_rollouts(self, step: int, stage) -> tuple[list[dict], list[list[int]], RolloutOutput, dict[str, float]]:
        """Step ``step``'s rollouts from the worker (asynchronous GRPO; steps count from 1).

        prepare: the current weights go to the worker (version = optimiser steps so far), then the
        generation of step + s is requested (so it uses them; the first call also requests steps
        1..s with the initial weights). gen_exposed: the wait for this step's rollouts, the part
        of generation the step still pays. Returns the rows, prompts, rollouts and ``async/*`` +
        ``timing_s/gen`` (the worker's own generation seconds, beside the step, not part of it).
        """
        s = self.config.grpo.async_.staleness
        if self.worker is None:
            self.worker = RolloutWorker(
                self.parts.rollout,
                self.config,
                self.target_path,
                self.drafter_init_path,
                self.device,
                threads=max(1, torch.get_num_threads() // 2),
            )
        with stage("data"):
            new = [t for t in range(step, step + s + 1) if t not in self._requested]
            for t in new:  # drawn in step order: the same prompts as a synchronous run
                self._requested[t] = self._step_prompts()
        with stage("prepare"):
            self.worker.send_weights(self._version, self.policy)
            for t in new:
                self.worker.request(t, *self._requested[t][1:])
        with stage("gen_exposed"):
            res = self.worker.receive()
        if res.step != step:
            raise RuntimeError(f"grpo.async: expected the rollouts of step {step}, got step {res.step}")
        rows, prompts, _ = self._requested.pop(step)
        return rows, prompts, res.output, {M.GEN_S: res.seconds, M.STALENESS: float(self._version - res.version)}

    def set_k_policy(self, policy) -> None:
        """Adaptive speculation: ``policy`` (a :class:`workbench.rollout.kpolicy.KPolicy`) chooses each
        step's k_t, here and in the asynchronous rollout worker's engine (which builds its own)."""
        if self.is_async:
            raise ValueError(
                "drafter.adaptive with grpo.async.enabled: the rollout worker has no cost curves yet; "
                "set drafter.adaptive=false or grpo.async.enabled=false"
            )
        self.backend.k_policy = policy

    def close(self) -> None:
        """Stop the rollout worker of asynchronous GRPO and free the rollout backends (idempotent)."""
        if self.worker is not None:
            self.worker.close()
        self.parts.close()

    def _next_prompts(self) -> list[dict]:
        rows = []
        for _ in range(self.config.grpo.prompts_per_step):
            if not self._order:
                self._order = list(range(len(self.train_data)))
                self._rng.shuffle(self._order)
            rows.append(self.train_data[self._order.pop()])
        return rows

    def _train(self, ids, mask, rollout_logp, ref_logp, adv, old_logp=None) -> dict[str, float]:
        """One optimiser step over the whole batch, micro-batched with exact loss weighting.

        ids (N, L); mask, rollout_logp, ref_logp, old_logp (N, L-1); adv (N,). ``old_logp`` None:
        pi_old = pi_theta (this is the batch's only optimiser step), so each micro-batch's own
        log p, detached, is the old log p: ratio exp(logp - logp.detach()) = 1 with gradient
        A * grad log p, as TRL does with one iteration per batch; the policy is not run twice.

        A batch without learning signal (every advantage 0, no KL term) runs no backward and takes no
        optimiser step, nor does a non-finite gradient (``train/step_skipped`` = 1;
        :func:`workbench.grpo.optim_step.optimiser_step`).

        Returns the loss stats and, from the same forward's logits (no extra forward),
        ``gen/logprob_abs_diff`` and ``gen/logprob_truncation_abs_diff`` (workbench.grpo.mismatch;
        nats, mean over completion tokens).
        """
        g = self.config.grpo
        if self.optimizer is not None:
            self.optimizer.zero_grad(set_to_none=True)
        N = ids.shape[0]
        total_tok = mask.sum().clamp_min(1)
        world = 1
        if self.dp is not None:  # weights over the whole step's batch; DeepSpeed averages gradients over ranks
            world = self.dp.world_size
            total_tok = self.dp.sum([float(mask.sum())])[0].clamp_min(1).to(mask.device, mask.dtype)
            N *= world  # every rank holds the same number of sequences
        temp = self.sampling.temperature or 1.0
        # The gradient is exactly zero when every advantage is 0 (every group's rewards equal) and there
        # is no KL term: decided here, before any backward, from what every rank holds, so all ranks agree.
        has_signal = has_learning_signal(adv, g.beta if ref_logp is not None else 0.0)
        if self.dp is not None:
            has_signal = bool(self.dp.sum([float(has_signal)])[0] > 0)
        loss_sum, acc = 0.0, {"clip_frac": 0.0, "kl": 0.0}
        a = g.async_
        use_is = self.is_async and a.importance_sampling == "truncated"
        is_sum = is_capped = 0.0
        gap_sum, trunc_sum = torch.zeros((), device=ids.device), torch.zeros((), device=ids.device)
        for i in range(0, ids.shape[0], g.micro_batch_size):
            sl = slice(i, i + g.micro_batch_size)
            # no signal: the forward for the metrics only
            with contextlib.nullcontext() if has_signal else torch.no_grad():
                full = self.forward(ids[sl]).logits  # (n, L, V)
                logp = token_logprobs(full[:, :-1], ids[sl, 1:], temp)  # (n, L-1), the gradient flows through it
            old = logp.detach() if old_logp is None else old_logp[sl]
            # asynchronous GRPO: the rollouts' behaviour policy is older than pi_old (truncated IS)
            isw = truncated_is_weight(old, rollout_logp[sl], a.is_cap) if use_is else None
            loss, st = grpo_loss(
                logp,
                old,
                adv[sl],
                mask[sl],
                g.clip_low,
                g.clip_high,
                g.loss_agg,
                beta=g.beta,
                ref_logp=None if ref_logp is None else ref_logp[sl],
                max_len=self.sampling.max_new_tokens,
                is_weight=isw,
                kl_ratio_correction=g.use_bias_correction_kl,
            )
            if isw is not None:
                m_sl = mask[sl].to(isw.dtype)
                is_sum += float((isw * m_sl).sum())
                is_capped += float(((isw >= a.is_cap) * m_sl).sum())
            # Weight so the micro-batch sum equals the full-batch aggregate.
            w = (mask[sl].sum() / total_tok) if g.loss_agg == "token_mean" else (ids[sl].shape[0] / N)
            if not has_signal:
                pass  # no backward, no optimiser step: nothing to learn, and AdamW's momentum would move the weights
            elif self.train_engine is None:
                (loss * w).backward()
            else:  # x world: DeepSpeed's mean over ranks then equals the whole batch's sum;
                # step() acts at the last micro-batch
                self.train_engine.backward(loss * w * world, scale_wrt_gas=False)
                self.train_engine.step()
            loss_sum += loss.item() * float(w)
            w_tok = float(mask[sl].sum() / total_tok)  # clip_frac and kl are means over the batch's tokens, as TRL's
            acc["clip_frac"] += st["clip_frac"] * w_tok
            acc["kl"] += st["kl"] * w_tok
            # (n, L-1) each
            gap, trunc = logprob_gaps(full[:, :-1], ids[sl, 1:], logp, rollout_logp[sl], mask[sl], self.sampling)
            gap_sum += gap.sum()
            trunc_sum += trunc.sum()
        grad_norm, skipped = optimiser_step(
            has_signal, self.optimizer, self.train_engine, self.policy.parameters(), g.max_grad_norm
        )
        gap_sum, trunc_sum = float(gap_sum), float(trunc_sum)
        if self.dp is not None:  # each rank's shares of the whole batch's aggregates, summed
            loss_sum, acc["kl"], acc["clip_frac"], gap_sum, trunc_sum, is_sum, is_capped = self.dp.sum(
                [loss_sum, acc["kl"], acc["clip_frac"], gap_sum, trunc_sum, is_sum, is_capped]
            ).tolist()
        out = {
            M.LOSS_POLICY: loss_sum,
            "kl": acc["kl"],
            "clip_frac": acc["clip_frac"],
            "grad_norm": grad_norm,
            M.STEP_SKIPPED: skipped,
            M.LOGPROB_ABS_DIFF: gap_sum / float(total_tok),
            M.LOGPROB_TRUNCATION_ABS_DIFF: trunc_sum / float(total_tok),
        }
        if use_is:  # mean truncated IS weight and the share of tokens at the cap, over completion tokens
            out.update({M.IS_WEIGHT_MEAN: is_sum / float(total_tok), M.IS_CAPPED_FRAC: is_capped / float(total_tok)})
        return out

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """Greedy accuracy on the held-out prompts (speculation is exact, so the drafter is used), with
        its Wilson 95 % interval; with ``grpo.eval_sampled`` also at the rollouts' sampling settings
        (``eval_sampled/*``; keyed: a seed per prompt). Acceptance rides along (``eval/acceptance_length``,
        ...; the eval split is hash-partitioned away from in_domain drafter inits' train split). Training's later
        rollouts stay as without it: its own generator (fresh, seed + EVAL_SEED_OFFSET) and fixed k."""
        if self.eval_data is None or len(self.eval_data) == 0:
            return {}
        self._load_weights()
        prompts = [self.prompt_format.encode(p) for p in self.eval_data["prompt"]]
        rows = self.eval_data.to_list()  # every column: the reward functions get them
        gen = torch.Generator(self.device).manual_seed(
            self.config.seed + EVAL_SEED_OFFSET + (self.dp.rank if self.dp else 0)
        )
        sp = self.sampling
        greedy = SamplingParams(0.0, 1.0, 0, sp.max_new_tokens, sp.eos_token_id, sp.stop_token_ids)
        # keyed: a seed per held-out prompt, not drawn from gen (the greedy arm draws from it once a forward)
        rank = self.dp.rank if self.dp else 0
        sp = seeded(sp, self.config.seed, EVAL_SEED_OFFSET, rank, group_ids=list(range(len(prompts))), group_size=1)
        arms = [(M.EVAL, greedy)] + ([(M.EVAL_SAMPLED, sp)] if self.config.grpo.eval_sampled else [])
        m: dict[str, float] = {}
        policy, self.backend.k_policy = self.backend.k_policy, None
        try:
            for prefix, arm_sp in arms:
                out = self.backend.generate(prompts, arm_sp, gen)
                texts = [decode_completion(self.tokenizer, t) for t in out.tokens]
                state = RewardState(self._version, self.config.grpo.steps)
                m.update(score_rows(self.rewards, rows, 1, texts, out.tokens, state).metrics(prefix, ci=True))
                m.update(M.held_out_spec(prefix, out.counters.metrics()))
        finally:
            self.backend.k_policy = policy
        return m
