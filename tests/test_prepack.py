"""rollout.prepack_weights: linear weights packed once for oneDNN (workbench.rollout.packing.prepack).

Each test builds its own model: the packed registry is process-wide, and the session's shared
models must keep F.linear's numerics for the other tests.
"""

import gc

import pytest
import torch
import torch.nn.functional as F

from drafters.draft_model import DraftModelDrafter
from workbench.rollout import layers, packing
from workbench.rollout.model import LeanLM
from workbench.rollout.packing import linear, prepack, unpack
from workbench.rollout.sampling import SamplingParams
from workbench.rollout.workbench_backend import WorkbenchBackend
from workbench.specs.load import load_spec
from workbench.specs.resolve import rollout_config

from conftest import PROMPTS, SMALL_V, assert_rollouts_follow_target, greedy, random_llama

pytestmark = pytest.mark.skipif(
    not torch.backends.mkldnn.is_available(), reason="needs oneDNN (mkldnn) in this torch build"
)


@pytest.mark.parametrize("rows", [1, 4, 16])
def test_packed_linear_equals_f_linear(rows):
    w, b = torch.randn(96, 64), torch.randn(96)
    prepack(w, rows_hint=16)
    try:
        for x in (torch.randn(rows, 64), torch.randn(rows, 3, 64), torch.randn(3, rows, 64).transpose(0, 1)):
            assert torch.allclose(linear(x, w), F.linear(x, w), atol=1e-4)
            assert torch.allclose(linear(x, w, b), F.linear(x, w, b), atol=1e-4)
    finally:
        unpack(w)


def test_in_place_write_is_packed_again():
    """The weight sync copies into the weight: the next call must use the new values, not the packed old ones."""
    w, x = torch.randn(32, 16), torch.randn(packing.PACKED_MIN_ROWS + 3, 16)
    prepack(w)
    try:
        linear(x, w)
        new = torch.randn(32, 16)
        w.copy_(new)  # as load_state_dict does
        assert torch.allclose(linear(x, w), F.linear(x, new), atol=1e-4)
        with torch.no_grad():
            w.mul_(2.0)  # as an optimiser step does
        assert torch.allclose(linear(x, w), F.linear(x, 2.0 * new), atol=1e-4)
    finally:
        unpack(w)


def test_few_rows_take_f_linear_bit_for_bit(monkeypatch):
    w = torch.randn(64, 64)
    prepack(w)
    try:
        x = torch.randn(packing.PACKED_MIN_ROWS - 1, 64)
        assert torch.equal(linear(x, w), F.linear(x, w))
        calls = []
        monkeypatch.setattr(F, "linear", lambda *a: calls.append(1) or torch.zeros(()))
        linear(torch.randn(packing.PACKED_MIN_ROWS, 64), w)
        assert not calls  # at the threshold the packed kernel runs
    finally:
        unpack(w)


def test_autograd_calls_take_f_linear():
    """A drafter trained online runs its forward under autograd: the packed kernel has no backward."""
    # fixed inputs: the comparison below has float32 sums of both orders on each side
    g = torch.Generator().manual_seed(0)
    w = torch.randn(16, 8, generator=g).requires_grad_(True)
    prepack(w)
    try:
        x = torch.randn(packing.PACKED_MIN_ROWS * 2, 8, generator=g)
        linear(x, w).sum().backward()
        assert torch.allclose(w.grad, x.sum(0).expand(16, 8))
    finally:
        unpack(w)


def test_registry_forgets_freed_weights_and_unpacked_ones():
    gc.collect()  # earlier tests' models still awaiting collection would leave the registry during this test
    n = len(packing._PACKED)
    w, v = torch.randn(8, 8), torch.randn(8, 8)
    prepack(w), prepack(v)
    assert len(packing._PACKED) == n + 2
    del w
    gc.collect()
    assert len(packing._PACKED) == n + 1
    unpack(v)
    assert len(packing._PACKED) == n


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_prepack_refuses_other_dtypes_naming_the_field(dtype):
    with pytest.raises(ValueError, match="rollout.prepack_weights"):
        prepack(torch.randn(8, 8, dtype=dtype))


