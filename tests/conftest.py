"""Shared fixtures: tiny random Llama models (no build, no download) and an isolated cache."""

import json
import os

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from workbench.rollout.model import LeanLM

pytest_plugins = ["isolated_modules"]  # tests/isolated_modules.py: vllm-marked modules run in a subprocess each

MAX_WORKERS = 4  # `-n auto` (pyproject addopts): a worker per core up to this; each builds its own fixtures and servers


def pytest_xdist_auto_num_workers(config):
    """pytest-xdist's worker count for ``-n auto``: one per core, at most :data:`MAX_WORKERS`."""
    return max(1, min(MAX_WORKERS, os.cpu_count() or 1))


def _share_the_cores() -> None:
    """Under pytest-xdist each worker gets its share of the cores as torch threads (and OMP_NUM_THREADS for the
    processes it starts, unless the caller set one): two workers of two threads on two cores would
    oversubscribe OpenMP."""
    n = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if n > 1:
        threads = max(1, (os.cpu_count() or 1) // n)
        os.environ.setdefault("OMP_NUM_THREADS", str(threads))
        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


def _keep_the_callers_terminal_size() -> None:
    """pytest-xdist's workers start with COLUMNS=80 and LINES=24 in their environment whatever the caller had;
    Rich reads COLUMNS as an explicit width, so the tests of piped output (full width, workbench/console.py)
    would see 80 columns. The controller records the caller's values; each worker puts them back."""
    saved = "WB_TEST_CALLER_TERMINAL"
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        os.environ[saved] = json.dumps({k: os.environ.get(k) for k in ("COLUMNS", "LINES")})
        return
    for key, value in json.loads(os.environ.get(saved, "{}")).items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


_keep_the_callers_terminal_size()
_share_the_cores()


def random_llama(vocab=48, hidden=64, layers=2, seed=0, tie=False, lm_head_std=1.0, max_pos=256):
    """A random HF Llama with sharp, diverse next-token distributions (large lm_head weights)."""
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=2 * hidden,
        max_position_embeddings=max_pos,
        tie_word_embeddings=tie,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    hf = LlamaForCausalLM(cfg).eval()
    if not tie:
        torch.nn.init.normal_(hf.lm_head.weight, std=lm_head_std)
    return hf


PROMPTS = [[1, 5, 9, 12, 7], [1, 30, 31], [1], [1, 4, 4, 4, 4, 4, 4, 4, 4, 40, 41], [1, 17, 18, 19, 20, 21, 22]]


def perturbed_draft(target_hf, scale: float):
    """A draft model close to the target (as a distilled one is): the target with its LM head
    perturbed by ``scale`` × N(0, 1) noise (seed 2), so its drafts are often, not always, accepted."""
    from workbench.rollout.model import LeanLM

    draft = LeanLM.from_hf(target_hf)
    draft.lm_head.weight.add_(
        scale * torch.randn(draft.lm_head.weight.shape, generator=torch.Generator().manual_seed(2))
    )
    return draft


def greedy(max_new=40, eos=2):
    """Greedy sampling parameters for token-for-token comparisons."""
    from workbench.rollout.sampling import SamplingParams

    return SamplingParams(temperature=0.0, max_new_tokens=max_new, eos_token_id=eos)


SMALL_V = 8  # vocabulary of the models whose rollout law is enumerated exactly
ALPHA = 1e-4  # false-alarm rate per test; 30k rollouts over <= 512 cells detect a 2-point shift in a likely cell


def exact_joint(lm, prompt, sp, n_tokens):
    """Exact law of the first n_tokens completion tokens by enumeration: (V**n_tokens,) tensor."""
    from workbench.rollout.sampling import probs_from_logits

    # on the model's device (benchmarks/cuda_parity.py runs it on CUDA)
    V, dev = (
        lm.cfg.vocab_size,
        lm.lm_head.weight.device,
    )
    seqs = torch.tensor([prompt], device=dev)
    logp = torch.zeros(1, device=dev)
    for _ in range(n_tokens):
        cache = lm.new_cache(seqs.shape[0], seqs.shape[1] + 1)
        logits, _ = lm(seqs, torch.zeros(seqs.shape[0], dtype=torch.long, device=dev), cache)
        p = probs_from_logits(logits[:, -1], sp)  # (S, V)
        logp = (logp[:, None] + p.log()).reshape(-1)
        seqs = torch.cat([seqs.repeat_interleave(V, 0), torch.arange(V, device=dev).repeat(seqs.shape[0])[:, None]], 1)
    return logp.exp().cpu()


def assert_rollouts_follow_target(target, drafter, prompt, sp, n=30_000, k=2, max_batch_size=None, k_policy=None):
    """Sample n speculative rollouts of ``sp.max_new_tokens`` tokens (EOS off) and chi-square their
    joint law against the exact one (V**max_new_tokens cells, V the target's vocabulary).

    Cells with small expected counts are pooled so the chi-square approximation holds; fails if a
    rollout has probability 0 under the target, or p < ALPHA.
    """
    from scipy import stats

    from workbench.rollout.engine import RolloutEngine

    V, T = target.cfg.vocab_size, sp.max_new_tokens
    assert V**T <= 4096, "the exact law is enumerated: keep V**max_new_tokens small"
    eng = RolloutEngine(target, drafter, k=k, max_batch_size=max_batch_size or n, k_policy=k_policy)
    out = eng.generate([prompt] * n, sp, torch.Generator().manual_seed(1))
    assert out.counters.num_accepted_tokens > 0  # speculation actually happened
    seqs = torch.tensor(out.tokens)  # (n, T): token 0 from prefill, the rest from verification steps
    cells = (seqs * (V ** torch.arange(T - 1, -1, -1))).sum(1)
    expected = exact_joint(target, prompt, sp, T).double() * n
    counts = torch.bincount(cells, minlength=V**T).double()
    assert counts[expected == 0].sum() == 0
    big = expected >= 5
    small = (~big) & (expected > 0)
    obs = torch.cat([counts[big], counts[small].sum()[None]]).numpy()
    exp = torch.cat([expected[big], expected[small].sum()[None]]).numpy()
    if exp[-1] == 0:
        obs, exp = obs[:-1], exp[:-1]
    assert stats.chisquare(obs, exp * obs.sum() / exp.sum()).pvalue > ALPHA
    return out


@pytest.fixture(scope="session")
def target_hf():
    return random_llama(seed=0)


@pytest.fixture(scope="session")
def target_lm(target_hf):
    return LeanLM.from_hf(target_hf)


@pytest.fixture(scope="session")
def draft_lm():
    return LeanLM.from_hf(random_llama(layers=1, seed=1))


@pytest.fixture()
def store(tmp_path, monkeypatch):
    """A fresh sqlite MLflow store as the default tracking URI, with the test in its own folder."""
    from mlflow import MlflowClient

    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    return MlflowClient(uri)


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("WB_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "wb-cache"))


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def mlflow_server_with_sweep(tmp_path_factory, name: str, sweep_args: list[str]):
    """Generator for module fixtures: a real `mlflow server` on loopback (sqlite in a tmp dir) with
    a micro sweep logged to it over HTTP; yields (base URL, port, tmp dir); always stops the server."""
    import subprocess

    from typer.testing import CliRunner

    from workbench.cli import app
    from workbench.ui import server_command, wait_ready

    tmp = tmp_path_factory.mktemp(name)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log = open(tmp / "server.log", "w")
    proc = subprocess.Popen(
        server_command(f"sqlite:///{tmp}/mlflow.db", "127.0.0.1", port), cwd=tmp, stdout=log, stderr=subprocess.STDOUT
    )
    try:
        if not wait_ready(base, timeout=60, proc=proc):
            pytest.fail(f"mlflow server did not start within 60 s: {(tmp / 'server.log').read_text()[-800:]}")
        with pytest.MonkeyPatch.context() as mp:
            mp.chdir(tmp)
            mp.setenv("MLFLOW_TRACKING_URI", base)
            mp.setenv("WB_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "wb-cache"))  # as _isolated_cache
            res = CliRunner().invoke(app, sweep_args)
            assert res.exit_code == 0, res.output
            yield base, port, tmp
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        log.close()
