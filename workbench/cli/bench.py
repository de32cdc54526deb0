"""`wb bench`: rollout generation, ours vs transformers, plus the performance-model table."""

from __future__ import annotations

from typing import Optional

import typer

from workbench.cli.common import _fail, _int_list, _load, _split_args, app, console


@app.command()
def bench(
    spec: Optional[str] = typer.Argument(None, help="Spec YAML path or name (default: quickstart): target, draft model, task, sampling."),
    overrides: Optional[list[str]] = typer.Argument(None, help="Dotted-key overrides, e.g. rollout.temperature=0"),
    batch_sizes: str = typer.Option("1,8,64", help="Batch sizes for ours vs transformers generate()."),
    ks: str = typer.Option("1..7", "--k", help="Speculation lengths k (num_speculative_tokens)."),
    drafters: str = typer.Option("draft_model,ngram", help="Drafter kinds for the performance-model table."),
    max_new_tokens: int = typer.Option(64, min=1, help="Tokens generated per sequence (EOS ignored)."),
    repeats: int = typer.Option(3, min=1, help="Timed repeats per measurement (median reported)."),
    model_batch: int = typer.Option(64, min=1, help="Batch of the performance-model table (the GRPO batch)."),
    no_hf: bool = typer.Option(False, "--no-hf", help="Skip the transformers contenders."),
    compile_: bool = typer.Option(False, "--compile", help="torch.compile our engine's forwards (compilation happens in the untimed warm-up)."),
    out: str = typer.Option("benchmarks", help="Folder for <name>.json and <name>.md."),
    name: Optional[str] = typer.Option(None, help="Result file name (default: bench-<device>-<date>)."),
) -> None:
    """Benchmark rollout generation: ours vs transformers generate() and assisted generation, plus the performance model.

    The model table measures α, c and the verification cost per drafter and k, and compares the
    predicted speedup with the measured one. Results go to benchmarks/<name>.json and .md.
    """
    import shlex
    import time as _time
    from pathlib import Path

    from workbench.bench import Bench, BenchConfig, machine_info, save, to_markdown

    spec, items = _split_args(spec, overrides)
    resolved = _load(spec, items)
    from drafters import DRAFTERS

    kinds = tuple(x.strip() for x in drafters.split(",") if x.strip())
    bad = [x for x in kinds if x not in DRAFTERS]
    if bad:
        _fail(f"--drafters: unknown drafter {bad[0]!r}; allowed values: {', '.join(DRAFTERS)}")
    cfg = BenchConfig(_int_list(batch_sizes, "--batch-sizes"), _int_list(ks, "--k"), kinds, max_new_tokens, repeats, model_batch, not no_hf, compile_)
    try:
        b = Bench(resolved, cfg)
    except ValueError as e:
        _fail(str(e))
    with console.status("benchmarking") as status:
        results = b.run(progress=lambda s: status.update(f"benchmarking: {s}"))
    dev = machine_info()["device"].split(":")[0]
    fname = name or f"bench-{dev}-{_time.strftime('%Y%m%d-%H%M%S')}"
    args = [spec or "quickstart", *items, "--batch-sizes", batch_sizes, "--k", ks, "--drafters", drafters,
            "--max-new-tokens", str(max_new_tokens), "--repeats", str(repeats), "--model-batch", str(model_batch)]
    command = "wb bench " + " ".join(shlex.quote(a) for a in args + (["--no-hf"] if no_hf else []) + (["--compile"] if compile_ else []))
    jpath, mpath = save(results, Path(out), command, fname)
    from rich.markdown import Markdown

    console.print(Markdown(to_markdown(results | {"command": command})))
    console.print(f"results: {jpath} and {mpath}")