def test_packed_model_logits_and_weight_sync():
    hf = random_llama(seed=3)
    ref, packed = LeanLM.from_hf(hf), LeanLM.from_hf(hf)
    packed.enable_prepack(8, min_rows=1)
    ids = torch.randint(3, 48, (3, 10))  # every call runs the packed kernel
    a, _ = ref(ids, torch.zeros(3, dtype=torch.long), ref.new_cache(3, 16))
    b, _ = packed(ids, torch.zeros(3, dtype=torch.long), packed.new_cache(3, 16))
    assert torch.allclose(a, b, atol=1e-4)
    # the trainer moves the policy; the sync copies it in place and the packed forward follows
    with torch.no_grad():
        for p in hf.parameters():
            p.add_(0.05 * torch.randn_like(p))
    packed.load_weights(hf)
    fresh = LeanLM.from_hf(hf)
    c, _ = packed(ids, torch.zeros(3, dtype=torch.long), packed.new_cache(3, 16))
    d, _ = fresh(ids, torch.zeros(3, dtype=torch.long), fresh.new_cache(3, 16))
    assert torch.allclose(c, d, atol=1e-4) and not torch.allclose(c, b, atol=1e-3)


def test_packed_engine_greedy_speculative_equals_plain():
    hf = random_llama(seed=4)
    target, draft = LeanLM.from_hf(hf), LeanLM.from_hf(random_llama(layers=1, seed=5))
    spec = WorkbenchBackend(target, DraftModelDrafter(draft), k=3, prepack=True)
    plain = WorkbenchBackend(target, prepack=True)
    sp = greedy(24)
    assert spec.generate(PROMPTS, sp).tokens == plain.generate(PROMPTS, sp).tokens
    assert id(draft.lm_head.weight) in packing._PACKED  # the draft model's weights were packed too


def test_packed_engine_sampled_speculative_rollouts_follow_target():
    """The chi-square law test of test_engine.py with both models packed (verification runs the packed kernel:
    n rows x (k + 1) tokens per call)."""
    target_hf = random_llama(vocab=SMALL_V, hidden=32, seed=20, lm_head_std=0.6)
    target, draft = LeanLM.from_hf(target_hf), LeanLM.from_hf(target_hf)
    draft.lm_head.weight.add_(0.3 * torch.randn(draft.lm_head.weight.shape, generator=torch.Generator().manual_seed(2)))
    target.enable_prepack(64, min_rows=1), draft.enable_prepack(64, min_rows=1)
    assert_rollouts_follow_target(
        target, DraftModelDrafter(draft), [1, 3, 4, 3, 4], SamplingParams(temperature=1.0, max_new_tokens=3)
    )


def test_the_builder_and_bench_pass_the_option():
    from workbench.bench import Bench, BenchConfig
    from workbench.rollout_builder import build_backend
    from workbench.specs.resolve import rollout_config

    spec = load_spec("quickstart", ["rollout.prepack_weights=true", "model.device=cpu"])
    lm = LeanLM.from_hf(random_llama(seed=7))
    build_backend(rollout_config(spec), lm)
    assert id(lm.lm_head.weight) in packing._PACKED
    b = Bench(spec, BenchConfig(batch_sizes=(1,), max_new_tokens=4, repeats=1, model_batch=1, hf=False))
    b._ar_engine()
    assert id(b.target.model.layers[0].mlp.down_proj.weight) in packing._PACKED


