"""Task data as `datasets.Dataset`s: generated (cached as jsonl) or from a user's file.

Held-out eval: generated prompts are split by a hash of the prompt string (`is_eval_prompt`), so
no eval prompt can ever appear in any train split or in model pretraining data, whatever the
seeds and sizes. Train and eval also use different generator seeds.
"""

from __future__ import annotations

import json
import os
import zlib
from pathlib import Path
from typing import Callable

import datasets

from data import general, math_word
from workbench.cache import cache_dir as user_cache_dir  # renamed: `cache_dir` is a parameter below
from workbench.cache import cached, fix_for, writable_or_temp
from workbench.files import reading, write_text
from workbench.tasks import get_task

datasets.disable_progress_bars()  # keep the CLI quiet; datasets logs its own cache handling otherwise
datasets.logging.set_verbosity_error()

EVAL_BUCKETS = 16  # 1 prompt in 16 (by hash) is reserved for eval
EVAL_SEED_OFFSET = 7919  # eval generator seed = seed + this, so eval draws differ from train draws
SPLITS = ("train", "eval")
FORMATS = {".jsonl": "json", ".json": "json", ".parquet": "parquet"}
LAYOUTS = ("auto", "fields", "gsm8k", "dapo")  # task.dataset_format


def is_eval_prompt(prompt: str) -> bool:
    """True if prompt belongs to the held-out eval partition (deterministic hash of the text)."""
    return zlib.crc32(prompt.encode("utf-8")) % EVAL_BUCKETS == 0


def _default_cache_dir() -> Path:
    return user_cache_dir() / "data"


def _write_jsonl(rows: list[dict], path: Path) -> None:
    """Write rows atomically (temp file + rename) and sealed (:mod:`workbench.files`), so a crash never
    leaves a truncated cache file and a file damaged later is found and generated again."""
    write_text(path, "".join(json.dumps(r) + "\n" for r in rows))


def _cached_jsonl(path: Path, rows: Callable[[], list[dict]], cache: Path) -> datasets.Dataset:
    """The generated rows cached in ``path`` (written by ``rows()`` when missing or damaged: rebuilt once,
    :func:`workbench.cache.cached`), read without ``datasets``' own cache (nothing is written beside a
    read-only cache that already holds the file)."""
    cached(path, lambda: _write_jsonl(rows(), path), "task data", root=cache)
    with reading(path, "task data", fix_for(path)):
        return datasets.Dataset.from_list([json.loads(line) for line in path.read_text().splitlines() if line])


def generate_split(name: str, split: str, num: int, seed: int) -> list[dict]:
    """num generated items of task `name` in `split`, deterministic for (name, split, num, seed).

    Items are drawn from the task generator (train: seed, eval: seed + EVAL_SEED_OFFSET) and
    kept only if their prompt hash puts them in this split. Raises ValueError on a bad split.
    """
    if split not in SPLITS:
        raise ValueError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")
    task = get_task(name)
    want_eval = split == "eval"
    gen_seed = seed + EVAL_SEED_OFFSET if want_eval else seed
    n = max(num, 1) * (EVAL_BUCKETS + 4 if want_eval else 2)
    while True:  # over-generate, filter; generators are prefix-stable so retries only extend
        items = [it for it in task.generate(n, gen_seed) if is_eval_prompt(it["prompt"]) == want_eval]
        if len(items) >= num:
            return items[:num]
        n *= 2


