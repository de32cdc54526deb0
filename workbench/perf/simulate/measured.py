"""The CPU (or any machine the workbench ran on) as the simulator's hardware: measured cost curves.

A datasheet roofline (:mod:`workbench.perf.simulate.costs`) says what a GPU could do; on the machine a
sweep ran on, the workbench has *measured* what its engine's forwards cost, and caches it
(:mod:`workbench.perf.cost_curve`, the curves behind ``speedup/gen_modeled``):

- ``target``: seconds of one target forward against tokens in flight (rows × tokens per row),
  linear between the measured points (:class:`workbench.perf.analytic.CostModel`, kind ``curve``);
- per drafter (:class:`workbench.perf.steps.DrafterCost`): ``draft_model`` its own forward curve,
  d(2n) + (k − 1)·d(n) per verification step at n rows; ``eagle3`` / ``mtp`` / ``ngram`` / ``suffix``
  the measured a + b·n seconds per verification step at that k.

:class:`MeasuredHardware` holds them; :func:`from_cache` finds the cached curves that fit a sweep's
runs (same target and draft model shape, same rollout batch, the run's drafter settings), and
``save``/``load`` write and read them as one JSON file (``wb simulate --from-sweep ... --costs FILE``
/ ``--save-costs FILE``), so a check can be repeated on another machine without the cache.
Nothing is timed here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from drafters import draft_cost_of
from workbench.perf.analytic import CostModel
from workbench.perf.steps import DrafterCost

FORMAT = "workbench.perf.simulate.measured/1"
# LeanLM config field -> Hugging Face config.json field (the shape that identifies a model's curve)
SHAPE_FIELDS = {
    "vocab_size": "vocab_size",
    "hidden_size": "hidden_size",
    "num_layers": "num_hidden_layers",
    "num_heads": "num_attention_heads",
    "num_kv_heads": "num_key_value_heads",
    "intermediate_size": "intermediate_size",
}


def drafter_key(kind: str, k: int) -> str:
    """``<kind>`` for a draft model of its own (``draft_model``: one forward curve serves every k), else
    ``<kind> k=<k>`` (measured per k)."""
    return kind if draft_cost_of(kind) == "model" else f"{kind} k={k}"


@dataclass
class MeasuredHardware:
    """Measured forward costs of one machine (seconds): the target's curve and the drafters' costs."""

    target: CostModel
    drafters: dict[str, DrafterCost] = field(default_factory=dict)
    meta: dict = field(default_factory=dict)

    def drafter(self, kind: str, k: int) -> DrafterCost:
        """The drafter's cost at k (``draft_model``'s curve carries any k).

        Raises:
            ValueError: not measured; the message names what is there and how to measure it.
        """
        key = drafter_key(kind, k)
        if key not in self.drafters:
            raise ValueError(
                f"no measured drafter cost for {key!r} (have: {', '.join(self.drafters) or 'none'}); "
                f"a `wb run` of that drafter with measure.modeled=true measures and caches it"
            )
        d = self.drafters[key]
        return d if d.curve is None else DrafterCost(d.kind, k, d.how, curve=d.curve)

    def to_json(self) -> dict:
        dr = {
            key: (
                {"tokens": d.curve.tokens, "seconds": d.curve.seconds}
                if d.curve is not None
                else {"a_s": d.a, "b_s": d.b}
            )
            for key, d in self.drafters.items()
        }
        return {
            "format": FORMAT,
            "meta": self.meta,
            "target": {"tokens": self.target.tokens, "seconds": self.target.seconds},
            "drafters": dr,
        }

    @classmethod
    def from_json(cls, d: dict) -> "MeasuredHardware":
        """Raises ValueError naming what is wrong (a ``wb project --save-costs`` file is another format)."""
        if "configs" in d and "target" not in d:
            raise ValueError(
                "this is a `wb project --save-costs` file (engine step costs); `wb simulate --from-sweep` reads "
                "forward cost curves: write one with `wb simulate --from-sweep NAME --save-costs FILE`"
            )
        try:
            target = _curve(d["target"], "target")
            drafters = {}
            for key, v in d.get("drafters", {}).items():
                kind, _, kk = key.partition(" k=")
                if "tokens" in v:
                    drafters[key] = DrafterCost(
                        kind, int(kk or 1), "draft model forward curve: d(2n) + (k-1)·d(n)", curve=_curve(v, key)
                    )
                else:
                    drafters[key] = DrafterCost(
                        kind, int(kk), "measured a + b·n per verification step", a=float(v["a_s"]), b=float(v["b_s"])
                    )
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"not a measured-hardware file ({FORMAT}): {type(e).__name__}: {e}") from None
        return cls(target, drafters, dict(d.get("meta", {})))

    def save(self, path: str | Path) -> Path:
        p = Path(path)
        p.write_text(json.dumps(self.to_json(), indent=1))
        return p

    @classmethod
    def load(cls, path: str | Path) -> "MeasuredHardware":
        """Raises ValueError (unreadable, not JSON, wrong format), naming the file."""
        try:
            return cls.from_json(json.loads(Path(path).read_text()))
        except (OSError, ValueError) as e:
            raise ValueError(f"--costs {path}: {e}") from None


def _curve(d: dict, what: str) -> CostModel:
    tokens, seconds = [float(x) for x in d["tokens"]], [float(x) for x in d["seconds"]]
    if (
        not tokens
        or len(tokens) != len(seconds)
        or any(b <= a for a, b in zip(tokens, tokens[1:]))
        or min(seconds) <= 0
    ):
        raise ValueError(f"{what}: tokens must increase and match seconds (> 0) one to one")
    return CostModel("curve", tokens, seconds)


# ------------------------------------------------------------------ the cost-curve cache


def model_shape(name: str) -> dict:
    """The config.json of model ``name`` (a checkpoint folder, or a preset already built or shipped).

    Raises:
        ValueError: no such folder or preset built here (nothing is built by this call).
    """
    from workbench.models.layout import cached_preset_dir, shipped_preset_dir

    p = Path(name).expanduser()
    folder = p if (p / "config.json").is_file() else (shipped_preset_dir(name) or cached_preset_dir(name))
    try:
        return json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        raise ValueError(
            f"model {name!r} has no config.json here ({folder}): build it (`wb models build {name}`) or give "
            "--costs FILE written on the machine that ran the sweep"
        ) from None


def same_shape(curve_config: dict, hf_config: dict) -> bool:
    """A cached curve's model config (LeanLM fields) describes the checkpoint's config.json."""
    return all(curve_config.get(a) == hf_config.get(b) for a, b in SHAPE_FIELDS.items() if b in hf_config)


def _entries(folder: Path) -> list[dict]:
    out = []
    for f in sorted(folder.glob("*.json")):
        try:
            d = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(d.get("key"), dict):
            out.append({**d, "file": f.name})
    return out


def _newest(hits: list[dict]) -> dict | None:
    return max(hits, key=lambda d: d.get("date", "")) if hits else None


def from_cache(
    points: list[tuple[dict[str, str], str, int]], chunk: int, folder: str | Path | None = None
) -> MeasuredHardware:
    """The cached curves that fit a sweep: ``points`` = (a run's params, drafter kind, k) per point,
    ``chunk`` = its rows decoded together (min(prompts × G, rollout.max_batch_size)). Per curve the
    newest match: same model shape (:func:`same_shape`), ``rows_max`` = chunk; a drafter's cost also
    the run's drafter settings (its init, online and model fields aside, as the cache keys them).

    Raises:
        ValueError: a curve is missing (names it, and the `wb run` that measures it).
    """
    from workbench.cache import cache_dir
    from workbench.perf.sweep_runs import spec_from_params

    folder = Path(folder) if folder else cache_dir() / "cost_curves"
    entries = _entries(folder)
    params = points[0][0]
    tshape = model_shape(params.get("model.target", "?"))
    fwd = [e for e in entries if e["key"].get("what") == "forward" and e["key"].get("rows_max") == chunk]
    target = _newest([e for e in fwd if same_shape(e["key"]["config"], tshape) and e["key"].get("t_max", 0) > 2])
    if target is None:
        raise ValueError(
            f"no cached forward curve of {params.get('model.target')!r} at {chunk} rows in {folder}: a `wb run` of the "
            "sweep's spec with measure.modeled=true measures it (or give --costs FILE)"
        )
    used = {"target": target}
    drafters: dict[str, DrafterCost] = {}
    for p, kind, k in points:
        key = drafter_key(kind, k)
        if kind == "none" or key in drafters:
            continue
        own_model = draft_cost_of(kind) == "model"
        if own_model:
            dshape = model_shape(p.get("drafter.model", "?"))
            hit = _newest([e for e in fwd if e["key"].get("t_max") == 2 and same_shape(e["key"]["config"], dshape)])
        else:
            conf = spec_from_params(p).drafter.model_dump(mode="json", exclude={"init", "online", "model"})
            hit = _newest(
                [
                    e
                    for e in entries
                    if e["key"].get("what") == "drafter"
                    and e["key"].get("drafter") == conf
                    and e["key"].get("rows_max") == chunk
                    and same_shape(e["key"]["config"], tshape)
                ]
            )
        if hit is None:
            raise ValueError(
                f"no cached drafter cost for {key!r} at {chunk} rows in {folder}: a `wb run` of that point with "
                "measure.modeled=true measures it (or give --costs FILE)"
            )
        used[key] = hit
        drafters[key] = (
            DrafterCost(
                kind,
                k,
                "draft model forward curve: d(2n) + (k-1)·d(n)",
                curve=CostModel("curve", hit["tokens"], hit["seconds"]),
            )
            if own_model
            else DrafterCost(kind, k, "measured a + b·n per verification step", a=hit["a_s"], b=hit["b_s"])
        )
    t = target["key"]
    meta = {
        "source": f"cost-curve cache {folder}",
        "machine": t.get("machine"),
        "device": t.get("device"),
        "torch": t.get("torch"),
        "threads": t.get("threads"),
        "dtype": t.get("dtype"),
        "rows_max": chunk,
        "ctx": t.get("ctx"),
        "curves": {
            name: {"file": e["file"], "date": e.get("date"), "load_avg_1m": e.get("load_avg_1m")}
            for name, e in used.items()
        },
    }
    return MeasuredHardware(CostModel("curve", target["tokens"], target["seconds"]), drafters, meta)
