"""Loading a spec: a YAML file or a shipped name (experiments/, package data of ``workbench``), dotted-key
overrides, validation with errors that name the field, the allowed keys and the fix."""

from __future__ import annotations

import copy
import difflib
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from workbench.specs.aliases import canonical_path
from workbench.specs.dotted import set_dotted
from workbench.specs.experiment import ExperimentSpec
from workbench.specs.sections import SpecError

# The shipped specs: package data (workbench/experiments, a link to the checkout's top-level experiments/ that
# the wheel stores as files), so a spec name works from any folder and from a wheel install alike.
EXPERIMENTS_DIR = Path(__file__).resolve().parents[1] / "experiments"
DEFAULT_SPEC = "quickstart"


def _section_fields(path: tuple) -> list[str]:
    """Allowed keys at a spec path (tuple of field names), for error messages."""
    model: type[BaseModel] = ExperimentSpec
    for part in path:
        field = _field(model, str(part))
        ann = getattr(field, "annotation", None) if field else None
        if not (isinstance(ann, type) and issubclass(ann, BaseModel)):
            return []
        model = ann
    return [f.alias or name for name, f in model.model_fields.items()]


def _field(model: type[BaseModel], name: str):
    """The field called ``name`` in specs (its alias if it has one: ``grpo.async``), or None."""
    return next((f for n, f in model.model_fields.items() if (f.alias or n) == name), None)


def _field_hint(loc: tuple) -> str:
    """' (expected: int in [1, 16]; <description>)' for a spec field, from its pydantic metadata."""
    model: type[BaseModel] = ExperimentSpec
    info = None
    for part in loc:
        info = _field(model, str(part))
        if info is None:
            return ""
        ann = info.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            model = ann
    if info is None:
        return ""
    bounds = {}
    for m in info.metadata:
        for name in ("ge", "gt", "le", "lt"):
            if getattr(m, name, None) is not None:
                bounds[name] = getattr(m, name)
    ann = info.annotation
    tname = getattr(ann, "__name__", None) or str(ann).replace("typing.", "")
    rng = ""
    if bounds:
        lo = f"[{bounds['ge']}" if "ge" in bounds else (f"({bounds['gt']}" if "gt" in bounds else "(-inf")
        hi = f"{bounds['le']}]" if "le" in bounds else (f"{bounds['lt']})" if "lt" in bounds else "inf)")
        rng = f" in {lo}, {hi}"
    desc = f"; {info.description}" if info.description else ""
    return f" [expected: {tname}{rng}{desc}]"


def format_validation_error(err: ValidationError, source: str = "spec") -> str:
    lines = [f"invalid {source}:"]
    for e in err.errors():
        loc = tuple(str(p) for p in e["loc"])
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "bool_not_number":  # raised by a section for one of its keys: name that key
            loc += (str(e["ctx"]["field"]),)
            msg = e["msg"] + _field_hint(loc)
        field = ".".join(loc) or "(root)"
        if e["type"] == "extra_forbidden":
            allowed = _section_fields(loc[:-1])
            close = difflib.get_close_matches(loc[-1], allowed, n=1)
            hint = f" Did you mean {'.'.join(loc[:-1] + (close[0],))!r}?" if close else ""
            msg = f"unknown key.{hint} Allowed keys here: {', '.join(allowed)}"
        elif "input" in e and e["type"] not in ("missing", "bool_not_number") and not isinstance(e["input"], dict):
            msg = f"{msg} (got {e['input']!r})" + (
                _field_hint(loc) if e["type"] not in ("value_error", "literal_error") else ""
            )
        lines.append(f"  {field}: {msg}")
    return "\n".join(lines)


def parse_override(item: str) -> tuple[list[str], Any]:
    """``drafter.k=5`` -> (["drafter", "k"], 5). Values are parsed as YAML scalars/lists."""
    if "=" not in item:
        raise SpecError(f"override {item!r} must look like key=value, e.g. drafter.k=5")
    key, raw = item.split("=", 1)
    key = key.strip()
    if not key or any(not p for p in key.split(".")):
        raise SpecError(f"override {item!r}: empty key; use a dotted key such as drafter.k")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    if value is None and raw.strip().lower() not in ("null", "none", "~"):
        value = raw
    if isinstance(value, str) and value.lower() == "none" and key.split(".")[-1] not in ("kind", "method"):
        value = None
    return key.split("."), value