def load_task_data(
    name: str,
    split: str,
    num: int,
    seed: int,
    path: str | None = None,
    prompt_field: str = "prompt",
    answer_field: str = "answer",
    cache_dir: Path | None = None,
    dataset_format: str = "auto",
    hub_split: str = "train",
    keep_columns: bool = False,
) -> datasets.Dataset:
    """A Dataset with string columns `prompt` and `answer` (num rows at most).

    path None: the task's generated data (held out between splits, see module doc), cached as
    jsonl under cache_dir (default `cache_dir()/data`; a damaged file is generated again).
    path given: a .jsonl/.json/.parquet file in one of the layouts of ``dataset_format``
    (task.dataset_format: gsm8k, dapo, fields = prompt_field/answer_field; auto detects), renamed
    to prompt/answer (conversational prompts kept as their JSON messages); split "train" takes the first num rows,
    "eval" the last num rows (disjoint when the file has at least num_train + num_eval rows).
    path not a file (nor a path that looks like one): a ``datasets`` Hub dataset ``NAME`` or ``NAME:CONFIG`` (or a
    local dataset folder), split ``hub_split`` (task.split), loaded with ``datasets.load_dataset`` (its own cache)
    and then read as a file is.
    keep_columns (a run with ``task.reward`` functions, which get every column as TRL passes them): the user
    data's other columns are kept beside prompt/answer (``solution``, ...), and a missing default ``answer``
    column is allowed (answer "").
    Raises ValueError naming task.name / task.path / task.split / task.prompt_field / task.answer_field with
    the fix: unknown task or split, missing file, unknown extension, unreadable file or Hub dataset (offline
    too), missing field.
    """
    task = get_task(name)
    if split not in SPLITS:
        raise ValueError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")
    if num < 0:
        raise ValueError(f"num must be >= 0, got {num}")
    cache = Path(cache_dir) if cache_dir is not None else _default_cache_dir()
    if path is None:
        if num == 0:  # the json builder can't infer columns from an empty file
            return datasets.Dataset.from_dict({"prompt": [], "answer": []})
        file = cache / f"{task.name}-v{task.version}-{split}-n{num}-s{seed}.jsonl"
        return _cached_jsonl(
            file,
            lambda: [
                {"prompt": it["prompt"], "answer": str(it["answer"])} for it in generate_split(name, split, num, seed)
            ],
            cache,
        )

    ds = _load_user_file(path, cache) if _is_file_path(path) else _load_hub(path, hub_split)
    layout = resolve_layout(ds, dataset_format, prompt_field, answer_field)
    ds = _to_prompt_answer(ds, layout, prompt_field, answer_field, path, keep_columns)
    n = min(num, len(ds))
    rows = range(n) if split == "train" else range(len(ds) - n, len(ds))
    return ds.select(rows)


def spec_task_data(t, split: str, num: int, seed: int) -> datasets.Dataset:
    """``load_task_data`` for a run's ``task`` spec section (name, path, fields, dataset_format, split; every
    column kept when ``task.reward`` functions score the run)."""
    return load_task_data(
        t.name,
        split,
        num,
        seed,
        t.path,
        t.prompt_field,
        t.answer_field,
        dataset_format=t.dataset_format,
        hub_split=getattr(t, "split", "train"),
        keep_columns=getattr(t, "reward", None) is not None,
    )


def resolve_layout(
    ds: datasets.Dataset, layout: str, prompt_field: str = "prompt", answer_field: str = "answer"
) -> str:
    """The layout of a user file: ``layout`` itself, or for "auto": fields when task.prompt_field /
    answer_field were set away from their defaults, else gsm8k (question, answer whose first row holds
    '####'), dapo (prompt, solution), or fields. Raises ValueError naming task.dataset_format if unknown."""
    if layout not in LAYOUTS:
        raise ValueError(f"task.dataset_format: {layout!r}; allowed values: {', '.join(LAYOUTS)}")
    if layout != "auto":
        return layout
    cols = set(ds.column_names)
    if (prompt_field, answer_field) != ("prompt", "answer"):
        return "fields"
    if {"question", "answer"} <= cols and len(ds) and "####" in str(ds[0]["answer"]):
        return "gsm8k"
    if {"prompt", "solution"} <= cols:
        return "dapo"
    return "fields"


def gsm8k_answer(answer: str) -> str:
    """The final answer of a GSM8K solution: the text after its last '####', thousands commas dropped."""
    return answer.rsplit("####", 1)[-1].strip().replace(",", "")


def _prompt_text(prompt) -> str:
    """A prompt as the string column holds it: text as is, TRL conversational messages as their JSON
    (read back by workbench.models.chat.parse_messages)."""
    if isinstance(prompt, list):
        return json.dumps([{"role": str(m["role"]), "content": str(m["content"])} for m in prompt])
    return str(prompt)


def _to_prompt_answer(
    ds: datasets.Dataset, layout: str, prompt_field: str, answer_field: str, path: str, keep_columns: bool = False
) -> datasets.Dataset:
    """Rename a user file's columns to string ``prompt`` and ``answer`` by its layout (see resolve_layout).

    gsm8k: prompt = question + the boxed-answer instruction (math_word's, unless the question already
    asks for a box), answer = gsm8k_answer(answer). dapo (DAPO-Math-17k's processed layout): prompt
    (text or messages), answer = solution. fields: task.prompt_field / task.answer_field.
    keep_columns: the other columns stay (prompt and answer replaced), and a missing default ``answer`` is "".
    Raises ValueError naming the field to set when a column is missing.
    """
    fields = {"gsm8k": ("question", "answer"), "dapo": ("prompt", "solution")}.get(layout, (prompt_field, answer_field))
    keys = ("task.prompt_field", "task.answer_field") if layout == "fields" else ("task.dataset_format",) * 2
    no_answer = keep_columns and layout == "fields" and answer_field == "answer" and "answer" not in ds.column_names
    for field, key in zip(fields[:1] if no_answer else fields, keys):
        if field not in ds.column_names:
            raise ValueError(
                f"{key}: column {field!r} not in {path} (layout {layout}); columns there: "
                f"{', '.join(ds.column_names)}. "
                f"Fix: set {key} to match the file."
            )
    pf, af = fields

    def row(r):
        if layout == "gsm8k":
            q = str(r[pf])
            return {"prompt": q if "boxed" in q else f"{q} {math_word.INSTRUCTION}", "answer": gsm8k_answer(str(r[af]))}
        return {"prompt": _prompt_text(r[pf]), "answer": "" if no_answer else str(r[af]).strip()}

    drop = [c for c in ds.column_names if c in ("prompt", "answer")] if keep_columns else ds.column_names
    return ds.map(row, remove_columns=drop)


