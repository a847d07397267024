"""The version matrix's table: one row per README scenario, one column per TensorFlow / Keras pair.

Reads the JSON files `pytest --scenario-report` wrote (one per pair, see noxfile.py). A cell is
"pass" when every test of that scenario passed on that pair, "FAIL n/m" when some failed,
"skip" when all were skipped, and "-" when the pair was not run, or ran before the scenario
existed. The next Keras's runs (`make test-next`, files "next-<pair>.json") come after the
matrix's pairs, as columns "next tf<version> keras<nightly>".
"""

import json
import pathlib
import sys


def _cell(outcomes: dict) -> str:
    values = list(outcomes.values())
    if not values:
        return "-"  # the pair ran before this scenario existed
    failed = sum(v == "failed" for v in values)
    if failed:
        return f"FAIL {failed}/{len(values)}"
    if values and all(v == "skipped" for v in values):
        return "skip"
    return "pass"


NEXT_PREFIX = "next-"


def columns(results_dir, pairs) -> list:
    """`pairs`, then every run of the next Keras found in `results_dir`, by name."""
    found = sorted(p.stem for p in pathlib.Path(results_dir).glob(f"{NEXT_PREFIX}*.json"))
    return list(pairs) + [name for name in found if name not in pairs]


def render(results_dir, pairs) -> str:
    """A Markdown table of scenarios x pairs, with pass counts and run times per pair."""
    results_dir = pathlib.Path(results_dir)
    runs = {}
    for pair in pairs:
        path = results_dir / f"{pair}.json"
        if path.exists():
            runs[pair] = json.loads(path.read_text())
    scenarios = sorted({name for run in runs.values() for name in run if not name.startswith("_")})
    header = "| scenario | " + " | ".join(p.replace("-", " ") for p in pairs) + " |"
    lines = [header, "| --- |" + " --- |" * len(pairs)]
    for name in scenarios:
        cells = [_cell(runs[p].get(name, {})) if p in runs else "-" for p in pairs]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    passed = []
    for p in pairs:
        if p not in runs:
            passed.append("-")
            continue
        cells = [_cell(runs[p].get(name, {})) for name in scenarios]
        ran = sum(c != "-" for c in cells)
        note = f" ({len(scenarios) - ran} not run)" if ran < len(scenarios) else ""
        passed.append(f"{sum(c == 'pass' for c in cells)}/{ran}{note}")
    lines.append("| **scenarios passing** | " + " | ".join(passed) + " |")
    minutes = [f"{runs[p].get('_seconds', 0) / 60:.1f} min" if p in runs else "-" for p in pairs]
    lines.append("| run time | " + " | ".join(minutes) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.path.insert(0, str(pathlib.Path(__file__).parents[2]))
    from tfdist.releases import MATRIX

    results = sys.argv[1] if len(sys.argv) > 1 else ".nox/results"
    print(render(results, columns(results, [r.name for r in MATRIX])))
