"""vLLM's, TRL's, verl's and NeMo RL's names for spec keys: accepted as aliases, one canonical name each."""

import pytest

from workbench.specs import SpecError, load_spec, validate_spec
from workbench.specs.aliases import ALIASES, canonical_path, rename_aliases
from workbench.specs.experiment import ExperimentSpec


def test_every_alias_names_an_existing_canonical_key():
    for section, table in ALIASES.items():
        fields = ExperimentSpec.model_fields[section].annotation.model_fields
        for alias, spec in table.items():
            assert spec.canonical in fields, (section, alias)
            assert alias not in fields, f"{section}.{alias} is a field itself, not an alias"


@pytest.mark.parametrize(
    "override, section, field, value",
    [
        ("drafter.num_speculative_tokens=2", "drafter", "k", 2),
        ("drafter.method=ngram", "drafter", "kind", "ngram"),
        ("drafter.method=none", "drafter", "kind", "none"),
        ("grpo.num_generations=4", "grpo", "group_size", 4),
        ("grpo.num_generations_per_prompt=6", "grpo", "group_size", 6),
        ("grpo.num_prompts_per_step=3", "grpo", "prompts_per_step", 3),
        ("grpo.epsilon=0.1", "grpo", "clip_low", 0.1),
        ("grpo.epsilon_high=0.3", "grpo", "clip_high", 0.3),
        ("grpo.clip_ratio_high=0.25", "grpo", "clip_high", 0.25),
        ("grpo.learning_rate=3e-5", "grpo", "lr", 3e-5),
        ("grpo.max_steps=7", "grpo", "steps", 7),
        ("grpo.loss_type=grpo", "grpo", "loss_agg", "seq_mean_token_mean"),
        ("grpo.loss_type=dr_grpo", "grpo", "loss_agg", "seq_mean_token_sum_norm"),
        ("grpo.loss_agg_mode=seq-mean-token-mean", "grpo", "loss_agg", "seq_mean_token_mean"),
        ("rollout.max_completion_length=40", "rollout", "max_new_tokens", 40),
        ("rollout.response_length=41", "rollout", "max_new_tokens", 41),
    ],
)
def test_an_override_by_the_fields_name_sets_the_canonical_key(override, section, field, value):
    spec = load_spec("quickstart", [override])
    assert getattr(getattr(spec, section), field) == value


def test_an_alias_override_wins_over_the_yamls_canonical_key():
    # quickstart.yaml sets drafter.k; the override by vLLM's name must replace it, not clash with it
    assert load_spec("quickstart", ["drafter.k=5", "drafter.num_speculative_tokens=2"]).drafter.k == 2


def test_aliases_in_a_yaml_mapping_validate():
    spec = validate_spec({"drafter": {"method": "ngram", "num_speculative_tokens": 4}, "grpo": {"num_generations": 4}})
    assert (spec.drafter.kind, spec.drafter.k, spec.grpo.group_size) == ("ngram", 4, 4)


def test_the_dump_uses_canonical_names_only():
    dumped = validate_spec({"drafter": {"num_speculative_tokens": 4}}).model_dump(mode="json")
    assert dumped["drafter"]["k"] == 4 and "num_speculative_tokens" not in dumped["drafter"]


def test_an_alias_and_its_key_together_are_refused_naming_both():
    with pytest.raises(SpecError, match=r"grpo\.epsilon is TRL's name for grpo\.clip_low, and both are given"):
        validate_spec({"grpo": {"epsilon": 0.1, "clip_low": 0.2}})


def test_a_value_the_alias_does_not_take_names_the_allowed_ones():
    with pytest.raises(SpecError, match=r"loss_type \(our loss_agg\) takes grpo, dapo, dr_grpo, not 'bnpo'"):
        load_spec("quickstart", ["grpo.loss_type=bnpo"])


def test_rename_aliases_leaves_other_sections_and_non_mappings_alone():
    assert rename_aliases("model", {"method": 1}) == {"method": 1}
    assert rename_aliases("drafter", "x") == "x"
    assert canonical_path(["seed"], 3) == (["seed"], 3)
    assert canonical_path(["drafter", "init", "steps"], 3) == (["drafter", "init", "steps"], 3)


def test_the_docs_table_lists_every_alias():
    from pathlib import Path

    page = (Path(__file__).resolve().parents[1] / "docs" / "your-setup.md").read_text()
    for section, table in ALIASES.items():
        for alias, spec in table.items():
            assert f"| `{section}.{alias}` | {spec.source} | `{section}.{spec.canonical}`" in page, alias
