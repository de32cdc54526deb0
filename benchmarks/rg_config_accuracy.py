"""real_model_accuracy.py on a reasoning-gym configuration that is not a registered task (a throwaway task).

    python benchmarks/rg_config_accuracy.py NAME DATASET 'CONFIG_JSON' -- SPEC [overrides] [--out F] [--samples F]
    python benchmarks/rg_config_accuracy.py add2 basic_arithmetic '{"min_terms": 2, "max_terms": 2, "min_digits": 2,
        "max_digits": 2, "operators": ["+"], "allow_parentheses": false, "allow_negation": false}' -- smollm2-learn
        task.name=add2 drafter.kind=none

Registers NAME as data.reasoning_gym_tasks.generate(n, seed, DATASET, **CONFIG) with the rewards of the
registered reasoning-gym tasks (math-verify accuracy + boxed format) in this process only, then runs
benchmarks/real_model_accuracy.py with the arguments after ``--`` (give it task.name=NAME). Its data is
cached under NAME like a registered task's: a new configuration needs a new NAME.
"""

from __future__ import annotations

import json
import runpy
import sys
from dataclasses import replace
from pathlib import Path

from data import reasoning_gym_tasks as rgt
from workbench.tasks import TASKS


def main() -> None:
    if len(sys.argv) < 5 or sys.argv[4] != "--":
        sys.exit(__doc__)
    name, dataset, config = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    rgt.CONFIGS[name] = (dataset, config)
    TASKS[name] = replace(
        TASKS["chain_sum"], name=name, generate=rgt.task_generate(name), description=f"reasoning-gym {dataset} {config}"
    )
    sys.argv = ["real_model_accuracy.py", *sys.argv[5:]]
    runpy.run_path(str(Path(__file__).with_name("real_model_accuracy.py")), run_name="__main__")


if __name__ == "__main__":
    main()
