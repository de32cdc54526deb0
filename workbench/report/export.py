"""A drafter spec and its k as the settings of the framework the user trains with (pure; no MLflow, no vLLM import).

    from workbench.report.export import framework_configs
    cfgs = framework_configs(spec.drafter, k=3, draft_folder="/heads/eagle3")
    cfgs["vllm"]      # vLLM's speculative_config (a dict; JSON for `vllm serve --speculative-config`)
    cfgs["nemo-rl"]   # NeMo RL: policy.generation.vllm_kwargs.speculative_config
    cfgs["verl"]      # verl: actor_rollout_ref.rollout.engine_kwargs.vllm.speculative_config
    cfgs["trl"]       # the `trl vllm-serve --speculative_config '<json>'` line

The vLLM dict is the one the workbench's own vLLM backend runs (:func:`workbench.vllm.speculative_config`:
one mapping, not two); the other three wrap it where each framework hands it to vLLM. Checked against
(``CHECKED``): vLLM 0.32.0's ``vllm.config.SpeculativeConfig`` (its fields, its ``method`` values, and
``num_speculative_tokens_per_batch_size``: inclusive ``(start, end, k)`` batch-size ranges, the first
starting at 1, validated by ``vllm/v1/spec_decode/dynamic/utils.py``); TRL 1.16.0's
``trl/scripts/vllm_serve.py`` (``--speculative_config`` JSON, forwarded to ``vllm serve
--speculative-config``; ``trl vllm-serve`` is deprecated for TRL 2.0 in favour of ``vllm serve``
itself); NeMo RL's ``vllm_worker.py`` (``policy.generation.vllm_kwargs`` passed to vLLM's engine) and its
EAGLE-3 guide; verl's ``vllm_async_server.py``, which has no speculative field of its own for a drafter
(only ``actor_rollout_ref.model.mtp`` for a target's native MTP layers) and passes
``actor_rollout_ref.rollout.engine_kwargs.vllm`` through to ``vllm serve`` as CLI arguments, dicts as JSON.

Kinds: ngram -> ``ngram`` (+ ``prompt_lookup_min/max``), suffix -> ``suffix`` (vLLM needs
``arctic-inference`` on the machine that serves), draft_model -> ``draft_model`` (+ ``model``), eagle3
-> ``eagle3`` and dflash -> ``dflash`` (+ ``model``: the head in vLLM's layout). ``mtp`` has no vLLM
equivalent (:data:`NO_VLLM`) and ``none`` nothing to export: both raise :class:`ExportError`.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping
from typing import Any

import yaml

CHECKED = {
    "vllm": "vLLM 0.32.0 (vllm.config.SpeculativeConfig)",
    "trl": "TRL 1.16.0 (trl/scripts/vllm_serve.py)",
    "nemo-rl": "NeMo RL @7ea279ab (nemo_rl/models/generation/vllm/vllm_worker.py)",
    "verl": "verl @b178a3cd (verl/workers/rollout/vllm_rollout/vllm_async_server.py)",
}
FORMATS = ("vllm", "nemo-rl", "verl", "trl")
FILES = {"vllm": "speculative_config.json", "nemo-rl": "nemo_rl.yaml", "verl": "verl.yaml", "trl": "trl_vllm_serve.sh"}
NEMO_RL_KEY = "policy.generation.vllm_kwargs.speculative_config"
VERL_KEY = "actor_rollout_ref.rollout.engine_kwargs.vllm.speculative_config"
PER_BATCH_SIZE = "num_speculative_tokens_per_batch_size"  # vLLM 0.32's dynamic speculative decoding

NO_VLLM = {
    "none": "drafter.kind=none is autoregressive decoding: nothing to export (pick a speculative point)",
    "mtp": "drafter.kind=mtp has no vLLM equivalent: vLLM's mtp methods run the MTP layers a target checkpoint "
    "ships (DeepSeek-V3, Qwen3-Next, ...), not the workbench's own MTP heads; export an eagle3 or draft_model point",
}


class ExportError(ValueError):
    """A point with nothing vLLM runs, a name or point that matches nothing; the message says what to do."""


def vllm_speculative_config(
    d,
    k: int | None = None,
    draft_folder: str | None = None,
    draft_sample_method: str | None = None,
    per_batch_size: list[tuple[int, int, int]] | None = None,
) -> dict[str, Any]:
    """vLLM's ``speculative_config`` for the drafter section ``d`` (a ``DrafterSpec``) at ``k`` (default ``d.k``).

    draft_folder: the drafter's folder (draft_model: its checkpoint, default ``d.model``; eagle3, dflash: the
    head in vLLM's layout, required). per_batch_size: vLLM's ``num_speculative_tokens_per_batch_size``
    (:func:`per_batch_size_schedule`), added when given. Online adaptation is not part of it (vLLM
    serves a fixed drafter), so ``d.online`` is ignored.

    Raises:
        ExportError: kind none or mtp, an eagle3/dflash head without ``draft_folder``, dflash at a k other
            than its block size - 1 (names the field).
    """
    from drafters import drafter_class
    from workbench.vllm import speculative_config

    if d.kind in NO_VLLM:
        raise ExportError(NO_VLLM[d.kind])
    cls = drafter_class(d.kind)
    if draft_folder is None and cls is not None and cls.vllm_head_folder:
        raise ExportError(
            f"drafter.kind={d.kind}: give draft_folder, the head in vLLM's layout (`wb export` writes it, as does "
            "workbench.vllm.export_eagle3 / export_dflash)"
        )
    if draft_folder is None and cls is not None and cls.draft_cost == "model":
        draft_folder = d.model
    fixed = d.model_copy(update={"k": k or d.k, "online": d.online.model_copy(update={"enabled": False})})
    try:
        sc = speculative_config(fixed, draft_folder, draft_sample_method, require_installed=False)
    except ValueError as e:
        raise ExportError(str(e).replace(" and rollout.backend=vllm", "").replace(" with rollout.backend=vllm", ""))
    if per_batch_size:
        sc[PER_BATCH_SIZE] = [list(r) for r in per_batch_size]
    return sc


def per_batch_size_schedule(k_by_bin: Mapping[int, float], k_max: int) -> list[tuple[int, int, int]] | None:
    """The adaptive policy's choice per batch size as vLLM's ``num_speculative_tokens_per_batch_size``.

    k_by_bin: power-of-two bin b (live rows in (b/2, b], ``spec/k_mean_rows_le_<b>``) -> mean chosen k_t.
    Each bin becomes the inclusive range (previous end + 1, b) (the first starts at 1, as vLLM requires),
    its k the mean rounded half up and kept in 0..k_max; neighbours with one k merge. Batch sizes above
    the largest bin keep its k (vLLM's rule). None when there is no bin, or when k_max is chosen at every
    batch size (a static ``num_speculative_tokens`` says the same without vLLM's dynamic path).
    """
    out: list[tuple[int, int, int]] = []
    for b in sorted(k_by_bin):
        k = min(k_max, max(0, int(k_by_bin[b] + 0.5)))
        start = out[-1][1] + 1 if out else 1
        if b < start:
            continue
        if out and out[-1][2] == k:
            out[-1] = (out[-1][0], b, k)
        else:
            out.append((start, b, k))
    if not out or all(k == k_max for _, _, k in out):
        return None
    return out


def nemo_rl_config(sc: dict[str, Any]) -> dict[str, Any]:
    """NeMo RL's YAML fragment: vLLM generation with ``policy.generation.vllm_kwargs.speculative_config``."""
    return {"policy": {"generation": {"backend": "vllm", "vllm_kwargs": {"speculative_config": sc}}}}


def verl_config(sc: dict[str, Any]) -> dict[str, Any]:
    """verl's rollout fragment: vLLM rollouts with ``engine_kwargs.vllm.speculative_config`` (passed through to
    ``vllm serve --speculative_config`` as JSON; verl has no speculative field of its own for a drafter)."""
    return {"actor_rollout_ref": {"rollout": {"name": "vllm", "engine_kwargs": {"vllm": {"speculative_config": sc}}}}}


def trl_serve_command(sc: dict[str, Any], model: str = "$MODEL") -> str:
    """``trl vllm-serve --model MODEL --speculative_config '<json>'`` (shell-quoted; ``$MODEL`` left to the shell)."""
    m = f'"{model}"' if model.startswith("$") else shlex.quote(model)
    return f"trl vllm-serve --model {m} --speculative_config {shlex.quote(json.dumps(sc))}"


def overrides(prefix: str, sc: dict[str, Any]) -> list[str]:
    """Hydra ``++KEY=VALUE`` command-line overrides of ``sc`` under ``prefix`` (NeMo RL and verl both take them)."""
    return [f"++{prefix}.{k}={json.dumps(v) if isinstance(v, list | dict) else v}" for k, v in sc.items()]


def framework_configs(
    d,
    k: int | None = None,
    draft_folder: str | None = None,
    draft_sample_method: str | None = None,
    per_batch_size: list[tuple[int, int, int]] | None = None,
    model: str = "$MODEL",
) -> dict[str, Any]:
    """The four settings of one drafter (``d``: a ``DrafterSpec``) at ``k``, keyed by :data:`FORMATS`:
    ``vllm`` (the speculative_config dict), ``nemo-rl`` and ``verl`` (YAML fragments as dicts), ``trl``
    (the serve line, ``model`` the policy). Arguments and errors: :func:`vllm_speculative_config`."""
    sc = vllm_speculative_config(d, k, draft_folder, draft_sample_method, per_batch_size)
    return {"vllm": sc, "nemo-rl": nemo_rl_config(sc), "verl": verl_config(sc), "trl": trl_serve_command(sc, model)}


def _yaml(obj: Any) -> str:
    return yaml.safe_dump(obj, sort_keys=False, default_flow_style=False)


def render_files(cfgs: dict[str, Any], header: list[str], model: str, formats=FORMATS) -> dict[str, str]:
    """File name -> text for each of ``formats`` (:data:`FILES`); ``header``: comment lines (what was
    exported, from which point) put atop the YAML and shell files (JSON has no comments)."""
    sc = cfgs["vllm"]
    top = "".join(f"# {line}\n" for line in header)
    texts = {
        "vllm": json.dumps(sc, indent=2) + "\n",
        "nemo-rl": top
        + f"# {CHECKED['nemo-rl']}: merge into your GRPO config, or pass on the command line:\n"
        + "".join(f"#   {o}\n" for o in overrides(NEMO_RL_KEY, sc))
        + _yaml(cfgs["nemo-rl"]),
        "verl": top
        + f"# {CHECKED['verl']}: no speculative field for a drafter; engine_kwargs.vllm is passed to\n"
        + "# `vllm serve` as CLI arguments (dicts as JSON). Merge into your trainer config, or override:\n"
        + "".join(f"#   {o}\n" for o in overrides(VERL_KEY, sc))
        + _yaml(cfgs["verl"]),
        "trl": "#!/usr/bin/env bash\n"
        + top
        + f"# {CHECKED['trl']}: --speculative_config (JSON) is forwarded to `vllm serve --speculative-config`.\n"
        + "# trl vllm-serve is deprecated for TRL 2.0; the same server directly:\n"
        + f'#   VLLM_SERVER_DEV_MODE=1 vllm serve "$MODEL" --speculative-config {shlex.quote(json.dumps(sc))}\n'
        + "# MODEL: the policy checkpoint vLLM serves (TRL pushes the trainer's weights into it).\n"
        + f'MODEL="${{MODEL:-{model}}}"\n'
        + cfgs["trl"]
        + "\n",
    }
    return {FILES[f]: texts[f] for f in formats}
