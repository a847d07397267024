"""Comparing recordings of the same training under different strategies (`recording`).

`first_divergence(reference, run, rtol, atol)` walks both recordings in training order (after
each step; at each epoch's end) and returns the first point where anything differs beyond
`|run - reference| <= atol + rtol * |reference|`, with every quantity that differs there:
weights first (in the model's order), then the optimizer's state, the metrics' variables, the
step counter and the logged loss and metrics. A NaN where the reference has a number (or the
other way round) differs by inf. `summary(...)` gives, per group of quantities, the largest
difference over the whole run, for the table `tfdist verify` prints. Pure numpy.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Dict, List, Optional, Tuple

import numpy as np

GROUPS = ("weight", "optimizer", "metric", "iterations", "log")
GROUP_LABELS = {
    "weight": "weights",
    "optimizer": "optimizer state",
    "metric": "metric variables",
    "iterations": "iterations",
}


@dataclasses.dataclass
class Difference:
    """One quantity that differs at a point of training."""

    quantity: str  # a variable's name, a log's name ("loss"), or "iterations"
    group: str  # one of GROUPS
    difference: float  # the largest |run - reference|; inf for NaN against a number
    reference: str = ""  # the values, shortened, for logs and counters
    value: str = ""
    variable: Optional[dict] = None  # type, aggregation, synchronization of the run's variable

    def describe(self) -> str:
        if math.isinf(self.difference) and self.group not in ("log", "iterations"):
            found = self.variable or {}
            if found.get("type") == "missing":
                return f"variable {self.quantity!r}: missing in this run"
        if self.group == "log":
            return (
                f"logged {self.quantity!r}: {self.value} vs {self.reference} "
                f"(|diff| {_fmt(self.difference)})"
            )
        if self.group == "iterations":
            return f"optimizer iterations: {self.value} vs {self.reference}"
        found = self.variable or {}
        about = ", ".join(
            f"{key}={found[key]}" for key in ("aggregation", "synchronization") if key in found
        )
        kind = {"weight": "weight", "optimizer": "optimizer variable", "metric": "metric variable"}
        return (
            f"{kind.get(self.group, self.group)} {self.quantity!r} [{found.get('type', '?')}"
            f"{', ' + about if about else ''}]: max |diff| {_fmt(self.difference)}"
        )


@dataclasses.dataclass
class Divergence:
    """Where a run first differs from the reference, and everything that differs there."""

    where: str  # "after step 3 (epoch 1, batch 3)"
    step: int
    differences: List[Difference]
    error: str = ""  # the run failed here instead
    variables_compared: bool = True  # False where the run recorded no variables (ps steps)


def _fmt(value: float) -> str:
    """A difference for people: inf is a NaN or inf against a number (or another shape)."""
    return "inf (NaN/inf or shape vs numbers)" if math.isinf(value) else f"{value:.3g}"


def cell(value: float) -> str:
    """A difference in a table's cell."""
    return "inf" if math.isinf(value) else f"{value:.3g}"


def _max_difference(reference, value) -> Tuple[float, bool]:
    """(largest |value - reference|, within the tolerance?) with rtol, atol applied later."""
    a, b = np.asarray(reference, dtype="float64"), np.asarray(value, dtype="float64")
    if a.shape != b.shape:
        return math.inf, False
    nan_a, nan_b = np.isnan(a), np.isnan(b)
    if np.any(nan_a != nan_b) or np.any(np.isinf(a) != np.isinf(b)):
        return math.inf, False
    finite = np.isfinite(a) & np.isfinite(b)
    if not np.any(finite):
        return 0.0, True
    return float(np.max(np.abs(a[finite] - b[finite]), initial=0.0)), True


def _differs(reference, value, rtol: float, atol: float) -> Optional[float]:
    """The largest difference when it is beyond the tolerance, else None."""
    largest, comparable = _max_difference(reference, value)
    if not comparable:
        return largest
    a, b = np.asarray(reference, dtype="float64"), np.asarray(value, dtype="float64")
    finite = np.isfinite(a) & np.isfinite(b)
    if np.all(np.abs(a[finite] - b[finite]) <= atol + rtol * np.abs(a[finite])):
        return None
    return largest


