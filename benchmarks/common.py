"""Shared helpers of the benchmark suite: timing, statistics, result rows, table, JSON.

A benchmark module (`benchmarks/bench_<name>.py`) exposes `run(quick: bool) -> list[dict]`
and builds each returned row with `row(...)` below; `benchmarks/run.py` discovers the modules,
prints every row in one table and writes them all to `benchmarks/results/<timestamp>.json`.

Nothing here imports TensorFlow, so the driver process stays light; the measurements run in
fresh child processes (`run_fresh`), one per implementation, because the Keras flavour
(TF_USE_LEGACY_KERAS) and the logical CPU split are fixed once per process.
"""

from __future__ import annotations

import datetime
import json
import math
import os
import platform
import statistics
import sys
import time
import zlib
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS_DIR = os.path.join(HERE, "results")

# Quiet TensorFlow's C++ logs in every child process the benchmarks start.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

ROW_KEYS = ("scenario", "tfdist", "alternative", "alternative_name", "unit", "ratio", "min_max")


# ------------------------------------------------------------------------------- timing


def time_call(fn: Callable[[], Any], *, repeats: int = 3, warmup: int = 1) -> List[float]:
    """Seconds of `repeats` calls of `fn()`, after `warmup` untimed calls.

    `fn` must block until its work is done (e.g. end with `.numpy()` on a result).
    """
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return samples


def rates(count: float, seconds: Iterable[float]) -> List[float]:
    """Throughputs (count / s) for durations in seconds: e.g. examples/s from epoch times."""
    return [count / s for s in seconds]


def summary(samples: Sequence[float]) -> Dict[str, float]:
    """{"median", "min", "max", "n"} of the samples."""
    values = [float(v) for v in samples]
    if not values:
        raise ValueError("summary() needs at least one sample.")
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "n": len(values),
    }


def median(samples: Sequence[float]) -> float:
    return summary(samples)["median"]


# --------------------------------------------------------------------------------- rows


def row(
    scenario: str,
    tfdist: Sequence[float],
    alternative: Sequence[float],
    alternative_name: str,
    unit: str,
    *,
    higher_is_better: bool = True,
    target: Optional[float] = None,
    paired: bool = True,
    notes: str = "",
    **extra,
) -> Dict[str, Any]:
    """One result row comparing tfdist with an alternative, from their repeat samples.

    Args:
        scenario: what is measured, e.g. "keras fit, mirrored 2 vCPU".
        tfdist / alternative: the repeat samples (one value per repeat) of each side.
        alternative_name: what tfdist is compared with, e.g. "custom loop".
        unit: e.g. "examples/s", "s".
        higher_is_better: True for throughputs, False for times.
        target: the ratio tfdist/alternative that counts as met (>= when higher is better,
            <= otherwise); None for no target.
        paired: the i-th samples of both sides were measured side by side (the same round),
            so the per-round ratios are meaningful; their min-max goes to "ratio_min_max".
        notes: free text, shown under the table.
        **extra: more JSON-serialisable keys for the JSON file.

    Returns:
        dict with "scenario", "tfdist" (median), "alternative" (median), "alternative_name",
        "unit", "ratio" (median tfdist / median alternative), "min_max" ({"tfdist": [min, max],
        "alternative": [min, max]}), "samples", "higher_is_better", "target", "target_met",
        "ratio_min_max" (paired only), "notes", and `extra`.
    """
    a, b = summary(tfdist), summary(alternative)
    ratio = a["median"] / b["median"] if b["median"] else math.nan
    out: Dict[str, Any] = {
        "scenario": scenario,
        "tfdist": a["median"],
        "alternative": b["median"],
        "alternative_name": alternative_name,
        "unit": unit,
        "ratio": ratio,
        "min_max": {"tfdist": [a["min"], a["max"]], "alternative": [b["min"], b["max"]]},
        "samples": {
            "tfdist": [float(v) for v in tfdist],
            "alternative": [float(v) for v in alternative],
        },
        "higher_is_better": higher_is_better,
        "target": target,
        "target_met": None
        if target is None
        else (ratio >= target if higher_is_better else ratio <= target),
        "notes": notes,
    }
    if paired and len(tfdist) == len(alternative) and len(tfdist) > 1:
        per_round = [x / y for x, y in zip(tfdist, alternative) if y]
        out["ratio_min_max"] = [min(per_round), max(per_round)]
    out.update(extra)
    return out