def test_packed_weights_are_the_default_wherever_they_apply_and_the_path_is_tagged():
    from workbench.rollout_builder import EngineConfig, build_backend, packs_weights
    from workbench.specs.resolve import rollout_config
    from workbench.tags import TAG_ENGINE_PATH

    lm = LeanLM.from_hf(random_llama(seed=7))
    spec = load_spec("quickstart", ["model.device=cpu"])
    assert spec.rollout.prepack_weights is None  # null: decided from the engine and the weights
    backend = build_backend(rollout_config(spec), lm)
    assert packing.is_packed(lm.lm_head.weight)
    assert backend.tags[TAG_ENGINE_PATH] == "eager, packed weights"
    assert packs_weights(EngineConfig(prepack=None), lm)
    assert not packs_weights(EngineConfig(prepack=None, compile=True), lm)  # compiled: packed only when asked
    assert not packs_weights(EngineConfig(prepack=False), lm)
    assert not packs_weights(EngineConfig(prepack=None), LeanLM.from_hf(random_llama(seed=7)).to(torch.bfloat16))
    off = load_spec("quickstart", ["model.device=cpu", "rollout.prepack_weights=false"])
    lm2 = LeanLM.from_hf(random_llama(seed=7))
    assert build_backend(rollout_config(off), lm2).tags[TAG_ENGINE_PATH] == "eager"
    assert not packing.is_packed(lm2.lm_head.weight)


def test_spec_refuses_prepack_with_cuda_graphs_and_with_vllm():
    load_spec("membound", ["rollout.prepack_weights=true", "rollout.compile=true"])  # compiled + packed: allowed
    with pytest.raises(Exception, match="rollout.prepack_weights"):
        load_spec("membound", ["rollout.prepack_weights=true", "rollout.cuda_graphs=true"])
    from workbench.specs.resolve import admission_config
    from workbench.vllm import check_vllm_run

    with pytest.raises(ValueError, match="rollout.prepack_weights"):
        check_vllm_run(admission_config(load_spec("membound", ["rollout.prepack_weights=true"])))


def _ops(fn) -> set[str]:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn()
    return {e.name for e in prof.events()}


def test_compiled_step_runs_the_packed_gemms_and_follows_the_weight_sync():
    """rollout.compile with packed weights: the compiled graph calls workbench::packed_linear, which runs oneDNN's
    packed kernel (not F.linear), gives eager's logits, and repacks after an in-place weight sync."""
    hf = random_llama(seed=8)
    ref, lm = LeanLM.from_hf(hf), LeanLM.from_hf(hf)
    lm.enable_compile()
    lm.enable_prepack(8, min_rows=1)
    # one shape for both calls, so the test pays one compilation
    prompt = torch.randint(3, 48, (3, 4), generator=torch.Generator().manual_seed(0))
    ids, start = torch.randint(3, 48, (3, 4)), torch.full((3,), 4, dtype=torch.long)

    def step(model):
        cache = model.new_cache(3, 16)
        model(prompt, torch.zeros(3, dtype=torch.long), cache)
        return model(ids, start, cache)[0]  # (3, 4, V): a verification-shaped step, compiled

    with torch.no_grad():
        a = step(ref)
        ops = _ops(lambda: step(lm))
        assert "workbench::packed_linear" in ops and "mkldnn::_linear_pointwise" in ops
        assert torch.allclose(step(lm), a, atol=1e-4)
        for p in hf.parameters():
            p.add_(0.05 * torch.randn_like(p))
        ref.load_weights(hf), lm.load_weights(hf)
        b = step(lm)
        assert torch.allclose(b, step(ref), atol=1e-4) and not torch.allclose(b, a, atol=1e-3)


def test_a_graph_alias_of_a_packed_weight_finds_its_packed_copy():
    """A compiled graph may pass its custom op another tensor object over the registered storage."""
    w = torch.randn(32, 16)
    prepack(w, min_rows=1)
    try:
        alias = w.detach()
        assert alias is not w and packing._entry(alias) is packing._entry(w) is not None
        assert packing._entry(w[:16]) is None  # another shape over the same storage is not it
        x = torch.randn(4, 16)
        assert torch.allclose(packing.packed_linear(x, alias), F.linear(x, w), atol=1e-4)
    finally:
        unpack(w)
    assert packing._entry(w.detach()) is None


def test_cost_curves_of_packed_weights_are_cached_apart():
    """A forward curve measured with packed weights is not read back for unpacked ones (or the reverse):
    curve_key includes the flag (adaptive k and speedup/gen_modeled price steps with these curves)."""
    from workbench.perf.cost_curve import curve_key

    lm = LeanLM.from_hf(random_llama(seed=3))
    plain_key, fields = curve_key(lm, {"what": "forward"})
    assert "prepacked" not in fields
    lm.enable_prepack()
    packed_key, fields = curve_key(lm, {"what": "forward"})
    assert fields["prepacked"] == 2 and packed_key != plain_key  # 2: fused q/k/v and gate/up, per-shape thresholds
    for m in lm.modules():
        if isinstance(m, torch.nn.Linear):
            unpack(m.weight)
    assert curve_key(lm, {"what": "forward"})[0] == plain_key