def _points(recording: dict) -> List[Tuple[tuple, dict]]:
    """[(key, entry)] in training order: ("step", n) after step n, ("epoch", e) at its end."""
    points, epochs = [], list(recording["epochs"])
    for i, entry in enumerate(recording["steps"]):
        points.append((("step", i + 1), entry))
        while epochs and epochs[0]["step"] == i + 1:
            points.append((("epoch", epochs[0]["epoch"] + 1), epochs.pop(0)))
    points += [(("epoch", e["epoch"] + 1), e) for e in epochs]
    return points


def _where(key: tuple, entry: dict) -> str:
    if key[0] == "step":
        return f"after step {key[1]} (epoch {entry['epoch'] + 1}, batch {entry['batch'] + 1})"
    return f"at the end of epoch {key[1]} (step {entry['step']})"


def _compare(reference: dict, run: dict, a: dict, b: dict, rtol: float, atol: float):
    """Every Difference between two entries of the same point, in report order."""
    found: List[Difference] = []
    if "values" in a and "values" in b:
        names_a = [v["name"] for v in reference["variables"]]
        names_b = {v["name"]: i for i, v in enumerate(run["variables"])}
        for i, name in enumerate(names_a):
            group = reference["variables"][i]["group"]
            if name not in names_b:
                found.append(Difference(name, group, math.inf, variable={"type": "missing"}))
                continue
            j = names_b[name]
            largest = _differs(a["values"][i], b["values"][j], rtol, atol)
            if largest is not None:
                found.append(Difference(name, group, largest, variable=run["variables"][j]))
    if "iterations" in a and "iterations" in b and a["iterations"] != b["iterations"]:
        diff = float(abs(a["iterations"] - b["iterations"]))
        found.append(
            Difference("iterations", "iterations", diff, str(a["iterations"]), str(b["iterations"]))
        )
    for name, value in a["logs"].items():
        if name not in b["logs"]:
            continue
        largest = _differs(value, b["logs"][name], rtol, atol)
        if largest is not None:
            found.append(Difference(name, "log", largest, f"{value:.6g}", f"{b['logs'][name]:.6g}"))
    order = {group: i for i, group in enumerate(GROUPS)}
    return sorted(found, key=lambda d: order[d.group])  # stable: the model's order within


def first_divergence(reference: dict, run: dict, rtol: float, atol: float) -> Optional[Divergence]:
    """The first point where `run` differs from `reference` (or failed), or None."""
    theirs = dict(_points(run))
    for key, entry in _points(reference):
        step = key[1] if key[0] == "step" else entry["step"]
        if key not in theirs:
            if run.get("error"):
                where = f"at step {run['error']['step']}"
                return Divergence(where, run["error"]["step"], [], run["error"]["text"])
            return Divergence(_where(key, entry), step, [], "no record of this point")
        differences = _compare(reference, run, entry, theirs[key], rtol, atol)
        if differences:
            compared = "values" in entry and "values" in theirs[key]
            return Divergence(_where(key, entry), step, differences, variables_compared=compared)
    if run.get("error"):
        return Divergence(
            f"at step {run['error']['step']}", run["error"]["step"], [], run["error"]["text"]
        )
    return None


def summary(reference: dict, run: dict, rtol: float, atol: float) -> Dict[str, Tuple[float, bool]]:
    """Per quantity group (and each log): (largest difference over the run, beyond tolerance?)."""
    result: Dict[str, Tuple[float, bool]] = {}

    def note(label: str, largest: float, beyond: bool) -> None:
        old = result.get(label, (0.0, False))
        result[label] = (max(old[0], largest), old[1] or beyond)

    theirs = dict(_points(run))
    for key, a in _points(reference):
        b = theirs.get(key)
        if b is None:
            continue
        for name, value in a["logs"].items():
            if name in b["logs"]:
                largest, _ = _max_difference(value, b["logs"][name])
                note(name, largest, _differs(value, b["logs"][name], rtol, atol) is not None)
        if "iterations" in a and "iterations" in b:
            diff = float(abs(a["iterations"] - b["iterations"]))
            note("iterations", diff, diff > 0)
        if "values" in a and "values" in b:
            index = {v["name"]: j for j, v in enumerate(run["variables"])}
            for i, variable in enumerate(reference["variables"]):
                j = index.get(variable["name"])
                label = GROUP_LABELS[variable["group"]]
                if j is None:
                    note(label, math.inf, True)
                    continue
                largest, _ = _max_difference(a["values"][i], b["values"][j])
                note(
                    label, largest, _differs(a["values"][i], b["values"][j], rtol, atol) is not None
                )
    return result