def error_row(scenario: str, error: str, alternative_name: str = "", **extra) -> Dict[str, Any]:
    """A row for a measurement that failed: printed as FAILED, kept in the JSON."""
    out = {
        "scenario": scenario,
        "tfdist": None,
        "alternative": None,
        "alternative_name": alternative_name,
        "unit": "",
        "ratio": None,
        "min_max": None,
        "target": None,
        "target_met": None,
        "error": error,
        "notes": "",
    }
    out.update(extra)
    return out


def check_row(r: Mapping[str, Any]) -> None:
    """Raises ValueError unless `r` has the keys every row must have."""
    missing = [k for k in ROW_KEYS if k not in r]
    if missing:
        raise ValueError(
            f"benchmark row {r.get('scenario', r)!r} lacks key(s) {missing}; "
            "build rows with common.row(...)."
        )


# -------------------------------------------------------------------------------- table


def _number(value: Optional[float]) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    magnitude = abs(value)
    if magnitude >= 1000:
        return f"{value:,.0f}"
    if magnitude >= 100:
        return f"{value:.0f}"
    if magnitude >= 10:
        return f"{value:.1f}"
    if magnitude >= 1:
        return f"{value:.2f}"
    return f"{value:.3g}"


def _span(pair) -> str:
    return f"{_number(pair[0])}-{_number(pair[1])}" if pair else "-"


def format_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """The rows as a fixed-width text table (one line per row, notes numbered below)."""
    header = (
        "scenario",
        "tfdist",
        "alternative",
        "ratio",
        "target",
        "min-max tfdist",
        "min-max alternative",
        "ratio min-max",
    )
    lines, notes = [], []
    for r in rows:
        if r.get("error"):
            lines.append(
                (r["scenario"], "FAILED", r.get("alternative_name", ""), "-", "-", "-", "-", "-")
            )
            notes.append(f"{r['scenario']}: {r['error']}")
            continue
        unit = r.get("unit", "")
        ratio = r.get("ratio")
        target = r.get("target")
        mark = ""
        if target is not None:
            op = ">=" if r.get("higher_is_better", True) else "<="
            mark = f"{op}{target:g} {'ok' if r.get('target_met') else 'MISS'}"
        min_max = r.get("min_max") or {}
        lines.append(
            (
                r["scenario"],
                f"{_number(r['tfdist'])} {unit}".strip(),
                f"{_number(r['alternative'])} ({r['alternative_name']})",
                "-" if ratio is None else f"{ratio:.3f}x",
                mark,
                _span(min_max.get("tfdist")),
                _span(min_max.get("alternative")),
                _span(r.get("ratio_min_max")),
            )
        )
        if r.get("notes"):
            notes.append(f"{r['scenario']} vs {r['alternative_name']}: {r['notes']}")
    widths = [max(len(str(x)) for x in column) for column in zip(header, *lines)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    out = [fmt.format(*header), fmt.format(*("-" * w for w in widths))]
    out += [fmt.format(*line) for line in lines]
    if notes:
        out.append("")
        out += [f"[{i}] {n}" for i, n in enumerate(notes, 1)]
    return "\n".join(out)


def print_table(rows: Sequence[Mapping[str, Any]], out=None) -> None:
    out = out or sys.stdout
    out.write(format_table(rows) + "\n")
    out.flush()


# --------------------------------------------------------------------------------- JSON


def environment() -> Dict[str, Any]:
    """Versions and machine facts for the JSON file (TensorFlow's version without importing it)."""
    from importlib import metadata

    def version(name):
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return None

    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "tensorflow": version("tensorflow"),
        "keras": version("keras"),
        "tf_keras": version("tf_keras"),
        "tfdist": version("tfdist"),
    }


