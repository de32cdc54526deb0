"""The documentation: the site builds with --strict, the generated references cover the code, the README
stays an overview, and nothing in the repository cites a file outside it (docs/design.md is the design)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from tests.extras import requires

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "docs"))
import hooks  # noqa: E402  (docs/hooks.py: the generators of the CLI and spec references)

TEXT_SUFFIXES = {".md", ".py", ".yaml", ".yml", ".toml"}
SKIP_DIRS = {".git", "site", "build", "dist", "__pycache__", ".pytest_cache", ".venv", "mlruns", "mlartifacts"}


def _repo_text_files() -> list[Path]:
    """The repository's md/py/yaml/toml files: git's tracked and untracked-but-not-ignored ones where
    git is available (what a clone holds), else a walk of the tree without build outputs."""
    try:
        out = subprocess.run(
            ["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.split("\n")
        files = [ROOT / f for f in out if f]
    except (OSError, subprocess.CalledProcessError):
        files = [p for p in ROOT.rglob("*") if not SKIP_DIRS.intersection(p.relative_to(ROOT).parts)]
    return [p for p in files if p.suffix in TEXT_SUFFIXES and p.is_file()]


# Built by concatenation so that this file does not match its own patterns.
OUTSIDE = [
    ("../" + "shared", "a path outside the repository"),
    ("beside the " + "checkout", "a file said to lie outside the repository"),
]
UPPER_DESIGN = re.compile(r"DESIGN" + r"\.md")  # the design document is docs/design.md
CITATION = re.compile(r"docs/design\.md §(\d+)")


def test_nothing_cites_a_file_outside_the_repository():
    bad = []
    for path in _repo_text_files():
        text = path.read_text(encoding="utf-8", errors="replace")
        rel = path.relative_to(ROOT)
        for needle, why in OUTSIDE:
            if needle in text:
                bad.append(f"{rel}: '{needle}' ({why})")
        for m in UPPER_DESIGN.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            bad.append(  # "DESIGN" + ".md": concatenated so that this file does not match its own pattern
                f"{rel}:{line}: cites DESIGN" + ".md; the design document is docs/design.md (cite 'docs/design.md §N')"
            )
    assert not bad, "\n".join(bad)


def test_design_citations_name_sections_that_exist():
    sections = {
        int(n) for n in re.findall(r"^## (\d+)\. ", (ROOT / "docs" / "design.md").read_text(encoding="utf-8"), re.M)
    }
    assert sections == set(range(1, 14)), f"docs/design.md keeps sections §1..§13 (cited by number): {sorted(sections)}"
    bad = []
    for path in _repo_text_files():
        for m in CITATION.finditer(path.read_text(encoding="utf-8", errors="replace")):
            if int(m.group(1)) not in sections:
                bad.append(f"{path.relative_to(ROOT)}: {m.group(0)}")
    assert not bad, "citations of sections docs/design.md does not have:\n" + "\n".join(bad)


def test_readme_is_an_overview_whose_links_resolve():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    lines = text.splitlines()
    assert len(lines) <= 100, f"README.md has {len(lines)} lines; the reference material belongs in docs/"
    tables = [x for x in lines if x.startswith("|---") or x.startswith("| ---")]
    assert len(tables) <= 1, "the README keeps one results table; the others live in docs/results"
    # The first lines are the install + main job and the test command, as CI runs them.
    assert 'pip install torch==2.13.0 && pip install -e ".[test]" && wb run' in lines[3]
    assert lines[4].startswith("python -m pytest -q")
    missing = [
        t for t in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text) if "://" not in t and not (ROOT / t).exists()
    ]
    assert not missing, f"README links to files the repository does not have: {missing}"


def test_cli_reference_lists_every_command_and_option():
    import typer.main

    from workbench.cli import app

    md = hooks.cli_reference()
    root = typer.main.get_command(app)
    ctx = root.context_class(root, info_name="wb")

    def walk(cmd, path):
        yield path, cmd
        if hasattr(cmd, "list_commands"):
            sub_ctx = cmd.context_class(cmd, info_name=path.split()[-1])
            for name in cmd.list_commands(sub_ctx):
                yield from walk(cmd.get_command(sub_ctx, name), f"{path} {name}")

    seen = list(walk(root, "wb"))
    assert len(seen) > 10, [p for p, _ in seen]
    for path, cmd in seen:
        assert f"`{path}`" in md, f"{path} missing from the CLI reference"
        for p in cmd.params:
            if getattr(p, "param_type_name", "") == "option" and p.name != "help" and not getattr(p, "hidden", False):
                assert f"`{p.opts[0]}`" in md, f"{path} {p.opts[0]} missing from the CLI reference"
    assert ctx is not None


def test_spec_reference_lists_every_field_with_its_default():
    from workbench.specs import ExperimentSpec

    md = hooks.spec_reference()
    flat = ExperimentSpec().flat_params()
    missing = [k for k in flat if f"| `{k}` |" not in md]
    assert not missing, f"spec keys missing from the spec reference: {missing}"
    # a default as written in YAML, read from the pydantic field itself
    assert "| `rollout.temperature` | float | `1.0` |" in md
    assert "| `rollout.vllm.max_num_seqs` | int \\| null | `null` |" in md


@requires("docs", "mkdocs", "mkdocstrings")
def test_site_builds_strict(tmp_path):
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        "NO_MKDOCS_2_WARNING": "1",
    }
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "mkdocs",
            "build",
            "--strict",
            "--quiet",
            "-f",
            str(ROOT / "mkdocs.yml"),
            "-d",
            str(tmp_path / "site"),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]
    site = tmp_path / "site"
    for page in (
        "index.html",
        "design/index.html",
        "reference/cli/index.html",
        "reference/spec/index.html",
        "results/index.html",
        "changelog/index.html",
        "api/stats/index.html",
    ):
        assert (site / page).is_file(), f"{page} not built"
    # mkdocstrings rendered the API from the docstrings (not an empty page)
    assert "rejection_sample" in (site / "api" / "rejection" / "index.html").read_text(encoding="utf-8")


def test_the_site_nav_is_in_sections_and_every_results_page_is_listed():
    """Get started / Guides / Concepts / Reference / Results; every page under docs/results is in the nav
    (and so behind the one results index), none hidden."""
    import yaml

    cfg = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    sections = [next(iter(item)) for item in cfg["nav"]]
    assert sections == ["Get started", "Guides", "Concepts", "Reference", "Results"]
    results = next(item["Results"] for item in cfg["nav"] if "Results" in item)
    listed = {p for p in results if isinstance(p, str)}
    on_disk = {f"results/{p.name}" for p in (ROOT / "docs" / "results").glob("*.md")}
    assert listed == on_disk, f"not in the nav: {sorted(on_disk - listed)}; missing files: {sorted(listed - on_disk)}"
    index = (ROOT / "docs" / "results" / "index.md").read_text(encoding="utf-8")
    unlinked = [p for p in on_disk if p != "results/index.md" and f"({p.split('/')[1]}" not in index]
    assert not unlinked, f"results pages the index does not link: {unlinked}"


def test_code_says_what_and_why_not_which_issue():
    """Comments, docstrings and help texts explain; the history of which issue asked for what is in CHANGELOG.md.
    (A shipped model's build description is data, recorded with its weights.)"""
    cited = []
    for root in ("workbench", "drafters", "data"):
        for path in (ROOT / root).rglob("*.py"):
            if path.name == "presets.py":
                continue
            for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                if re.search(r"\bissue #\d", line, re.IGNORECASE):
                    cited.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert not cited, "\n".join(cited)
