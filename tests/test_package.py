"""The workbench as an installed package: a wheel that runs from any folder, its shipped specs, the spec's
JSON Schema, ``wb --version`` and the MLflow system tags every run carries."""

import json
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import tomllib
import yaml
from typer.testing import CliRunner

from workbench.cli import app
from workbench.specs import EXPERIMENTS_DIR, load_spec
from workbench.specs.catalog import SCHEMA_FILE, SCHEMA_LINE, purpose_of, schema_text, shipped_specs

ROOT = Path(__file__).resolve().parents[1]
runner = CliRunner()


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The project built as a wheel (setuptools, no build isolation: the registry is not needed)."""
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps", "--no-build-isolation", "-q", "-w", str(out)],
        check=True,
        capture_output=True,
    )
    (whl,) = out.glob("*.whl")
    return whl


def test_the_wheel_ships_every_spec_scenario_schema_and_the_typed_marker(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    for p in EXPERIMENTS_DIR.glob("*.yaml"):
        assert f"workbench/experiments/{p.name}" in names
    for p in (EXPERIMENTS_DIR / "scenarios").glob("*.yaml"):
        assert f"workbench/experiments/scenarios/{p.name}" in names
    assert f"workbench/experiments/{SCHEMA_FILE}" in names and "workbench/py.typed" in names


@pytest.mark.slow
def test_the_wheel_runs_a_shipped_spec_from_an_empty_folder(wheel, tmp_path):
    site, cwd = tmp_path / "site", tmp_path / "empty"
    zipfile.ZipFile(wheel).extractall(site)
    cwd.mkdir()
    env = {**os.environ, "PYTHONPATH": str(site), "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path}/mlflow.db"}
    code = "import sys, workbench; print(workbench.__file__); sys.argv = ['wb', *sys.argv[1:]]; "
    code += "from workbench.cli import app; app()"
    # -P: nothing from the working directory; the editable install of this checkout is shadowed by PYTHONPATH
    res = subprocess.run(
        [sys.executable, "-P", "-c", code, "run", "micro", "grpo.steps=1", "--quiet"],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.splitlines()[0].startswith(str(site)), res.stdout
    listing = subprocess.run(
        [sys.executable, "-P", "-c", code, "specs", "list"], cwd=cwd, env=env, capture_output=True, text=True
    )
    assert listing.returncode == 0 and "quickstart" in listing.stdout, listing.stderr


def test_specs_list_names_every_shipped_spec_with_its_purpose():
    res = runner.invoke(app, ["specs", "list"])
    assert res.exit_code == 0, res.output
    for s in shipped_specs():
        assert s.name in res.output and s.purpose
    assert {s.name for s in shipped_specs()} >= {"quickstart", "micro", "smollm2"}


def test_purpose_is_the_first_sentence_of_the_leading_comment():
    text = f"{SCHEMA_LINE}spec.schema.json\n# The default (issue #3): GRPO on a task. More.\n# Next.\nname: x\n"
    assert purpose_of(text) == "The default: GRPO on a task"
    assert purpose_of("name: x\n") == ""


def test_a_copied_spec_runs_as_a_file_and_names_the_installed_schema(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    res = runner.invoke(app, ["specs", "copy", "micro", "my.yaml"])
    assert res.exit_code == 0, res.output
    text = (tmp_path / "my.yaml").read_text()
    first = text.splitlines()[0]
    assert first.startswith(SCHEMA_LINE) and first.endswith(f"experiments/{SCHEMA_FILE}")
    assert Path(first.removeprefix(SCHEMA_LINE).removeprefix("file://")).is_file()
    assert load_spec("my.yaml") == load_spec("micro")
    again = runner.invoke(app, ["specs", "copy", "micro", "my.yaml"])
    assert again.exit_code == 2 and "exists" in again.output
    assert runner.invoke(app, ["specs", "copy", "micro", "my.yaml", "--force"]).exit_code == 0


def test_copying_an_unknown_spec_exits_2_listing_the_names(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    res = runner.invoke(app, ["specs", "copy", "nope"])
    assert res.exit_code == 2 and "quickstart" in res.output and not (tmp_path / "nope.yaml").exists()


def test_the_committed_schema_is_the_specs_schema():
    committed = (EXPERIMENTS_DIR / SCHEMA_FILE).read_text()
    assert committed == schema_text(), "the spec changed: regenerate with `wb specs schema -o experiments/`"


def test_the_schema_lists_the_aliases_and_every_shipped_spec_names_it():
    schema = json.loads(schema_text())
    drafter = schema["$defs"]["DrafterSpec"]["properties"]
    assert "num_speculative_tokens" in drafter and "vLLM" in drafter["num_speculative_tokens"]["description"]
    assert schema["$defs"]["GRPOSpec"]["properties"]["loss_type"]["enum"] == ["grpo", "dapo", "dr_grpo"]
    for p in EXPERIMENTS_DIR.glob("*.yaml"):
        assert p.read_text().splitlines()[0] == f"{SCHEMA_LINE}{SCHEMA_FILE}", p.name
        yaml.safe_load(p.read_text())


def test_schema_to_stdout_is_json():
    res = runner.invoke(app, ["specs", "schema"])
    assert res.exit_code == 0 and json.loads(res.output)["title"]


def test_version_names_the_distribution_and_the_commit_in_a_checkout():
    res = runner.invoke(app, ["--version"])
    assert res.exit_code == 0 and res.output.startswith("speculation-workbench ")
    if (ROOT / ".git").exists():
        head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True).stdout
        assert head.strip() in res.output


def test_a_run_carries_mlflows_system_tags_and_the_version(store):
    from workbench.tags import TAG_VERSION
    from workbench.tracking import Tracker
    from workbench.version import version

    with Tracker(None, experiment="tags", run_name="r") as t:
        run_id = t.run_id
    tags = store.get_run(run_id).data.tags
    assert tags["mlflow.user"] and tags["mlflow.source.type"] == "LOCAL" and tags["mlflow.source.name"]
    assert tags[TAG_VERSION] == version()
    if (ROOT / ".git").exists():
        assert len(tags["mlflow.source.git.commit"]) == 40


def test_torch_lower_bound_has_sdpa_enable_gqa():
    """layers.py calls SDPA with enable_gqa, new in torch 2.5."""
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    (torch_dep,) = [d for d in deps if re.match(r"torch\s*[<>=!~]", d)]
    low = re.search(r">=\s*(\d+)\.(\d+)", torch_dep)
    assert low and (int(low[1]), int(low[2])) >= (2, 5), torch_dep
