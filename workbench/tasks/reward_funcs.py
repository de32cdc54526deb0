"""Which reward functions a run scores with: ``task.reward`` references resolved, or the task's own.

    funcs = spec_reward_funcs(spec.task)        # [RewardFunc(name, func, weight, ref), ...]
    resolve_reward("trl.rewards:accuracy_reward")   # the function, its signature checked

``task.reward`` is ``"package.module:function"`` (or a list of them, weighted by ``task.reward_weights``),
each a reward function as TRL's ``GRPOTrainer`` takes in ``reward_funcs``: called with keyword arguments
``prompts``, ``completions``, ``completion_ids`` and every dataset column (plus ``trainer_state``,
``log_extra``, ``log_metric``), returning one float or None per completion. Everything that can be checked
without data is checked when the spec is validated (module, attribute, callable, signature), the columns
a function requires once the data is loaded (:func:`check_columns`), both before any MLflow run opens.
Without ``task.reward`` the registered task's verifiers are the functions (workbench.tasks.rewards):
``accuracy`` (weight 1), ``format`` (weight ``task.format_reward``) and ``last_number`` (weight 0: logged,
never trained on), logged as ``reward/accuracy``, ``reward/format``, ``reward/last_number``.
Source: TRL trl/trainer/grpo_trainer.py (``reward_funcs``, ``reward_weights``, ``_calculate_rewards``).
"""

from __future__ import annotations

import difflib
import importlib
import inspect
from dataclasses import dataclass
from typing import Any, Callable

TRL_ARGS = ("prompts", "completions", "completion_ids")  # the keyword arguments TRL always passes
TRAINER_ARGS = ("trainer_state", "log_extra", "log_metric")  # what the trainer adds beside the columns
RESERVED = ("mean", "std", "final")  # reward/<name> metrics the step logs itself


@dataclass(frozen=True)
class RewardFunc:
    """One reward function of a run: its metric name (``reward/<name>``), the function, its weight in the
    summed reward, and its ``task.reward`` reference (None for a task's own)."""

    name: str
    func: Callable[..., list]
    weight: float = 1.0
    ref: str | None = None

    @property
    def label(self) -> str:
        """How errors name it: the reference, or the built-in's name."""
        return self.ref or f"the task's {self.name} reward"


def _fail(ref: str, why: str, fix: str) -> ValueError:
    return ValueError(f"task.reward: {ref!r} {why}. Fix: {fix}")


def resolve_reward(ref: str) -> Callable[..., list]:
    """The reward function ``ref`` names (``"package.module:function"``; ``function`` may be dotted,
    ``module:Class.method``), imported, and its signature checked (:func:`check_signature`).

    Raises:
        ValueError: naming task.reward and the fix: not of the form module:function, the module
            cannot be imported (or raised on import), the attribute is missing, it is not callable,
            or its signature cannot take TRL's keyword arguments.
    """
    if not isinstance(ref, str) or ref.count(":") != 1 or not all(ref.split(":")):
        raise _fail(
            str(ref), "is not a reference", "write it as package.module:function, e.g. trl.rewards:accuracy_reward"
        )
    mod_name, attr = ref.split(":")
    try:
        obj: Any = importlib.import_module(mod_name)
    except ImportError as e:
        raise _fail(
            ref,
            f"cannot import module {mod_name!r} ({type(e).__name__}: {e})",
            "install its package or put its folder on PYTHONPATH, or correct the module name",
        ) from None
    except Exception as e:  # the user's module itself raised while importing
        raise _fail(ref, f"module {mod_name!r} raised on import ({type(e).__name__}: {e})", "fix the module") from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            names = sorted(n for n in dir(obj) if not n.startswith("_") and inspect.isfunction(getattr(obj, n, None)))
            close = difflib.get_close_matches(part, names, n=1)
            raise _fail(
                ref,
                f"names nothing: {mod_name} has no attribute {part!r}",
                f"did you mean {close[0]!r}?"
                if close
                else f"name one of its functions ({', '.join(names[:12]) or 'none'})",
            )
        obj = getattr(obj, part)
    if not callable(obj):
        raise _fail(ref, f"is a {type(obj).__name__}, not a function", "name a function (or a callable object)")
    check_signature(obj, ref)
    return obj


