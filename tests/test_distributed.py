"""Data-parallel GRPO ranks under DeepSpeed ZeRO (grpo.backend=deepspeed; issue #10 part 1).

The split of groups over ranks, the reduction of per-rank metrics, the refusals, and with 2 gloo
ranks on the CPU: one optimiser step on the two halves of a batch equals the single process's
step on the whole batch (ZeRO-2 and ZeRO-3), and `wb run --nproc 2` runs the micro spec to the end
as one MLflow run."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from workbench.grpo.distributed import check_distributed, deepspeed_config, reduce_step_metrics, shard_range
from workbench.specs import load_spec

from test_faults import _env as decoy_env
from test_faults import _no_decoy_ran as no_decoy_ran
from test_faults import decoy_dir  # noqa: F401 (a fixture)

# token_mean over uneven completions, micro-batches of 3 (4 rows per rank: 3 + 1), a KL-free step
OVERRIDES = [
    "grpo.micro_batch_size=3",
    "grpo.eval_every=0",
    "measure.modeled=false",
    "tracking.enabled=false",
    "drafter.kind=none",
    "grpo.lr=1e-2",
    "grpo.max_grad_norm=1e9",
]
REPO = Path(__file__).resolve().parents[1]


def fixed_batch(trainer, n: int = 8, length: int = 24):
    """A fixed batch of n sequences for trainer._train: ids (n, L), completion mask (n, L-1) of uneven
    lengths, rollout logp (n, L-1) and advantages (n,); the same on every rank and in every process."""
    g = torch.Generator().manual_seed(123)
    V = trainer.policy.config.vocab_size
    ids = torch.randint(3, V, (n, length), generator=g)
    mask = torch.zeros(n, length - 1)
    for i in range(n):
        start = 4 + i % 3
        mask[i, start : start + 4 + 2 * i] = 1.0  # 4 .. 18 completion tokens
    logp = -torch.rand(n, length - 1, generator=g) * mask
    adv = torch.randn(n, generator=g)
    return ids.to(trainer.device), mask.to(trainer.device), logp.to(trainer.device), adv.to(trainer.device)


def test_each_rank_owns_a_contiguous_equal_share_of_the_groups():
    parts = [list(range(8))[shard_range(8, r, 4)] for r in range(4)]
    assert parts == [[0, 1], [2, 3], [4, 5], [6, 7]]


def test_step_metrics_take_the_slowest_rank_and_the_spread_of_gen():
    m = reduce_step_metrics(
        [
            {"timing_s/gen": 1.0, "timing_s/step": 2.0, "timing_frac/gen": 0.5, "speedup/gen_modeled": 1.2},
            {"timing_s/gen": 3.0, "timing_s/step": 4.0, "timing_frac/gen": 0.75, "speedup/gen_modeled": 1.4},
        ]
    )
    assert m["timing_s/gen"] == 3.0 and m["timing_s/step"] == 4.0
    assert (m["timing_s/gen_max"], m["timing_s/gen_min"]) == (3.0, 1.0)
    assert m["timing_frac/gen"] == pytest.approx(0.75) and m["speedup/gen_modeled"] == pytest.approx(1.3)


def test_deepspeed_config_is_one_optimiser_step_per_grpo_step():
    spec = load_spec(
        "micro", ["grpo.backend=deepspeed", "grpo.micro_batch_size=3", "grpo.zero_stage=3", "model.dtype=bfloat16"]
    )
    cfg = deepspeed_config(spec.grpo, spec.model.dtype, n_local=4, world_size=2)
    assert (cfg["train_micro_batch_size_per_gpu"], cfg["gradient_accumulation_steps"], cfg["train_batch_size"]) == (
        3,
        2,
        12,
    )
    assert cfg["zero_optimization"]["stage"] == 3 and cfg["bf16"] == {"enabled": True}
    assert cfg["gradient_clipping"] == spec.grpo.max_grad_norm and cfg["optimizer"]["params"]["lr"] == spec.grpo.lr


@pytest.mark.parametrize(
    "overrides,world,needle",
    [
        (["grpo.backend=single"], 2, "grpo.backend=deepspeed"),
        (["grpo.backend=deepspeed", "grpo.prompts_per_step=3"], 2, "multiple of 2"),
        (["grpo.backend=deepspeed", "grpo.async.enabled=true"], 2, "grpo.async.enabled=false"),
    ],
)
def test_what_ranks_cannot_run_is_refused_naming_the_field(overrides, world, needle):
    with pytest.raises(ValueError) as e:
        check_distributed(load_spec("micro", overrides).grpo, world)
    assert needle in str(e.value)


def test_zero_stage_out_of_range_names_the_field():
    for stage in (0, 4):  # 0: DeepSpeed would step on a non-finite float32 gradient there
        with pytest.raises(ValueError, match="zero_stage"):
            load_spec("micro", [f"grpo.zero_stage={stage}"])


EXIT_PROBE = """
import atexit, torch.distributed as dist
atexit.register(lambda: print("initialised at exit:", dist.is_initialized()))  # runs last (atexit is LIFO)
from workbench.grpo.distributed import DataParallel
DataParallel.start("cpu")
print("initialised:", dist.is_initialized())
"""


@pytest.mark.distributed
def test_a_group_formed_by_a_rank_is_destroyed_before_the_interpreter_exits(tmp_path):
    """Left to interpreter teardown, a gloo group can abort the rank (SIGABRT; pytorch/pytorch#190489)."""
    pytest.importorskip("deepspeed")
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])
    r = subprocess.run([sys.executable, "-c", EXIT_PROBE], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "initialised: True" in r.stdout and "initialised at exit: False" in r.stdout, r.stdout


EXIT_RANK_PROBE = """
import atexit, pathlib, sys
from workbench.grpo.distributed import exit_rank
atexit.register(lambda: pathlib.Path("handled").write_text("yes"))
print("unflushed", end="")
exit_rank(3)
print("not reached")
"""


def test_a_rank_ends_with_its_exit_handlers_run_its_output_flushed_and_its_status(tmp_path):
    """`wb run`'s ranks end through exit_rank: MLflow's and the group's exit handlers must still run."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    r = subprocess.run([sys.executable, "-c", EXIT_RANK_PROBE], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert r.returncode == 3 and r.stdout == "unflushed", (r.stdout, r.stderr[-2000:])
    assert (tmp_path / "handled").read_text() == "yes"


def _launch(args: list[str], tmp_path: Path, timeout: int = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.mark.distributed
@pytest.mark.slow
@pytest.mark.timeout(900)  # two ranks start, import DeepSpeed and train: 45-220 s on a loaded 2-core CPU
@pytest.mark.parametrize("stage", [2, 3])
def test_two_ranks_train_as_one_process_on_the_whole_batch(stage, tmp_path):
    pytest.importorskip("deepspeed")
    from workbench.grpo.trainer import GRPOTrainer
    from workbench.run_build import build_parts

    out = tmp_path / "rank0.pt"
    r = _launch([str(REPO / "tests" / "dist_train_worker.py"), str(out), str(stage)], tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    got = torch.load(out)
    assert got["world_size"] == 2

    single = GRPOTrainer(build_parts(load_spec("micro", OVERRIDES), progress=False))
    before = {k: v.detach().clone() for k, v in single.policy.state_dict().items()}
    ids, mask, logp, adv = fixed_batch(single)
    stats = single._train(ids, mask, logp, None, adv)
    for key in ("loss/policy", "grad_norm", "clip_frac", "gen/logprob_abs_diff"):
        assert got["stats"][key] == pytest.approx(stats[key], rel=1e-4, abs=1e-6), key
    moved = 0
    for name, w in single.policy.state_dict().items():
        torch.testing.assert_close(got["state"][name], w, rtol=1e-4, atol=1e-5, msg=name)
        moved += int(not torch.equal(before[name], w))
    assert moved > 0  # the step changed the weights, so the comparison has teeth
    # the ranks agreed to take no step on a zero-signal batch nor on a non-finite gradient
    assert got["after"] == {"zero_signal": (1.0, True), "non_finite": (1.0, True)}


@pytest.mark.distributed
@pytest.mark.slow
@pytest.mark.timeout(900)  # two ranks start, import DeepSpeed and train: 45-220 s on a loaded 2-core CPU
def test_online_drafter_adaptation_keeps_the_ranks_drafters_identical(tmp_path):
    """Each rank trains its drafter on its own rollouts; the gradients are averaged over ranks, so
    the drafters move (lr 1e-2) and stay equal."""
    pytest.importorskip("deepspeed")
    out = tmp_path / "drafters.pt"
    r = _launch([str(REPO / "tests" / "dist_train_worker.py"), str(out), "online"], tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    (before0, after0), (before1, after1) = torch.load(out)
    assert any(not torch.equal(a, b) for a, b in zip(before0, after0))  # adapted
    for a, b in zip(after0, after1):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)


@pytest.mark.distributed
@pytest.mark.slow
@pytest.mark.timeout(900)  # two ranks start, import DeepSpeed and train: 45-220 s on a loaded 2-core CPU
def test_wb_run_nproc_2_finishes_as_one_mlflow_run(decoy_dir):  # noqa: F811 (the imported fixture)
    """Started from a folder holding decoy ``workbench``/``mlflow``/``torch`` packages (tests/test_faults.py),
    so the launcher and both ranks are also shown to run this workbench, not what the working directory holds."""
    pytest.importorskip("deepspeed")
    import mlflow

    from workbench.isolated import python_module

    db = f"sqlite:///{decoy_dir.parent / 'mlflow.db'}"
    args = ["run", "micro", "--nproc", "2", "--quiet", "grpo.backend=deepspeed", "grpo.zero_stage=3"]
    args += ["drafter.kind=ngram", f"tracking.tracking_uri={db}"]
    # no empty PYTHONPATH entry: it would put the working directory, and so the decoys, on sys.path
    path = [str(REPO), *(p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p)]
    env = decoy_env() | {"PYTHONPATH": os.pathsep.join(path)}
    cmd = python_module("workbench.cli", *args, same_workbench=True)
    r = subprocess.run(cmd, cwd=decoy_dir, capture_output=True, text=True, timeout=600, env=env)
    no_decoy_ran(decoy_dir, r.stdout + r.stderr)
    assert r.returncode == 0, r.stderr[-3000:]
    client = mlflow.MlflowClient(db)
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"  # rank 0 alone logs
    run = runs[0]
    assert run.data.tags["workbench.world_size"] == "2" and run.data.params["grpo.backend"] == "deepspeed"
    steps = load_spec("micro").grpo
    tokens = client.get_metric_history(run.info.run_id, "gen/num_tokens")
    assert len(tokens) == steps.steps and all(t.value > 0 for t in tokens)
    hi = client.get_metric_history(run.info.run_id, "timing_s/gen_max")
    lo = client.get_metric_history(run.info.run_id, "timing_s/gen_min")
    assert len(hi) == steps.steps and all(a.value >= b.value > 0 for a, b in zip(hi, lo))
    # every rank's completions count: the whole step's N = prompts_per_step * G rows
    n_rows = steps.prompts_per_step * steps.group_size
    length = client.get_metric_history(run.info.run_id, "completions/mean_length")
    assert all(t.value == pytest.approx(x.value * n_rows) for t, x in zip(tokens, length))
