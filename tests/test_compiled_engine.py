"""The compiled forward: steps that return the drafter's hidden states run the compiled graph, and
``enable_compile`` is idempotent and marks the weights' and RoPE tables' addresses static (CUDA graphs
read them in place).
"""

import shutil

import pytest
import torch

from workbench.rollout.model import LeanLM

from conftest import random_llama


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