# --- fused weights and per-shape thresholds (workbench.prepack_rows) ---


def test_choose_min_rows_is_the_start_of_the_packed_kernels_winning_run():
    from workbench.prepack_rows import choose_min_rows

    plain = {1: 1.0, 2: 1.0, 4: 4.0, 8: 5.0, 16: 9.0}
    assert choose_min_rows(plain, {1: 2.0, 2: 2.0, 4: 3.0, 8: 4.0, 16: 5.0}) == 4
    assert choose_min_rows(plain, {1: 0.5, 2: 0.5, 4: 3.0, 8: 4.0, 16: 5.0}) == 1
    # a win below a loss does not count: the run must reach the largest row count
    assert choose_min_rows(plain, {1: 0.5, 2: 2.0, 4: 3.0, 8: 6.0, 16: 5.0}) == 16
    # lost at the largest: never packed below 32
    assert choose_min_rows(plain, {1: 0.5, 2: 0.5, 4: 3.0, 8: 4.0, 16: 10.0}) == 32
    with pytest.raises(ValueError, match="same row counts"):
        choose_min_rows({1: 1.0}, {2: 1.0})


def test_measured_min_rows_measures_once_per_shape_and_hint(monkeypatch, tmp_path):
    from workbench import prepack_rows

    monkeypatch.setenv("WB_CACHE_DIR", str(tmp_path))
    calls = []

    def fake(o, i, hint):
        calls.append((o, i, hint))
        return {1: 1.0, 4: 2.0}, {1: 2.0, 4: 1.0}

    monkeypatch.setattr(prepack_rows, "time_kernels", fake)
    assert prepack_rows.measured_min_rows(96, 64, 16) == 4
    assert prepack_rows.measured_min_rows(96, 64, 16) == 4  # read back from the cache file
    assert prepack_rows.measured_min_rows(96, 64, 8) == 4
    assert calls == [(96, 64, 16), (96, 64, 8)]
    entry = next(iter(prepack_rows._read().values()))
    assert entry["shape"] == [96, 64] and entry["plain_us"] and "load_avg_1m" in entry


def test_time_kernels_times_both_kernels_at_each_row_count():
    from workbench.prepack_rows import time_kernels

    plain, packed = time_kernels(32, 16, 4, rows=(1, 4), rounds=3, round_s=1e-4)
    assert set(plain) == set(packed) == {1, 4} and all(v > 0 for v in [*plain.values(), *packed.values()])


def test_packed_model_runs_four_gemms_a_layer_with_fused_weights(monkeypatch):
    """enable_prepack fuses q/k/v and gate/up: 4 linear calls per layer, not 7; the
    Linears' parameters view the fused tensors, so the weight sync still reaches them."""
    hf = random_llama(seed=8)
    lm = LeanLM.from_hf(hf)
    lm.enable_prepack(8, min_rows=1)
    a = lm.model.layers[0].self_attn
    assert packing.packed_min_rows(lm.__dict__["_fused"][0][0]) == 1
    assert a.q_proj.weight.data_ptr() == lm.__dict__["_fused"][0][0].data_ptr()
    calls = []
    real = layers.linear
    monkeypatch.setattr(layers, "linear", lambda x, w, b=None: calls.append(tuple(w.shape)) or real(x, w, b))
    ids = torch.randint(3, 48, (2, 5))
    with torch.no_grad():
        lm(ids, torch.zeros(2, dtype=torch.long), lm.new_cache(2, 8))
    assert len(calls) == 4 * lm.cfg.num_layers
    c = lm.cfg
    qkv = (c.num_heads + 2 * c.num_kv_heads) * c.head_dim
    assert calls[:2] == [(qkv, c.hidden_size), (c.hidden_size, c.num_heads * c.head_dim)]


