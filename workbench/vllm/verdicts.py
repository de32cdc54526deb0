"""Exactness verdicts of vLLM builds, and the guard that uses them (docs/design.md §11).

`wb audit rollout.backend=vllm` tests a vLLM build's rollouts against the target's exact law, per
method (``none`` = plain sampling, ``ngram``, ``draft_model``, ``eagle3``, ``suffix``), and records
one verdict per (vLLM version, platform, machine, method, *sampling settings*): temperature,
top_p, top_k, ``draft_sample_method`` and k, the settings it sampled at. A verdict holds only
there: at temperature 1 / top-p 1 / top-k 0 a truncated or unexpanded temperature does no harm,
so a pass there says nothing of temperature 0.7 with top-p 0.9. Each verdict keeps its power
(``n`` rows, ``alpha``, ``detectable_shift``: the smallest probability shift it detects at power
0.9). The user's verdicts live in the workbench cache (``vllm-verdicts.json``), on top of the ones
this project's audits found, shipped in ``verdicts.json`` beside this module.

The guard: sampled speculation (temperature > 0) on vLLM runs only where a verdict for its build,
method and sampling settings passed; a fail, or settings no verdict covers, is refused before a
run opens (naming the `wb audit` command for those settings) unless
``rollout.vllm.allow_unaudited_speculation=true`` (the run is then tagged). A user's pass with
less power (a larger detectable shift) than a shipped fail does not override it. Plain sampling
and greedy speculation are never refused: greedy identity is checked token for token elsewhere.
Verdicts recorded before the settings were (no ``sampling`` field) are kept as evidence of a fail
but admit nothing.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from workbench.cache import cache_dir

SHIPPED = Path(__file__).with_name("verdicts.json")
AUDIT_CMD = "wb audit rollout.backend=vllm"
DRAFT_MODEL_METHODS = ("draft_model", "eagle3")  # the methods vLLM's draft_sample_method applies to


def user_file() -> Path:
    return cache_dir() / "vllm-verdicts.json"


def sampling_settings(method: str, temperature: float, top_p: float, top_k: int | None, k: int,
                      draft_sample_method: str | None) -> dict:
    """The settings a verdict holds at, normalised: top_k 0 = off; ``draft_sample_method`` only for
    draft_model/eagle3 (vLLM ignores it otherwise) and k only for speculative methods (0 for none)."""
    spec_method = method != "none"
    return {"temperature": float(temperature), "top_p": float(top_p), "top_k": int(top_k or 0),
            "draft_sample_method": draft_sample_method if method in DRAFT_MODEL_METHODS else None,
            "k": int(k) if spec_method else 0}


def run_settings(spec, method: str) -> dict:
    """:func:`sampling_settings` of a run's spec (``rollout.*``, ``drafter.k``) for ``method``."""
    r = spec.rollout
    return sampling_settings(method, r.temperature, r.top_p, r.top_k, spec.drafter.k, r.vllm.draft_sample_method)


def settings_label(s: dict) -> str:
    """``T=0.7 top_p=0.9 top_k=0 draft_sample_method=None k=3``: part of a verdict key."""
    return (f"T={s['temperature']!r} top_p={s['top_p']!r} top_k={s['top_k']} "
            f"draft_sample_method={s['draft_sample_method']} k={s['k']}")


def verdict_key(build: dict[str, str], method: str, settings: dict | None = None) -> str:
    """``vllm==VERSION platform=P machine=M method=X [T=.. top_p=.. top_k=.. draft_sample_method=.. k=..]``.
    Without ``settings``: the build and method alone (the prefix every verdict of them shares)."""
    key = f"vllm=={build['vllm']} platform={build['platform']} machine={build['machine']} method={method}"
    return key if settings is None else f"{key} {settings_label(settings)}"


def _read(path: Path) -> dict:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"{path}: corrupt vLLM audit verdicts ({e}); delete it and re-run `{AUDIT_CMD}`") from e
    return data if isinstance(data, dict) else {}


def weaker(user: dict, shipped: dict) -> bool:
    """True when ``user`` was measured with less power than ``shipped`` (a larger detectable shift;
    a verdict without one counts as the weakest)."""
    return float(user.get("detectable_shift", float("inf"))) > float(shipped.get("detectable_shift", float("inf")))


def merge(shipped: dict[str, dict], user: dict[str, dict]) -> dict[str, dict]:
    """The verdicts in force: the user's win, except that a user's pass measured with less power
    than a shipped fail leaves the fail standing (noted in ``overridden_by_weaker_pass``)."""
    out = dict(shipped)
    for key, v in user.items():
        s = shipped.get(key)
        if s is not None and not s.get("passed") and v.get("passed") and weaker(v, s):
            out[key] = {**s, "overridden_by_weaker_pass": v}
        else:
            out[key] = v
    return out


