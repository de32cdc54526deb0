"""Issue #24 (the engine under an expert's review), items 1, 2, 4, 5 and 6: each test failed before its fix.

1. compiled steps that return the drafter's hidden states (mtp, eagle3) run the compiled graph;
2. ``enable_compile`` is idempotent and marks the weights' addresses static (CUDA graphs read
   them in place); gpu.sh makes a skipped CUDA graph fail;
4. the torch lower bound admits only versions whose SDPA has ``enable_gqa``;
5. gpu.sh's qwen3 sets have Qwen3's real vocabulary (the smoke run's checkpoint is checked in
   tests/test_gpu_script.py);
6. ``MasterAdamW.step`` reads the device once, and ``evaluate()`` leaves later rollouts unchanged.
"""

import re
import shutil
from pathlib import Path

import pytest
import tomllib
import torch

from workbench.rollout.model import LeanLM

from conftest import random_llama

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(
    not any(shutil.which(c) for c in ("g++", "c++", "clang++")), reason="torch.compile on CPU needs a C++ compiler"
)
def test_compiled_step_returns_hidden_states_through_the_graph():
    """mtp/eagle3 ask for hidden layers on every step; the compiled callable must run those steps
    (it used to fall back to eager) and give the eager logits and hidden states."""
    hf = random_llama(layers=2, seed=3)
    lm, ref = LeanLM.from_hf(hf), LeanLM.from_hf(hf)
    lm.enable_compile()
    real, calls = lm.__dict__["_compiled"], []
    lm.__dict__["_compiled"] = lambda *a: calls.append(a) or real(*a)
    ids, start = torch.tensor([[1, 5, 9, 12], [1, 4, 4, 7]]), torch.tensor([0, 2])
    c_lm, c_ref = lm.new_cache(2, 16), ref.new_cache(2, 16)
    for step in range(2):  # a prefill-like step then a verification-like one, both at hidden layers (0, 2)
        (a, ha), (b, hb) = (
            lm(ids, start + 4 * step, c_lm, hidden_layers=(0, 2)),
            ref(ids, start + 4 * step, c_ref, hidden_layers=(0, 2)),
        )
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
        assert set(ha) == set(hb) == {0, 2}
        for i in hb:
            torch.testing.assert_close(ha[i], hb[i], atol=1e-5, rtol=1e-5)
    (a, ha), (b, _) = lm(ids[:, :1], start + 8, c_lm), ref(ids[:, :1], start + 8, c_ref)  # no hidden states asked
    torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    assert ha == {} and len(calls) == 3


def test_enable_compile_twice_keeps_weights_pool_and_callable():
    """`wb bench` enables compile once per drafter and k: a second call must not re-fuse the weights
    (new storage: graphs re-recorded) nor replace the cache pool or the compiled callable."""
    lm = LeanLM.from_hf(random_llama(layers=2, seed=6))
    lm.enable_compile(cuda_graphs=True)  # wraps only; nothing compiles here
    fused = [(q.data_ptr(), g.data_ptr()) for q, g in lm.__dict__["_fused"]]
    pool, compiled, flat = lm.__dict__["_pool"], lm.__dict__["_compiled"], lm.__dict__["_flat"]
    lm.enable_compile(cuda_graphs=True)
    assert [(q.data_ptr(), g.data_ptr()) for q, g in lm.__dict__["_fused"]] == fused
    assert lm.__dict__["_pool"] is pool and lm.__dict__["_compiled"] is compiled and lm.__dict__["_flat"] is flat
    assert lm.model.layers[1].self_attn.q_proj.weight.data_ptr() == fused[1][0]
    lm.enable_compile()  # the other mode: a new callable, the same fused weights
    assert [(q.data_ptr(), g.data_ptr()) for q, g in lm.__dict__["_fused"]] == fused and not lm.cuda_graphs


def test_compiled_weights_and_rope_tables_have_static_addresses():
    """Without a static address cudagraph trees copy a plain-tensor input into the graph's own
    buffer on every replay: the fused q/k/v and gate/up weights (not parameters) and the RoPE tables."""
    if not hasattr(torch._dynamo, "mark_static_address"):
        pytest.skip("this torch has no mark_static_address")
    lm = LeanLM.from_hf(random_llama(layers=1, seed=7))
    lm.enable_compile()
    flat = lm.__dict__["_flat"]
    ((qkv, gu),) = lm.__dict__["_fused"]
    for t in (qkv, gu, lm.rope_cos, lm.rope_sin, flat[0], flat[-1]):
        assert getattr(t, "_dynamo_static_input_type", None) == "unguarded"


def test_gpu_script_fails_loudly_on_a_skipped_cuda_graph():
    """graphs.py promises that gpu.sh's --cuda-graphs runs set TORCHINDUCTOR_CUDAGRAPH_OR_ERROR=1."""
    text = (ROOT / "benchmarks" / "gpu.sh").read_text()
    assert re.search(r'TORCHINDUCTOR_CUDAGRAPH_OR_ERROR=1 run_set "\$\{OURS\[@\]\}"', text)


