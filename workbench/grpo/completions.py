"""Completion-length statistics of one GRPO step, as TRL logs them, and the per-row record.

The long tail of completion lengths sets how long a rollout stage takes (docs/design.md §3, §13), and
it is what transfers from a laptop run to a cluster projection (``wb simulate``, whose response
lengths may be taken from a run: :mod:`workbench.perf.simulate.lengths`). Each step logs

- the scalars TRL's ``GRPOTrainer`` logs under the same names: ``completions/mean_length``,
  ``completions/min_length``, ``completions/max_length`` (tokens, EOS included when emitted) and
  ``completions/clipped_ratio`` (share of completions cut at ``max_new_tokens``), plus
  ``completions/frac_stop`` (share that emitted EOS);
- the per-row lengths as the artifact ``completions/lengths/step_<step:05d>.json``
  (:func:`lengths_record`): rows are grouped consecutively, ``[g*G : (g+1)*G]`` the G samples of
  prompt g (the layout of :mod:`workbench.grpo.advantages`), so the record keeps which rows share a
  prompt (lengths within a group are correlated: one prompt is hard for all its samples).
"""

from __future__ import annotations

from workbench import metrics as M

FORMAT = "workbench.completion_lengths/1"


def completion_metrics(lengths: list[int], finish_reasons: list[str]) -> dict[str, float]:
    """TRL-named length scalars of one step's completions.

    Args:
        lengths: tokens per completion (N,), EOS included when emitted.
        finish_reasons: per completion, "stop" (EOS) or "length" (cut at max_new_tokens).

    Raises:
        ValueError: no completions, or the two lists differ in length.
    """
    if not lengths or len(lengths) != len(finish_reasons):
        raise ValueError(
            f"completion_metrics needs one finish reason per completion (got {len(lengths)} lengths, "
            f"{len(finish_reasons)} reasons)"
        )
    n = len(lengths)
    stop = sum(r == "stop" for r in finish_reasons) / n
    return {
        M.COMPLETIONS_MEAN_LENGTH: sum(lengths) / n,
        M.COMPLETIONS_MIN_LENGTH: float(min(lengths)),
        M.COMPLETIONS_MAX_LENGTH: float(max(lengths)),
        M.COMPLETIONS_CLIPPED_RATIO: sum(r == "length" for r in finish_reasons) / n,
        M.COMPLETIONS_FRAC_STOP: stop,
    }


def lengths_record(lengths: list[int], group_size: int, max_new_tokens: int) -> dict:
    """The JSON artifact of one step's per-row lengths (tokens), rows grouped by prompt.

    Raises:
        ValueError: ``group_size`` does not divide the number of rows.
    """
    if group_size < 1 or len(lengths) % group_size:
        raise ValueError(f"{len(lengths)} completions do not split into groups of grpo.group_size={group_size}")
    return {
        "format": FORMAT,
        "group_size": int(group_size),
        "max_new_tokens": int(max_new_tokens),
        "lengths": [int(x) for x in lengths],
    }
