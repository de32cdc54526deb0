"""MkDocs hook: pages generated at build time, so they never go stale.

- ``reference/cli.md`` from the Typer app (``workbench.cli.app`` as click commands: every command,
  argument and option with its type, default and help);
- ``reference/spec.md`` from the pydantic spec (``workbench.specs.ExperimentSpec`` and its sections:
  every field's dotted key, type, default and description);
- ``changelog.md`` from the repository's ``CHANGELOG.md`` (one source for the file and the site).

Registered in ``mkdocs.yml`` under ``hooks:``; it needs the repository root on ``sys.path``
(``pip install -e .`` or ``PYTHONPATH=.``). The pure functions ``cli_reference()`` and
``spec_reference()`` return Markdown and are tested on their own (tests/test_docs.py).
"""

from __future__ import annotations

import html
import sys
import typing
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def _cell(text: Any) -> str:
    """Text for one Markdown table cell: HTML escaped, pipes escaped, reST ``code`` as `code`, one line."""
    s = html.escape(str(text), quote=False).replace("|", "\\|").replace("``", "`")
    return " ".join(s.split())


# ---------------------------------------------------------------- CLI reference (Typer -> click)


# Typer 0.29 ships its own copy of click (``typer._click``), so commands and parameters are read by
# duck typing, not isinstance checks against the click package.


def _is_argument(p: Any) -> bool:
    return getattr(p, "param_type_name", "") == "argument"


def _param_type(p: Any) -> str:
    if getattr(p, "is_flag", False):
        return "flag"
    desc = getattr(p, "type_descriptor", None)
    ann = desc.annotation if desc is not None else getattr(getattr(p, "type", None), "name", "")
    name = _type_name(ann).replace(" | null", "")
    lo, hi = getattr(p, "min", None), getattr(p, "max", None)
    if lo is not None or hi is not None:
        name += (
            f" ({'' if lo is None else f'≥ {lo}'}"
            f"{', ' if lo is not None and hi is not None else ''}"
            f"{'' if hi is None else f'≤ {hi}'})"
        )
    return name


def _param_default(p: Any) -> str:
    d = p.default
    if d is None or callable(d) or (getattr(p, "is_flag", False) and d is False):
        return ""
    if isinstance(d, (list, tuple)):
        return ", ".join(str(x) for x in d) if d else ""
    return f"`{d}`"


def _param_names(p: Any) -> str:
    if _is_argument(p):
        return f"`{(p.metavar or p.name).upper()}`"
    names = ", ".join(f"`{n}`" for n in p.opts)
    secondary = ", ".join(f"`{n}`" for n in getattr(p, "secondary_opts", None) or [])
    return f"{names} / {secondary}" if secondary else names  # a boolean pair: --x / --no-x


def _command_section(cmd: Any, path: str, level: int) -> list[str]:
    out = [f"{'#' * level} `{path}`", ""]
    help_text = (cmd.help or "").strip()
    for para in help_text.split("\n\n") if help_text else []:
        if para.lstrip().startswith("Example:"):  # a command line: as code, not a wrapped paragraph
            out += [
                "```bash",
                *(ln.strip().removeprefix("Example:").strip() for ln in para.strip().splitlines()),
                "```",
                "",
            ]
        else:  # Typer/Rich help may hold text in square brackets ("[vllm-cpu]"): keep it literal
            out += [html.escape(para.strip(), quote=False).replace("[", "\\["), ""]
    params = [p for p in cmd.params if not getattr(p, "hidden", False) and p.name != "help"]
    if params:
        out += ["| name | kind | type | default | help |", "|---|---|---|---|---|"]
        for p in params:
            kind = "argument" if _is_argument(p) else "option"
            req = " (required)" if p.required else ""
            out.append(
                f"| {_param_names(p)} | {kind}{req} | {_cell(_param_type(p))} | {_param_default(p)} | "
                f"{_cell(getattr(p, 'help', '') or '')} |"
            )
        out.append("")
    if hasattr(cmd, "list_commands"):  # a group: its subcommands, in the order the app lists them
        ctx = cmd.context_class(cmd, info_name=path.split()[-1])
        for name in cmd.list_commands(ctx):
            sub = cmd.get_command(ctx, name)
            if sub is not None and not getattr(sub, "hidden", False):
                out += _command_section(sub, f"{path} {name}", min(level + 1, 4))
    return out


def cli_reference() -> str:
    """Markdown for every `wb` command, walked from the Typer app as click commands."""
    import typer.main

    from workbench.cli import app

    root = typer.main.get_command(app)
    lines = [
        "# CLI reference",
        "",
        "Generated from the Typer app (`workbench.cli.app`) when the site is built; `wb COMMAND --help` "
        "prints the same. Spec keys given as `key=value` overrides are listed in the [spec reference](spec.md).",
        "",
    ]
    lines += _command_section(root, "wb", 2)
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- spec reference (pydantic fields)


