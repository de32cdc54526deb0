"""The shipped specs as a catalogue: their names and one-line purposes, a copy to edit, the JSON Schema.

    for s in shipped_specs(): print(s.name, s.purpose)   # experiments/*.yaml, package data of workbench
    copy_spec("quickstart", Path("my.yaml"))             # a copy to edit, its schema line pointing at the schema
    schema = spec_schema()                                # JSON Schema (draft 2020-12) of ExperimentSpec

Editors (VS Code's YAML extension, any yaml-language-server client) read a first line
``# yaml-language-server: $schema=<path or URL>``; the shipped specs name ``spec.schema.json`` beside them.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workbench.specs.aliases import ALIASES
from workbench.specs.experiment import ExperimentSpec
from workbench.specs.load import EXPERIMENTS_DIR, resolve_spec_path
from workbench.specs.sections import SpecError

SCHEMA_FILE = "spec.schema.json"
SCHEMA_LINE = "# yaml-language-server: $schema="
_ISSUE_REF = re.compile(r"\s*\((issue|issues) #[^)]*\)")


@dataclass(frozen=True)
class ShippedSpec:
    name: str
    purpose: str  # the first sentence of the file's leading comment
    path: Path


def purpose_of(text: str) -> str:
    """The first sentence of a YAML file's leading comment block (the schema line skipped), or ""."""
    lines = []
    for line in text.splitlines():
        if line.startswith(SCHEMA_LINE):
            continue
        if not line.startswith("#"):
            break
        lines.append(line.lstrip("#").strip())
    words = _ISSUE_REF.sub("", " ".join(x for x in lines if x))
    return re.split(r"(?<=[.?])\s", words, maxsplit=1)[0].rstrip(".")


def shipped_specs() -> list[ShippedSpec]:
    """Every spec shipped with the package (``experiments/*.yaml``), sorted by name."""
    return [
        ShippedSpec(p.stem, purpose_of(p.read_text()), p)
        for p in sorted(EXPERIMENTS_DIR.glob("*.yaml"))
        if p.name != SCHEMA_FILE
    ]


def copy_spec(name: str, dest: Path | None = None, force: bool = False) -> Path:
    """Write the shipped spec ``name`` (or a spec file) to ``dest`` (default ``./NAME.yaml``; a folder gets
    ``NAME.yaml`` inside) for editing; its schema line points at the installed schema file.

    Raises:
        SpecError: an unknown name, a destination that exists (without ``force``), or one that cannot be written.
    """
    src = resolve_spec_path(name)
    dest = Path(dest) if dest is not None else Path(f"{src.stem}.yaml")
    if dest.is_dir():
        dest = dest / f"{src.stem}.yaml"
    if dest.exists() and not force:
        raise SpecError(f"{dest} exists; give another destination or --force to overwrite it")
    text = src.read_text()
    body = "\n".join(line for line in text.splitlines() if not line.startswith(SCHEMA_LINE))
    schema = (EXPERIMENTS_DIR / SCHEMA_FILE).resolve()
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_text(f"{SCHEMA_LINE}{schema.as_uri()}\n{body}\n")
    except OSError as e:
        raise SpecError(f"cannot write {dest}: {e.strerror or e}; choose a writable destination") from None
    return dest


def spec_schema() -> dict[str, Any]:
    """The JSON Schema of an experiment spec: pydantic's, with vLLM's and TRL's key names
    (:mod:`workbench.specs.aliases`) as properties that say which key they stand for."""
    schema = ExperimentSpec.model_json_schema(by_alias=True)
    schema["title"] = "speculation workbench experiment spec"
    defs = schema.get("$defs", {})
    props = schema.get("properties", {})
    for section, table in ALIASES.items():
        ref = props.get(section, {}).get("$ref", "")
        target = defs.get(ref.rsplit("/", 1)[-1]) if ref else None
        if target is None:
            continue
        for alias, spec in table.items():
            canonical = dict(target["properties"][spec.canonical])
            canonical.pop("default", None)
            if spec.values:
                canonical = {"enum": list(spec.values)}
            canonical["description"] = f"{spec.source}'s name for {section}.{spec.canonical}"
            target["properties"][alias] = canonical
    return schema


def schema_text() -> str:
    """:func:`spec_schema` as the committed file's text (sorted keys, 2-space indent, a final newline)."""
    return json.dumps(spec_schema(), indent=2, sort_keys=True) + "\n"


def write_schema(dest: Path) -> Path:
    """Write :func:`schema_text` to ``dest`` (a folder gets ``spec.schema.json``).

    Raises:
        SpecError: the destination cannot be written.
    """
    dest = Path(dest)
    if dest.is_dir():
        dest = dest / SCHEMA_FILE
    try:
        dest.write_text(schema_text())
    except OSError as e:
        raise SpecError(f"cannot write {dest}: {e.strerror or e}; choose a writable destination") from None
    return dest
