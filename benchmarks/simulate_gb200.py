"""Regenerate benchmarks/simulate-gb200.json and the generated tables of docs/results/simulate-gb200.md (#33).

    python benchmarks/simulate_gb200.py            # simulate (8B both calibration directions + the diagnostic, 235B grid), write JSON, render
    python benchmarks/simulate_gb200.py --render   # only re-render the write-up's tables from the committed JSON

Pure arithmetic (no device, no timing); minutes on 2 cores. What runs and how it renders:
workbench/perf/simulate/writeup.py. tests/test_simulate_golden.py checks the JSON against a fresh run and
the write-up against the JSON.
"""  # noqa: E501 (command lines)

from __future__ import annotations

import argparse
import json
from pathlib import Path

from workbench.perf.simulate.writeup import apply, collect, render

HERE = Path(__file__).resolve().parent
JSON = HERE / "simulate-gb200.json"
MD = HERE.parent / "docs" / "results" / "simulate-gb200.md"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--render", action="store_true", help="only re-render the write-up from the committed JSON")
    a = ap.parse_args()
    if not a.render:
        JSON.write_text(json.dumps(collect(), indent=1) + "\n")
        print(f"wrote {JSON}")
    MD.write_text(apply(MD.read_text(), render(json.loads(JSON.read_text()))))
    print(f"rendered {MD}")


if __name__ == "__main__":
    main()