def write_json(
    rows: Sequence[Mapping[str, Any]],
    meta: Optional[Mapping[str, Any]] = None,
    path: Optional[str] = None,
) -> str:
    """Writes {"meta": ..., "rows": [...]} to `path` (default results/<timestamp>.json)."""
    if path is None:
        os.makedirs(RESULTS_DIR, exist_ok=True)
        stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
        path = os.path.join(RESULTS_DIR, f"{stamp}.json")
    else:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    payload = {"meta": {"environment": environment(), **dict(meta or {})}, "rows": list(rows)}
    with open(path + ".tmp", "w") as f:
        json.dump(payload, f, indent=2, default=str)
    os.replace(path + ".tmp", path)
    return path


# ---------------------------------------------------------------------- fresh processes


def wait_for_turn(
    directory: str, sides: Sequence[str], side: str, key, timeout: float = 900.0
) -> None:
    """Paired rounds of two concurrent jobs: returns when `side` may run round `key`.

    The two sides alternate who goes first, by round, the same in every process (files in
    `directory` say who is done); `end_turn` ends the round.
    """
    if directory is None:  # one side alone
        return
    first, second = sides if zlib.crc32(str(key).encode()) % 2 == 0 else sides[::-1]
    if side == second:
        _wait_for_file(os.path.join(directory, f"{first}-{key}"), timeout)


def end_turn(directory: str, sides: Sequence[str], side: str, key, timeout: float = 900.0) -> None:
    """Marks `side` done with round `key`, then waits until the other side is done too."""
    if directory is None:
        return
    open(os.path.join(directory, f"{side}-{key}"), "a").close()
    other = sides[1] if side == sides[0] else sides[0]
    _wait_for_file(os.path.join(directory, f"{other}-{key}"), timeout)


def _wait_for_file(path: str, timeout: float) -> None:
    _wait_for_files([path], timeout, "the other side never finished its turn")


def _wait_for_files(paths: Sequence[str], timeout: float, what: str) -> None:
    end = time.monotonic() + timeout
    while not all(os.path.exists(p) for p in paths):
        if time.monotonic() > end:
            raise TimeoutError(f"{what}: {[p for p in paths if not os.path.exists(p)]}")
        time.sleep(0.005)


def keep_awake(period: float = 0.01) -> None:
    """A daemon thread that wakes every `period` seconds and does nothing else.

    On the shared 2-core VMs these benchmarks run on, a job whose threads all block (on a
    collective, on a peer) sometimes takes two to four times its wall time for the same CPU
    time, in whole multiples, as if the idle vCPU were slow to wake; a thread that keeps
    waking made those rounds disappear. It costs about 100 wake-ups a second, the same in
    every job of a comparison.
    """
    import threading

    def tick():
        while True:
            time.sleep(period)

    threading.Thread(target=tick, name="keep-awake", daemon=True).start()


def wait_for_scheduled_turn(
    directory: str, index: int, processes: int = 2, timeout: float = 900.0
) -> None:
    """Turns by a schedule shared by several concurrent jobs: returns when every process of the
    job that had turn `index - 1` marked it done (`end_scheduled_turn`)."""
    if index == 0:
        return
    paths = [os.path.join(directory, f"done-{index - 1}-{w}") for w in range(processes)]
    _wait_for_files(paths, timeout, f"turn {index} never came")


def end_scheduled_turn(directory: str, index: int, process: int) -> None:
    """Marks turn `index` done by this job's process `process`."""
    open(os.path.join(directory, f"done-{index}-{process}"), "w").close()


def cpu_model() -> str:
    """The host's CPU model name, from /proc/cpuinfo (bandwidths and ratios depend on it)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def run_fresh(
    fn: Callable,
    *,
    workers: int = 1,
    args: Sequence = (),
    kwargs: Optional[Mapping] = None,
    env: Optional[Mapping[str, str]] = None,
    timeout: float = 300.0,
) -> List[Any]:
    """Runs module-level `fn(*args, **kwargs)` in `workers` fresh local processes.

    Each process gets its own TF_CONFIG (a `workers`-task cluster on loopback ports; with one
    worker the function can ignore it). Every process is killed after `timeout` seconds.

    Returns:
        list: each worker's return value, in task order.

    Raises:
        tfdist.testing.ClusterRunError: a task failed or timed out (with every task's output).
    """
    from tfdist.testing import run_cluster

    runs = run_cluster(fn, workers=workers, args=args, kwargs=kwargs, env=env, timeout=timeout)
    return [runs[f"worker:{i}"].value for i in range(workers)]