def _type_name(ann: Any) -> str:
    origin = typing.get_origin(ann)
    if origin is typing.Literal:
        return " | ".join(repr(a) if not isinstance(a, str) else a for a in typing.get_args(ann))
    if origin is not None:
        args = [a for a in typing.get_args(ann)]
        if origin in (typing.Union,) or str(origin) == "<class 'types.UnionType'>":
            return " | ".join("null" if a is type(None) else _type_name(a) for a in args)
        name = getattr(origin, "__name__", str(origin))
        return f"{name}[{', '.join(_type_name(a) for a in args)}]"
    if ann is type(None):
        return "null"
    return getattr(ann, "__name__", str(ann).replace("typing.", ""))


def _is_model(ann: Any) -> bool:
    from pydantic import BaseModel

    return isinstance(ann, type) and issubclass(ann, BaseModel)


def _yaml_value(value: Any) -> str:
    """A default as it is written in a spec YAML (null, true, 0.001, [a, b])."""
    import json

    try:
        return f"`{json.dumps(value, ensure_ascii=False)}`" if not isinstance(value, str) else f"`{value}`"
    except TypeError:
        return f"`{value!r}`"


def _default(field: Any) -> str:
    from pydantic_core import PydanticUndefined

    if field.default_factory is not None:
        try:
            value = field.default_factory()
        except TypeError:
            return "(computed)"
        return "" if _is_model(type(value)) else _yaml_value(value)
    if field.default is PydanticUndefined:
        return "(required)"
    return _yaml_value(field.default)


def _constraints(field: Any) -> str:
    parts = []
    for m in field.metadata:
        for attr, sym in (("ge", "≥"), ("gt", ">"), ("le", "≤"), ("lt", "<")):
            v = getattr(m, attr, None)
            if v is not None:
                parts.append(f"{sym} {v}")
    return ", ".join(parts)


def _model_rows(model: type, prefix: str, sections: list[tuple[str, type]]) -> list[str]:
    rows = []
    for name, field in model.model_fields.items():
        key = f"{prefix}{field.alias or name}"  # the YAML spelling (grpo.async, not the attribute async_)
        ann = field.annotation
        if _is_model(ann):
            sections.append((key, ann))
            rows.append(
                f"| [`{key}`](#{key.replace('.', '')}) | section | | "
                f"{_cell(field.description or 'the section below')} |"
            )
            continue
        desc = field.description or ""
        cons = _constraints(field)
        if cons:
            desc = f"{desc} ({cons})" if desc else f"({cons})"
        rows.append(f"| `{key}` | {_cell(_type_name(ann))} | {_default(field)} | {_cell(desc)} |")
    return rows


def spec_reference() -> str:
    """Markdown for every field of the experiment spec, section by section, as dotted keys."""
    from workbench.specs import ExperimentSpec

    lines = [
        "# Spec reference",
        "",
        "Generated from the pydantic models of `workbench.specs` when the site is built. A spec is a YAML file "
        "(`experiments/*.yaml`); any field can be overridden on the command line by its dotted key "
        "(`wb run drafter.k=5 rollout.temperature=0.7`). Unknown keys are refused, naming the allowed ones; so are "
        "a boolean where a number goes (`drafter.k=true`) and an empty spec file.",
        "",
    ]
    queue: list[tuple[str, type]] = [("", ExperimentSpec)]
    while queue:
        prefix, model = queue.pop(0)
        title = prefix or "top level"
        lines += [f"## {title}" if not prefix else f"## `{prefix}` {{#{prefix.replace('.', '')}}}", ""]
        doc = (model.__doc__ or "").strip()
        if doc and model is not ExperimentSpec:
            lines += [html.escape(" ".join(doc.split()), quote=False).replace("``", "`"), ""]
        lines += ["| key | type | default | description |", "|---|---|---|---|"]
        new: list[tuple[str, type]] = []
        lines += _model_rows(model, f"{prefix}." if prefix else "", new)
        lines.append("")
        queue = new + queue
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- the hook


def on_files(files: Any, config: Any) -> Any:
    from mkdocs.structure.files import File

    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    pages = {
        "reference/cli.md": cli_reference(),
        "reference/spec.md": spec_reference(),
        # CHANGELOG.md links from the repository root (docs/...); the page sits in docs/ itself
        "changelog.md": (ROOT / "CHANGELOG.md").read_text(encoding="utf-8").replace("](docs/", "]("),
    }
    for uri, content in pages.items():
        files.append(File.generated(config, uri, content=content))
    return files
