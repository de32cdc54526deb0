"""One way to build a rollout: the spec resolved into the rollout description, and the engines built from it."""

from dataclasses import replace

import pytest

from workbench.grpo.async_rollout import check_async
from workbench.rollout.config import EngineConfig
from workbench.rollout.model import LeanLM
from workbench.rollout_builder import build_backend, eager, engine_config, plain_backend, rollout_target
from workbench.specs import load_spec
from workbench.specs.resolve import rollout_config

from conftest import random_llama


def spec(*overrides):
    return load_spec("quickstart", ["model.device=cpu", *overrides])


class Tok:
    eos_token_id = 2

    def get_vocab(self):
        return {"<|im_end|>": 7}


def test_the_description_carries_every_rollout_field():
    s = spec(
        "rollout.temperature=0.7",
        "rollout.top_p=0.9",
        "rollout.top_k=5",
        "rollout.max_new_tokens=33",
        "rollout.max_batch_size=12",
        "rollout.continuous_batching=false",
        "rollout.fixed_attention_length=true",
        "drafter.kind=ngram",
        "drafter.k=4",
        "seed=9",
    )
    cfg = rollout_config(s)
    sp = cfg.sampling
    assert (sp.temperature, sp.top_p, sp.top_k, sp.max_new_tokens, sp.eos_token_id) == (0.7, 0.9, 5, 33, None)
    # prepack None: rollout.prepack_weights left null, resolved against the weights by the builder
    assert cfg.engine == EngineConfig(max_batch_size=12, continuous=False, fixed_attention_length=True, prepack=None)
    assert (cfg.backend, cfg.k, cfg.drafter.kind, cfg.seed) == ("workbench", 4, "ngram", 9)
    assert rollout_config(s, max_new_tokens=5).sampling.max_new_tokens == 5


def test_a_tokenizer_brings_eos_and_the_generation_configs_stop_ids():
    gen = type("G", (), {"eos_token_id": [2, 11]})()
    sp = rollout_config(spec(), Tok(), gen).sampling
    assert sp.eos_token_id == 2 and sp.stop_ids == (2, 11)


def test_vllm_arguments_resolve_max_num_seqs_from_the_batch_size():
    s = spec("rollout.max_batch_size=24", "model.dtype=bfloat16", "rollout.vllm.cpu_kvcache_space_gib=0.5")
    v = rollout_config(s).vllm
    assert (v.max_num_seqs, v.dtype, v.cpu_kvcache_space_gib) == (24, "bfloat16", 0.5)
    assert rollout_config(spec("rollout.vllm.max_num_seqs=3")).vllm.max_num_seqs == 3


def test_engine_options_reach_the_engine():
    lm = LeanLM.from_hf(random_llama(seed=21))
    cfg = rollout_config(spec("rollout.max_batch_size=6", "drafter.kind=none", "drafter.k=5"))
    be = build_backend(replace(cfg, engine=replace(cfg.engine, retire_buckets=(1, 2, 4))), lm, object())
    e = be.engine
    assert (e.max_batch_size, e.continuous, e.retire_buckets, e.k) == (6, True, (1, 2, 4), 5)
    plain = plain_backend(lm, EngineConfig(max_batch_size=3, continuous=False))
    assert plain.drafter is None and (plain.engine.max_batch_size, plain.engine.continuous) == (3, False)


def test_the_rollout_target_keeps_the_attention_option():
    cfg = rollout_config(spec("rollout.fixed_attention_length=true"))
    assert rollout_target(random_llama(seed=22), cfg).fixed_attention_length is True


def test_eager_drops_compile_graphs_and_packing_only():
    e = engine_config(spec("rollout.prepack_weights=true", "rollout.max_batch_size=7").rollout)
    assert e.prepack and eager(e) == replace(e, prepack=False)


def test_vllm_needs_its_target_and_the_workbench_engine_its_lean_copy():
    with pytest.raises(ValueError, match="VLLMTarget"):
        build_backend(replace(rollout_config(spec()), backend="vllm"), None)
    with pytest.raises(ValueError, match="LeanLM"):
        build_backend(rollout_config(spec()), None)


def test_the_runs_vllm_backend_is_built_only_after_its_admission():
    """grpo.build.build_backend takes the tags vLLM's admission returned; without them it refuses
    before touching the policy (admission comes first: workbench.run_build)."""
    from workbench.grpo.build import build_backend as build_run_backend

    with pytest.raises(ValueError, match="admit the run first"):
        build_run_backend(replace(rollout_config(spec()), backend="vllm"), None, None, None, None)


def test_the_rollout_worker_refuses_vllm_naming_the_field():
    s = spec("grpo.async.enabled=true", "rollout.backend=vllm", "measure.paired=false")
    with pytest.raises(ValueError, match="rollout.backend=workbench"):
        check_async(rollout_config(s), s.paired)


def test_packed_weights_reach_the_engine_through_the_builder():
    """The asynchronous worker builds here too: rollout.prepack_weights packs its LeanLM's weights."""
    from workbench.rollout import packing

    lm = LeanLM.from_hf(random_llama(seed=23))
    build_backend(rollout_config(spec("rollout.prepack_weights=true")), lm)
    assert id(lm.lm_head.weight) in packing._PACKED