def test_in_place_write_to_a_fused_weights_parameter_repacks_it():
    """The q/k/v parameters are views of the fused tensor with version counters of their own: a write to
    one (an optimiser step, a copy) must still reach the packed forward."""
    lm = LeanLM.from_hf(random_llama(seed=9))
    ref = LeanLM.from_hf(random_llama(seed=9))
    lm.enable_prepack(8, min_rows=1)
    ids = torch.randint(3, 48, (2, 5))

    def logits(m):
        return m(ids, torch.zeros(2, dtype=torch.long), m.new_cache(2, 8))[0]

    assert torch.allclose(logits(lm), logits(ref), atol=1e-4)
    with torch.no_grad():
        for m in (lm, ref):
            m.model.layers[0].self_attn.v_proj.weight.mul_(-1.5)
            m.model.layers[1].mlp.up_proj.weight.add_(0.1)
    assert torch.allclose(logits(lm), logits(ref), atol=1e-4)


def test_enable_prepack_refuses_before_fusing_anything():
    lm = LeanLM.from_hf(random_llama(seed=10)).to(torch.float64)
    with pytest.raises(ValueError, match="rollout.prepack_weights"):
        lm.enable_prepack()
    assert "_fused" not in lm.__dict__


def test_wb_builds_engines_with_measured_thresholds(monkeypatch):
    """The builder every CLI path builds through (GRPO's backend, the bench) passes
    workbench.prepack_rows.measured_min_rows; the rollout layer itself defaults to PACKED_MIN_ROWS (it
    imports nothing above it)."""
    from workbench import rollout_builder

    seen = []
    monkeypatch.setattr(rollout_builder, "measured_min_rows", lambda o, i, hint: seen.append((o, i)) or 3)
    spec = load_spec("quickstart", ["rollout.prepack_weights=true", "model.device=cpu"])
    lm = LeanLM.from_hf(random_llama(seed=11))
    rollout_builder.build_backend(rollout_config(spec), lm)
    assert seen and packing.packed_min_rows(lm.lm_head.weight) == 3
    plain = LeanLM.from_hf(random_llama(seed=12))
    WorkbenchBackend(plain, prepack=True)
    assert packing.packed_min_rows(plain.lm_head.weight) == packing.PACKED_MIN_ROWS


def test_measured_min_rows_remeasures_a_damaged_cache(monkeypatch, tmp_path):
    """A cache file cut short, or an entry without its threshold, is measured again, not an error."""
    from workbench import prepack_rows

    monkeypatch.setenv("WB_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(prepack_rows, "time_kernels", lambda o, i, hint: ({1: 1.0, 4: 2.0}, {1: 2.0, 4: 1.0}))
    prepack_rows._path().write_text('{"abc": {"min_ro')
    assert prepack_rows.measured_min_rows(96, 64, 16) == 4
    data = prepack_rows._read()
    (key,) = data
    data[key].pop("min_rows")
    prepack_rows._path().write_text(__import__("json").dumps(data))
    assert prepack_rows.measured_min_rows(96, 64, 16) == 4
    assert prepack_rows._read()[key]["min_rows"] == 4


def test_a_compiled_target_builds_its_plain_and_speculative_engines():
    """`wb bench --compile` compiles the target, then builds its engines with rollout.prepack_weights left null:
    that used to raise (packing was refused after compiling); now compiled engines are tagged as such."""
    from workbench.rollout_builder import EngineConfig, plain_backend, workbench_backend
    from workbench.tags import TAG_ENGINE_PATH

    target = LeanLM.from_hf(random_llama(seed=9))
    target.enable_compile()
    plain = plain_backend(target, EngineConfig(compile=True))
    spec = workbench_backend(
        target,
        DraftModelDrafter(LeanLM.from_hf(random_llama(layers=1, seed=5))),
        2,
        EngineConfig(compile=True, prepack=True),
    )
    assert plain.tags[TAG_ENGINE_PATH] == "compiled"
    assert spec.tags[TAG_ENGINE_PATH] == "compiled, packed weights" and packing.is_packed(target.lm_head.weight)