def check_signature(func: Callable, ref: str) -> None:
    """Refuse a function TRL could not call: it must take ``prompts``, ``completions`` and ``completion_ids``
    by keyword, each as a named parameter or through ``**kwargs`` (TRL passes them, and every column, by
    keyword), and have no required positional-only parameter.

    Raises:
        ValueError: naming task.reward, the missing parameters and the signature to use.
    """
    try:
        params = inspect.signature(func).parameters
    except (TypeError, ValueError):  # a builtin without a signature: let the first call decide
        return
    fix = "give it the signature def f(prompts, completions, completion_ids, **kwargs) (TRL's reward_funcs)"
    pos_only = [n for n, p in params.items() if p.kind is p.POSITIONAL_ONLY and p.default is p.empty]
    if pos_only:
        raise _fail(ref, f"has positional-only parameters ({', '.join(pos_only)}); TRL calls by keyword", fix)
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return
    keyword = {n for n, p in params.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    missing = [a for a in TRL_ARGS if a not in keyword]
    if missing:
        raise _fail(ref, f"cannot take the keyword arguments {', '.join(missing)} (and has no **kwargs)", fix)


def required_columns(func: Callable) -> list[str]:
    """The parameters ``func`` requires beyond TRL's and the trainer's arguments: dataset columns."""
    try:
        params = inspect.signature(func).parameters
    except (TypeError, ValueError):
        return []
    skip = set(TRL_ARGS) | set(TRAINER_ARGS)
    return [
        n
        for n, p in params.items()
        if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.default is p.empty and n not in skip
    ]


def check_columns(funcs: list[RewardFunc], columns: list[str]) -> None:
    """Refuse, before a run opens, a reward function that requires a column the task data lacks (TRL
    would fail at its first call). ``columns``: the loaded data's column names.

    Raises:
        ValueError: naming task.reward, the function, the missing column and the columns there are.
    """
    for f in funcs:
        if f.ref is None:
            continue
        missing = [c for c in required_columns(f.func) if c not in columns or c == "prompt"]
        if missing:
            raise _fail(
                f.ref,
                f"requires the column(s) {', '.join(missing)}, which the task data lacks "
                f"(columns: {', '.join(columns)})",
                "give task.path a dataset with that column (task.answer_field renames the answer column), "
                "or give the parameter a default",
            )


def callable_name(func: Callable) -> str:
    """The function's name as TRL logs it (``rewards/<name>/mean``): ``__name__``, a partial's wrapped
    function's, else the class name of a callable object."""
    while hasattr(func, "func") and not hasattr(func, "__name__"):  # functools.partial
        func = func.func
    return getattr(func, "__name__", type(func).__name__)


def reward_refs(reward: str | list[str] | None) -> list[str]:
    """``task.reward`` as a list of references (empty when unset)."""
    if reward is None:
        return []
    return [reward] if isinstance(reward, str) else list(reward)


def user_reward_funcs(reward: str | list[str], weights: list[float] | None = None) -> list[RewardFunc]:
    """``task.reward`` resolved, with ``task.reward_weights`` (default all 1.0). Metric names are the
    functions' names, made distinct (``name_2``) and kept off the step's own ``reward/mean|std|final``.

    Raises:
        ValueError: a bad reference (:func:`resolve_reward`), or a weights list of another length.
    """
    refs = reward_refs(reward)
    if weights is not None and len(weights) != len(refs):
        raise ValueError(
            f"task.reward_weights: {len(weights)} weights for {len(refs)} reward functions; "
            "give one weight per task.reward entry, or leave task.reward_weights unset (all 1.0)"
        )
    out: list[RewardFunc] = []
    for ref, w in zip(refs, weights if weights is not None else [1.0] * len(refs)):
        func = resolve_reward(ref)
        name = callable_name(func)
        name = f"{name}_func" if name in RESERVED else name
        taken = {f.name for f in out}
        base, i = name, 2
        while name in taken:
            name, i = f"{base}_{i}", i + 1
        out.append(RewardFunc(name, func, float(w), ref))
    return out


def task_reward_funcs(task: Any, format_weight: float = 0.0) -> list[RewardFunc]:
    """A registered task's own rewards (workbench.tasks.Task) as TRL-signature functions: ``accuracy``
    (weight 1), ``format`` (``format_weight``; if the task has one) and ``last_number`` (weight 0, logged only).

    Raises:
        ValueError: ``format_weight`` > 0 for a task without a format reward (names task.format_reward).
    """
    from workbench.tasks.rewards import builtin_form

    if format_weight > 0 and task.format_reward is None:
        raise ValueError(f"task.format_reward: task {task.name!r} has no format reward; set task.format_reward=0")
    funcs = [RewardFunc("accuracy", builtin_form(task.reward), 1.0)]
    if task.format_reward is not None:
        funcs.append(RewardFunc("format", builtin_form(task.format_reward, uses_answer=False), float(format_weight)))
    if task.anchor_free is not None:
        funcs.append(RewardFunc("last_number", builtin_form(task.anchor_free), 0.0))
    return funcs


def spec_reward_funcs(t: Any) -> list[RewardFunc]:
    """The reward functions of a run's ``task`` section: ``task.reward`` (weighted by ``task.reward_weights``)
    if set, else the task's own (:func:`task_reward_funcs` with ``task.format_reward``).

    Raises:
        ValueError: as :func:`user_reward_funcs`, or an unknown task.name.
    """
    if t.reward is not None:
        return user_reward_funcs(t.reward, t.reward_weights)
    from workbench.tasks import get_task

    return task_reward_funcs(get_task(t.name), t.format_reward)