def _is_file_path(path: str) -> bool:
    """True when task.path names a file (existing, or written like one: a data-file extension or an
    explicit / ./ ../ ~ path); else it is a Hub dataset name or a dataset folder."""
    p = Path(path).expanduser()
    if p.is_file():
        return True
    if p.is_dir():
        return False
    return p.suffix.lower() in FORMATS or path.startswith(("/", "./", "../", "~", "."))


def _load_hub(path: str, split: str) -> datasets.Dataset:
    """``datasets.load_dataset(NAME[, CONFIG], split=split)`` for task.path ``NAME`` or ``NAME:CONFIG`` (or a
    local dataset folder); every failure, offline ones included, is one ValueError naming task.path."""
    name, _, config = path.partition(":") if not Path(path).expanduser().is_dir() else (path, "", "")
    try:
        return datasets.load_dataset(name, config or None, split=split)
    except Exception as e:  # datasets / huggingface_hub raise many types (DatasetNotFoundError, ConnectionError, ...)
        first = str(e).strip().splitlines()[0][:300] if str(e).strip() else ""
        offline = [
            v for v in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE") if os.environ.get(v, "").lower() in ("1", "true")
        ]
        raise ValueError(
            f"task.path: could not load the datasets Hub dataset {path!r} (split {split!r}, task.split): "
            f"{type(e).__name__}: {first}. Fix: check the name (NAME or NAME:CONFIG) and task.split; offline "
            f"({', '.join(offline) + ' set' if offline else 'HF_DATASETS_OFFLINE/HF_HUB_OFFLINE, or no network'}) "
            "only a dataset already in the datasets cache loads: load it once online, or give a local "
            ".jsonl/.parquet file"
        ) from None


def _load_user_file(path: str, cache: Path) -> datasets.Dataset:
    """Load a user's .jsonl/.json/.parquet file; every failure is a ValueError naming task.path."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise ValueError(
            f"task.path: file not found: {path}. Fix: give an existing .jsonl/.json/.parquet file, "
            f"or leave task.path unset to use the task's generated data."
        )
    fmt = FORMATS.get(p.suffix.lower())
    if fmt is None:
        raise ValueError(
            f"task.path: unknown file extension {p.suffix!r} for {path}; allowed: {', '.join(FORMATS)}. "
            f"Fix: convert the file or rename it with the right extension."
        )
    try:  # datasets writes its lock files and arrow copies under the cache: elsewhere when it is read-only
        hf_cache = writable_or_temp(cache / "hf_datasets")
        return datasets.load_dataset(fmt, data_files=str(p), split="train", cache_dir=str(hf_cache))
    except Exception as e:  # datasets/pyarrow raise many types (DatasetGenerationError, ArrowInvalid, ...)
        raise ValueError(
            f"task.path: could not read {path} as {p.suffix} ({type(e).__name__}: "
            f"{str(e).splitlines()[0][:200] if str(e) else ''}). "
            f"Fix: check the file is valid {'JSON lines (one object per line)' if fmt == 'json' else 'parquet'}."
        ) from None


def load_general_prompts(num: int, seed: int, cache_dir: Path | None = None) -> datasets.Dataset:
    """num general-text items (columns prompt, text), generated, cached as jsonl, loaded with datasets."""
    if num < 0:
        raise ValueError(f"num must be >= 0, got {num}")
    cache = Path(cache_dir) if cache_dir is not None else _default_cache_dir()
    if num == 0:
        return datasets.Dataset.from_dict({"prompt": [], "text": []})
    file = cache / f"general-v{general.VERSION}-n{num}-s{seed}.jsonl"
    return _cached_jsonl(file, lambda: general.generate(num, seed), cache)
