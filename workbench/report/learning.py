"""`wb report`'s "Does GRPO learn?" table: held-out accuracy at the first and last eval of each run,
pooled per drafter kind over seeds, with the rise and its interval.

Why pooled counts: one run's eval (256 prompts on ``learn.yaml``) moves by ±0.06 (Wilson 95 %), as
much as 300 steps of GRPO on ``tiny`` raise it; 3 seeds pool 768 scored prompts on each side.
Every run's eval prompts are scored before and after training, so the two proportions are
positively correlated and Newcombe's interval for independent samples
(:func:`workbench.stats.proportion_diff_ci`) is conservative: a rise whose interval excludes 0 is one.
"""

from __future__ import annotations

from workbench import metrics as M
from workbench.report.tables import md_table, reward_groups
from workbench.report.target import Target
from workbench.runs import RunRecord
from workbench.stats import proportion_diff_ci, wilson

# (metric, row label): the task's verifier, then the anchor-free check (the completion's last number is
# the answer): a rise that shows under the verifier but not here may be answers made readable, not right
EVALS = (
    (M.EVAL_ACCURACY, "greedy"),
    (f"{M.EVAL_SAMPLED}/accuracy", "sampled"),
    (f"{M.EVAL}/last_number", "greedy, last number"),
    (f"{M.EVAL_SAMPLED}/last_number", "sampled, last number"),
)


def _counts(r: RunRecord, key: str) -> tuple[int, int, int, int, int] | None:
    """(correct first, correct last, prompts per eval, first step, last step) of one run's ``key``;
    None without two evals or ``task.num_eval``."""
    pts = r.history.get(key, [])
    try:
        n = int(r.params.get("task.num_eval", ""))
    except ValueError:
        return None
    if len(pts) < 2 or n < 1:
        return None
    (s0, a0), (s1, a1) = pts[0], pts[-1]
    return round(a0 * n), round(a1 * n), n, s0, s1


def eval_rise_rows(t: Target) -> list[list[str]]:
    """One row per drafter group and eval kind: runs, steps, accuracy first -> last (Wilson 95 %), rise [CI]."""
    rows = []
    for group, runs in reward_groups(t).items():
        for key, what in EVALS:
            cs = [c for c in (_counts(r, key) for r in runs) if c]
            if not cs:
                continue
            k0, k1, n = sum(c[0] for c in cs), sum(c[1] for c in cs), sum(c[2] for c in cs)
            (l0, h0), (l1, h1) = wilson(k0, n), wilson(k1, n)
            d, lo, hi = proportion_diff_ci(k0, n, k1, n)
            steps = sorted({f"{c[3]}→{c[4]}" for c in cs})
            rows.append(
                [
                    group,
                    what,
                    str(len(cs)),
                    ", ".join(steps),
                    f"{k0 / n:.3f} [{l0:.3f}, {h0:.3f}]",
                    f"{k1 / n:.3f} [{l1:.3f}, {h1:.3f}]",
                    f"{d:+.3f} [{lo:+.3f}, {hi:+.3f}]",
                    "yes" if lo > 0 else ("fell" if hi < 0 else "not shown"),
                ]
            )
    return rows


def eval_rise_md(t: Target) -> list[str]:
    """The section's lines (empty when no run logged two evals)."""
    rows = eval_rise_rows(t)
    if not rows:
        return []
    return [
        md_table(
            [
                "drafter",
                "eval",
                "runs",
                "steps",
                "accuracy first [95 %]",
                "accuracy last [95 %]",
                "rise [95 %]",
                "rise shown",
            ],
            rows,
            {2},
        ),
        "",
        f"Held-out accuracy (`{M.EVAL_ACCURACY}`: greedy; `{M.EVAL_SAMPLED}/accuracy`: at the rollouts' sampling; "
        '"last number": the anchor-free check `*/last_number`, the completion\'s last number taken as its answer) at '
        "each run's first and last eval, correct answers pooled over the group's FINISHED runs (seeds); Wilson 95 % "
        "intervals, the rise with Newcombe's hybrid score interval (conservative here: the same prompts are scored "
        'before and after). "yes": the interval excludes 0.',
        "",
    ]
