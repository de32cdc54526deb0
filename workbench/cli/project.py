"""`wb project`: folded into `wb simulate` (the one performance-model command). It prints the `wb simulate`
command its arguments are and runs it; the options of the retired step-speedup sweep check are refused."""

from __future__ import annotations

import shlex

import typer

from workbench.cli.common import _fail, app, console

RENAMED = {"--run": "--from-run", "--seeds": "--published", "--sweep": "--from-sweep"}
RETIRED = ("--costs", "--save-costs", "--threads", "--reps", "--tolerance", "--load-adjust")


def simulate_args(args: list[str]) -> list[str]:
    """`wb project`'s arguments as `wb simulate`'s (``--run`` -> ``--from-run``, ``--seeds`` -> ``--published``,
    ``--sweep`` -> ``--from-sweep``; ``--opt=value`` forms too)."""
    out = []
    for a in args:
        name, eq, value = a.partition("=")
        out.append(RENAMED.get(name, name) + eq + value if name.startswith("--") else a)
    return out


@app.command(
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True, "help_option_names": []},
    add_help_option=False,
)
def project(ctx: typer.Context) -> None:
    """Folded into `wb simulate`: prints the equivalent `wb simulate` command and runs it (see wb simulate --help).

    Examples: wb project --gen 100 --alpha 0.8 (= wb simulate --gen 100 --alpha 0.8) |
    wb project --seeds (= wb simulate --published) | wb project --sweep NAME (= wb simulate --from-sweep NAME)
    """
    from typer.main import get_command

    args = list(ctx.args)
    if any(a.partition("=")[0] in RETIRED for a in args):
        _fail(
            "--costs, --save-costs, --threads, --reps, --tolerance and --load-adjust belonged to the retired "
            "step-speedup check of `wb project --sweep`; the one model-vs-sweep check is `wb simulate --from-sweep "
            "NAME` (see its --help)"
        )
    new = simulate_args(args)
    if "--help" in new or "-h" in new:
        new = ["--help"]
    console.print(f"note: `wb project` is now `wb simulate`: wb simulate {shlex.join(new)}", highlight=False)
    rc = get_command(app).main(["simulate", *new], prog_name="wb", standalone_mode=False)
    if isinstance(rc, int) and rc:  # without standalone mode click returns the exit code of typer.Exit
        raise typer.Exit(rc)
