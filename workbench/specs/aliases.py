"""The field's names for spec keys: vLLM's, TRL's, verl's and NeMo RL's spellings accepted as aliases.

Each spec key has one canonical name (what the spec dumps, MLflow logs and the docs use); a section lists
the other frameworks' names for it in ``ALIASES``. An alias is renamed to its canonical key before
validation, and a dotted override's path is renamed the same way first, so ``drafter.num_speculative_tokens=2``
overrides a YAML's ``drafter.k: 3`` instead of clashing with it. Where a framework's *values* differ
too (TRL's ``loss_type``, verl's ``loss_agg_mode``), the alias carries a value map.

Sources: vLLM ``SpeculativeConfig`` (``method``, ``num_speculative_tokens``); TRL ``GRPOConfig``
(``num_generations``, ``epsilon``, ``epsilon_high``, ``learning_rate``, ``loss_type``,
``max_completion_length``, ``max_steps``); verl's actor config (``clip_ratio_low``/``clip_ratio_high``,
``loss_agg_mode``, ``rollout.n``); NeMo RL's ``grpo`` config (``num_prompts_per_step``,
``num_generations_per_prompt``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Alias:
    canonical: str  # the spec's own key in the same section
    source: str  # whose name it is ("vLLM", "TRL", ...), for messages and docs
    values: dict[str, str] = field(default_factory=dict)  # the framework's value -> ours; empty: same values


_TRL_LOSS = {"grpo": "seq_mean_token_mean", "dapo": "token_mean", "dr_grpo": "seq_mean_token_sum_norm"}
_VERL_LOSS = {"token-mean": "token_mean", "seq-mean-token-mean": "seq_mean_token_mean"}
_VERL_LOSS["seq-mean-token-sum-norm"] = "seq_mean_token_sum_norm"

# section path (dotted; "" is the top level) -> {alias: Alias}
ALIASES: dict[str, dict[str, Alias]] = {
    "drafter": {
        "method": Alias("kind", "vLLM"),
        "num_speculative_tokens": Alias("k", "vLLM"),
    },
    "grpo": {
        "num_generations": Alias("group_size", "TRL"),
        "num_generations_per_prompt": Alias("group_size", "NeMo RL"),
        "num_prompts_per_step": Alias("prompts_per_step", "NeMo RL"),
        "epsilon": Alias("clip_low", "TRL"),
        "epsilon_high": Alias("clip_high", "TRL"),
        "clip_ratio_low": Alias("clip_low", "verl"),
        "clip_ratio_high": Alias("clip_high", "verl"),
        "learning_rate": Alias("lr", "TRL"),
        "max_steps": Alias("steps", "TRL"),
        "loss_type": Alias("loss_agg", "TRL", _TRL_LOSS),
        "loss_agg_mode": Alias("loss_agg", "verl", _VERL_LOSS),
    },
    "rollout": {
        "max_completion_length": Alias("max_new_tokens", "TRL"),
        "response_length": Alias("max_new_tokens", "verl"),
    },
}


def canonical_value(alias: str, spec: Alias, value: Any) -> Any:
    """``value`` in the spec's own terms: mapped through the alias's value map, if it has one.

    Raises:
        ValueError: a value the framework's name does not take, naming the allowed values.
    """
    if not spec.values:
        return value
    if not isinstance(value, str) or value not in spec.values:
        allowed = ", ".join(spec.values)
        raise ValueError(f"{spec.source}'s {alias} (our {spec.canonical}) takes {allowed}, not {value!r}")
    return spec.values[value]


def rename_aliases(section: str, data: Any) -> Any:
    """A copy of one section's mapping with every alias key renamed to its canonical key (values mapped).

    section: the dotted path of the section (``"grpo"``). Non-mappings pass through unchanged.

    Raises:
        ValueError: an alias and its canonical key (or two aliases of one key) are both given, naming both.
    """
    table = ALIASES.get(section)
    if not table or not isinstance(data, dict) or not any(k in table for k in data):
        return data
    out = dict(data)
    for key in [k for k in data if k in table]:
        spec = table[key]
        if spec.canonical in out:
            raise ValueError(
                f"{section}.{key} is {spec.source}'s name for {section}.{spec.canonical}, and both are given; keep one"
            )
        out[spec.canonical] = canonical_value(key, spec, out.pop(key))
    return out


def canonical_path(parts: list[str], value: Any) -> tuple[list[str], Any]:
    """A dotted override's (path, value) in canonical names: ``["drafter", "num_speculative_tokens"], 2`` ->
    ``["drafter", "k"], 2``. A path through no aliased section comes back unchanged.

    Raises:
        ValueError: a value the alias does not take (:func:`canonical_value`).
    """
    if len(parts) < 2:
        return parts, value
    section, key = ".".join(parts[:-1]), parts[-1]
    spec = ALIASES.get(section, {}).get(key)
    if spec is None:
        return parts, value
    return [*parts[:-1], spec.canonical], canonical_value(key, spec, value)