def apply_overrides(raw: dict[str, Any], overrides: list[str], aliases: bool = True) -> dict[str, Any]:
    """A copy of ``raw`` with each ``key=value`` override set (:func:`parse_override`).

    aliases: rename vLLM's/TRL's key names to the spec's own first (:mod:`workbench.specs.aliases`), so
    ``drafter.num_speculative_tokens=2`` sets ``drafter.k``; off for documents that are not experiment specs.

    Raises:
        SpecError: a malformed override, a value an alias does not take, or a key through a value
            (``drafter.k.x=1``).
    """
    data = raw
    for item in overrides:
        path, value = parse_override(item)
        try:
            if aliases:
                path, value = canonical_path(path, value)
            data = set_dotted(data, ".".join(path), value)
        except ValueError as e:
            raise SpecError(f"override {item!r}: {str(e).split(': ', 1)[-1]}") from None
    return copy.deepcopy(data) if data is raw else data


def resolve_spec_path(spec: str | Path | None) -> Path:
    """A spec argument may be a file path or the name of a spec under experiments/."""
    if spec is None:
        spec = DEFAULT_SPEC
    p = Path(spec)
    if p.is_file():
        return p
    named = EXPERIMENTS_DIR / f"{spec}.yaml"
    if named.is_file():
        return named
    names = sorted(x.stem for x in EXPERIMENTS_DIR.glob("*.yaml"))
    raise SpecError(f"spec {str(spec)!r} not found: give a YAML file path or one of: {', '.join(names)}")


def load_spec(spec: str | Path | None = None, overrides: list[str] | None = None) -> ExperimentSpec:
    """Load a YAML spec (path or name under experiments/), apply dotted overrides, validate.

    Raises:
        SpecError: the file is missing or not YAML, an override is malformed, or validation fails;
            the message names each bad field with the allowed keys/values.
    """
    path, raw = read_raw_spec(spec)
    raw = apply_overrides(raw, overrides or [])
    return validate_spec(raw, source=f"spec {path.name}" + (" with overrides" if overrides else ""))


def read_raw_spec(spec: str | Path | None) -> tuple[Path, dict[str, Any]]:
    """(path, unvalidated mapping) of a spec file or name under experiments/.

    Raises:
        SpecError: missing file, invalid YAML, or a document that is not a mapping of sections.
    """
    path = resolve_spec_path(spec)
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise SpecError(f"spec {path} cannot be read ({e.__class__.__name__}: {e}); check the file") from None
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise SpecError(f"spec {path} is not valid YAML: {yaml_error_line(e, text)}") from None
    if raw is None:
        raise SpecError(
            f"spec {path} is empty (no sections): write the sections to change, e.g. 'drafter: {{kind: ngram}}', "
            "or give no spec for the quickstart defaults"
        )
    if not isinstance(raw, dict):
        raise SpecError(f"spec {path} must be a mapping of sections ({', '.join(ExperimentSpec.model_fields)})")
    return path, raw


def yaml_error_line(e: yaml.YAMLError, text: str = "") -> str:
    """PyYAML's error on one line: where (line, column, the line's text), what was expected, and the construct
    it was parsing (``str(e)`` spreads these over several lines, with a caret under the column)."""
    mark = getattr(e, "problem_mark", None)
    problem = getattr(e, "problem", None)
    if mark is None or not problem:
        return " ".join(str(e).split())
    where = f"line {mark.line + 1}, column {mark.column + 1}"
    lines = text.splitlines()
    if mark.line < len(lines) and lines[mark.line].strip():
        where += f" ({lines[mark.line].strip()!r})"
    out = f"{where}: {problem}"
    context, cmark = getattr(e, "context", None), getattr(e, "context_mark", None)
    if context:
        out += f" ({context}" + (f" from line {cmark.line + 1}, column {cmark.column + 1})" if cmark else ")")
    return out


def validate_spec(raw: dict[str, Any], source: str = "spec") -> ExperimentSpec:
    try:
        return ExperimentSpec.model_validate(raw)
    except ValidationError as e:
        raise SpecError(format_validation_error(e, source)) from None
