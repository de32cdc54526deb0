from pathlib import Path

import pytest

from workbench.specs import SpecError, apply_overrides, load_spec, parse_override


def test_quickstart_loads_with_defaults():
    s = load_spec(None)
    assert s.drafter.kind == "draft_model" and s.drafter.k == 3 and s.grpo.steps >= 10


def test_overrides_are_typed():
    s = load_spec("quickstart", ["drafter.kind=ngram", "drafter.k=5", "rollout.temperature=0.7", "tracking.run_name=x"])
    assert (s.drafter.kind, s.drafter.k, s.rollout.temperature, s.tracking.run_name) == ("ngram", 5, 0.7, "x")


def test_flat_params_use_dotted_keys():
    p = load_spec(None).flat_params()
    assert p["drafter.k"] == 3 and p["drafter.kind"] == "draft_model" and "grpo.loss_agg" in p


@pytest.mark.parametrize(
    "override,needles",
    [
        ("drafter.k=abc", ["drafter.k", "valid integer", "[1, 16]"]),
        ("drafter.k=0", ["drafter.k", "greater than or equal to 1"]),
        ("drafter.k=17", ["drafter.k", "less than or equal to 16"]),
        ("drafter.kind=foo", ["drafter.kind", "allowed values", "ngram", "draft_model", "none"]),
        ("drafter.kk=3", ["drafter.kk", "Did you mean 'drafter.k'", "Allowed keys"]),
        ("grpo.loss_agg=mean", ["grpo.loss_agg", "token_mean", "seq_mean_token_sum_norm"]),
        ("rollout.top_p=1.5", ["rollout.top_p", "less than or equal to 1"]),
        ("nosuch.key=1", ["nosuch", "unknown key"]),
        (
            "drafter.eagle_aux_hidden_state_layer_ids=[1,2]",
            ["drafter.eagle_aux_hidden_state_layer_ids", "three layer indices"],
        ),
        ("drafter.eagle_aux_hidden_state_layer_ids=[-1,1,2]", ["drafter.eagle_aux_hidden_state_layer_ids", ">= 0"]),
        ("drafter.init.steps=-1", ["drafter.init.steps", "greater than or equal to 0"]),
        ("drafter.online.every=0", ["drafter.online.every", "greater than or equal to 1"]),
        ("drafter.online.foo=1", ["drafter.online.foo", "unknown key"]),
        ("drafter.ttt_decay=0", ["drafter.ttt_decay", "greater than 0"]),
    ],
)
def test_bad_values_name_the_field_and_the_fix(override, needles):
    with pytest.raises(SpecError) as e:
        load_spec(None, [override])
    for n in needles:
        assert n in str(e.value)


def test_prompt_lookup_range_checked():
    with pytest.raises(SpecError, match="prompt_lookup_min"):
        load_spec(None, ["drafter.prompt_lookup_min=5", "drafter.prompt_lookup_max=2"])


def test_malformed_override_and_missing_spec():
    with pytest.raises(SpecError, match="key=value"):
        parse_override("drafter.k")
    with pytest.raises(SpecError, match="not found"):
        load_spec("does-not-exist")


def test_override_into_scalar_rejected():
    with pytest.raises(SpecError, match="not a section"):
        apply_overrides({"seed": 1}, ["seed.x=2"])


def test_spec_file_errors(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("drafter: [unclosed\n")
    with pytest.raises(SpecError, match="not valid YAML"):
        load_spec(str(bad))
    lst = tmp_path / "list.yaml"
    lst.write_text("- 1\n- 2\n")
    with pytest.raises(SpecError, match="mapping"):
        load_spec(str(lst))


def test_init_data_auto_and_none():
    assert load_spec(None, ["drafter.kind=eagle3"]).drafter.init_data() == "in_domain"
    assert load_spec(None, ["drafter.kind=draft_model"]).drafter.init_data() == "none"
    assert load_spec(None, ["drafter.kind=mtp", "drafter.init.data=none"]).drafter.init_data() == "none"  # YAML null


def test_none_words_reach_literal_fields_from_overrides():
    """`none` on the command line parses as null; fields whose value is the word none accept it."""
    s = load_spec("micro", ["tune.pruner=none", "drafter.init.data=none"])
    assert s.tune.pruner == "none" and s.drafter.init.data == "none"


@pytest.mark.parametrize(
    "path", sorted(Path(__file__).resolve().parents[1].joinpath("experiments").glob("*.yaml")), ids=lambda p: p.name
)
def test_every_experiment_spec_validates_and_names_known_models(path):
    from workbench.models import PRESETS
    from workbench.models.imported import PRETRAINED
    from workbench.specs.load import load_spec
    from workbench.tasks import TASKS

    spec = load_spec(path)
    assert (spec.model.target in PRESETS or spec.model.target in PRETRAINED) and spec.task.name in TASKS
    if spec.drafter.kind == "draft_model":
        assert spec.drafter.model in PRESETS