def load_verdicts(user: Path | None = None, shipped: Path | None = None) -> dict[str, dict]:
    """Shipped verdicts merged with the user's (:func:`merge`)."""
    return merge(_read(shipped or SHIPPED), _read(user or user_file()))


def record_verdict(build: dict[str, str], method: str, passed: bool, evidence: dict, user: Path | None = None,
                   settings: dict | None = None) -> str:
    """Write one method's verdict at ``settings`` into the verdict file ``user`` (default: the
    user's, in the cache); returns its key. ``evidence``: summary, n, alpha, detectable_shift, ..."""
    path = user or user_file()
    data = _read(path)
    key = verdict_key(build, method, settings)
    data[key] = {"passed": bool(passed), "when": time.strftime("%Y-%m-%d %H:%M:%S"), **evidence,
                 **({"sampling": settings} if settings is not None else {})}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True))
    tmp.replace(path)
    return key


def needs_verdict(spec) -> str | None:
    """The method whose verdict a run needs (sampled speculation on vLLM), or None."""
    r, d = spec.rollout, spec.drafter
    if r.backend != "vllm" or d.kind == "none" or r.temperature == 0:
        return None
    return d.kind


def audit_command(spec, method: str) -> str:
    """The `wb audit` command that audits ``method`` at the run's own settings (same spec, build
    and sampling), at full power (the audit's default sample size)."""
    r = spec.rollout
    parts = [f"wb audit {spec.name} rollout.backend=vllm", f"rollout.temperature={r.temperature:g}",
             f"rollout.top_p={r.top_p:g}", f"rollout.top_k={r.top_k or 0}", f"drafter.k={spec.drafter.k}"]
    if method in DRAFT_MODEL_METHODS and r.vllm.draft_sample_method is not None:
        parts.append(f"rollout.vllm.draft_sample_method={r.vllm.draft_sample_method}")
    if r.vllm.cpu_expand_fix:
        parts.append("rollout.vllm.cpu_expand_fix=true")
    return " ".join(parts) + f" --drafters {method}"


def _others(verdicts: dict[str, dict], build: dict[str, str], method: str, key: str) -> str:
    """The settings this build and method were audited at, other than the run's."""
    prefix = verdict_key(build, method) + " "
    seen = [f"{k[len(prefix):]}: {'pass' if v.get('passed') else 'FAIL'}" for k, v in sorted(verdicts.items())
            if k.startswith(prefix) and k != key]
    return f" (audited only at: {'; '.join(seen)})" if seen else ""


def check_speculation_allowed(spec, build: dict[str, str], user: Path | None = None, shipped: Path | None = None) -> dict[str, str]:
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
    method = needs_verdict(spec)
    if method is None:
        return {}
    verdicts = load_verdicts(user, shipped)
    key = verdict_key(build, method, run_settings(spec, method))
    v = verdicts.get(key)
    state = "none" if v is None else ("pass" if v.get("passed") else "fail")
    tags = {"workbench.vllm.verdict": state, "workbench.vllm.build": key}
    if state == "pass":
        return tags
    if spec.rollout.vllm.allow_unaudited_speculation:
        return {**tags, "workbench.vllm.unaudited": "true"}
    if state == "fail":
        why = (f"its exactness audit at these settings FAILED ({v.get('when', '?')}: {v.get('summary', 'see the audit')}, "
               f"n={v.get('n', '?')}): sampled speculative rollouts from it do not follow the policy's distribution")
        weak = v.get("overridden_by_weaker_pass")
        if weak:
            why += (f"; your pass (n={weak.get('n', '?')}, detectable shift {weak.get('detectable_shift', '?')}) has less power "
                    f"than this fail (detectable shift {v.get('detectable_shift', '?')}) and does not override it")
    else:
        why = "it has never been audited at these sampling settings" + _others(verdicts, build, method, key)
    raise ValueError(
        f"rollout.backend=vllm with drafter.kind={method}: {key} is refused as unaudited because {why}. "
        f"Audit it at the run's settings: `{audit_command(spec, method)}`; or use rollout.temperature=0 (greedy "
        "speculation, checked token for token) or rollout.backend=workbench; "
        + ("on vLLM-CPU, rollout.vllm.cpu_expand_fix=true replaces the expand kernel that makes its sampled speculation "
           "inexact (docs/vllm.md); " if build.get("platform") == "cpu" else "")
        + "or set rollout.vllm.allow_unaudited_speculation=true to run anyway (the run is tagged workbench.vllm.unaudited=true)")