def test_torch_lower_bound_has_sdpa_enable_gqa():
    """layers.py calls SDPA with enable_gqa, new in torch 2.5."""
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    (torch_dep,) = [d for d in deps if re.match(r"torch\s*[<>=!~]", d)]
    low = re.search(r">=\s*(\d+)\.(\d+)", torch_dep)
    assert low and (int(low[1]), int(low[2])) >= (2, 5), torch_dep


def test_gpu_script_qwen3_sets_have_the_real_vocabulary():
    """A 512-id vocabulary hid the cost of float32 probabilities, top-p sorts and q tensors over
    Qwen3's 151936 ids: both qwen3 sets (GPU and smoke) build their checkpoints at that size."""
    text = (ROOT / "benchmarks" / "gpu.sh").read_text()
    assert "QWEN3_VOCAB=151936" in text
    inits = [line for line in text.splitlines() if line.strip().startswith("init_qwen3 qwen3")]
    assert len(inits) == 4 and all('--vocab-size "$QWEN3_VOCAB"' in line for line in inits)


def test_master_adamw_reads_the_device_once_per_step(monkeypatch):
    """The finite check of half-precision gradients: one device->host read for all parameters
    (it was one per parameter, each a synchronisation on CUDA)."""
    from drafters.training import MasterAdamW

    params = [torch.nn.Parameter(torch.randn(4, 3, dtype=torch.bfloat16)) for _ in range(5)]
    opt = MasterAdamW(params, lr=1e-3)
    for p in params:
        p.grad = torch.randn_like(p)
    reads = []
    monkeypatch.setattr(opt.adamw, "step", lambda: None)  # torch's own AdamW is not what is counted
    for name in ("__bool__", "item", "tolist"):
        orig = getattr(torch.Tensor, name)
        monkeypatch.setattr(torch.Tensor, name, lambda self, *a, _o=orig, _n=name: reads.append(_n) or _o(self, *a))
    assert opt.step() is True
    assert len(reads) == 1, reads
    params[3].grad[0, 0] = float("nan")  # one bad gradient anywhere still skips the step
    monkeypatch.undo()
    assert opt.step() is False


class CountingK:
    """A stateful KPolicy: k_t cycles with the number of updates seen (any eval update shifts it)."""

    def __init__(self, k: int):
        self.k, self.updates = k, 0

    def choose(self, num_rows: int) -> int:
        return self.updates % (self.k + 1)

    def update(self, k_t, num_rows, num_drafts, accepted_per_pos) -> None:
        self.updates += 1


def test_evaluate_leaves_later_rollouts_unchanged():
    """eval_every must not change training: evaluate() used the training generator (greedy
    sampling still draws) and fed its steps to the adaptive-k policy. The next rollouts after an
    evaluate() are the ones without it."""
    from workbench.grpo.trainer import GRPOTrainer
    from workbench.specs import load_spec

    spec = load_spec(
        "micro", ["drafter.kind=draft_model", "tracking.enabled=false", "task.num_eval=4", "rollout.max_new_tokens=12"]
    )
    tr = GRPOTrainer(spec, progress=False)
    bos = tr.tokenizer.bos_token_id if tr.tokenizer.bos_token_id is not None else 1
    prompts = [[bos, 5 + i, 9] for i in range(4)]
    runs = []
    for with_eval in (False, True):
        tr.generator.manual_seed(spec.seed)
        tr.set_k_policy(policy := CountingK(spec.drafter.k))
        first = tr.backend.generate(prompts, tr.sampling, tr.generator)
        if with_eval:
            assert "eval/accuracy" in tr.evaluate()
        second = tr.backend.generate(prompts, tr.sampling, tr.generator)
        runs.append((first.tokens, second.tokens, second.counters.k_per_step, policy.updates))
    assert runs[0] == runs[1]


def test_evaluate_logs_held_out_acceptance():
    """evaluate() reports the drafter's acceptance on the held-out prompts (eval/, eval_sampled/), the
    counters of the very generations it scores; a run without a drafter reports none."""
    from workbench.grpo.trainer import GRPOTrainer
    from workbench.specs import load_spec

    base = ["tracking.enabled=false", "task.num_eval=4", "rollout.max_new_tokens=12", "grpo.eval_sampled=true"]
    tr = GRPOTrainer(load_spec("micro", ["drafter.kind=draft_model", "drafter.k=3", *base]), progress=False)
    ev = tr.evaluate()
    for prefix in ("eval", "eval_sampled"):
        assert 1.0 <= ev[f"{prefix}/acceptance_length"] <= 4.0
        rates = [ev[f"{prefix}/acceptance_rate_pos_{i}"] for i in range(3)]
        assert rates == sorted(rates, reverse=True)  # a later position is accepted only after the earlier
        assert ev[f"{prefix}/acceptance_length"] == pytest.approx(1.0 + sum(rates))
        assert f"{prefix}/num_drafts" not in ev
    plain = GRPOTrainer(load_spec("micro", ["drafter.kind=none", *base]), progress=False).evaluate()
    assert "eval/accuracy" in plain and not any("acceptance" in k for k in plain)
