"""`assert_same_training`: the same model trained under every strategy must train the same.

Distributed training's worst bugs are silent: results that change with the number of replicas,
metrics that count one replica's examples, a skipped step on one replica only. Each passes every
test that runs on one device. `compare_training` trains the user's model factory with plain
`model.fit` under each strategy, in the shared strategy pools (`tfdist.testing.pools`):

    one_device             one CPU (the reference, unless `strategies` starts with another)
    mirrored               `replicas` virtual CPUs in one process
    multi_worker_mirrored  `workers` real local processes on loopback (each one compared)
    parameter_server       a chief with one worker and one ps (one worker: deterministic)

from the reference run's initial weights, on the same batches in the same order, with random
layers switched off (`recording`). It compares, after every step, the weights, the optimizer's
state, the metrics' variables, `iterations` and the logged loss and metrics (parameter_server:
the logs after every step, the variables at each epoch's end) (`comparison`).
`assert_same_training` raises `TrainingDiffers`, naming the first point and first variable that
differ, with its distributed type, aggregation and synchronization, when any run differs or
fails. Nothing here imports TensorFlow.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import numbers
from typing import Callable, Dict, List, Mapping, Optional, Sequence

import numpy as np

from tfdist.testing import comparison
from tfdist.testing.clusters import function_reference
from tfdist.testing.pools import STRATEGIES, check_strategies, pool_for, refuse_inside_a_pool

__all__ = ["TrainingComparison", "TrainingDiffers", "assert_same_training", "compare_training"]

RECORD = ("tfdist.testing.recording", "record", "")
RANDOM_LAYER_MODES = ("off", "keep")
# float32 sums in another order on several replicas, and Adam divides tiny gradients by their own
# size: 1e-6 differences after a few steps are rounding, a bug moves numbers by 1e-3 and more.
RTOL, ATOL = 1e-4, 1e-5


class TrainingDiffers(AssertionError):
    """Training under a strategy differed from the reference (or failed). `.comparison` has
    the recordings; the message names the first step and variable that differ."""

    def __init__(self, message: str, result: "TrainingComparison"):
        super().__init__(message)
        self.comparison = result


@dataclasses.dataclass
class TrainingComparison:
    """The runs of one comparison: their recordings and where each first differs."""

    reference: str
    runs: Dict[str, dict]  # run label ("mirrored", "multi_worker_mirrored worker:1") -> recording
    divergences: Dict[str, Optional[comparison.Divergence]]
    rtol: float
    atol: float

    @property
    def same(self) -> bool:
        return not any(self.divergences.values())

    def report(self) -> str:
        """What differs, run by run, first point first."""
        ref = self.runs[self.reference]
        lines = []
        differing = [label for label, found in self.divergences.items() if found]
        if differing:
            lines.append(
                f"Training differs from {self.reference} under {', '.join(differing)} "
                f"(rtol={self.rtol:g}, atol={self.atol:g})."
            )
        for label in differing:
            found = self.divergences[label]
            replicas = self.runs[label].get("replicas")
            head = f"{label}" + (f" ({replicas} replicas)" if replicas else "")
            if found.error:
                lines.append(f"- {head} failed {found.where}: {found.error}")
                continue
            first, rest = found.differences[0], found.differences[1:]
            lines.append(f"- {head}: first differs {found.where}: {first.describe()}")
            for more in rest[:6]:
                lines.append(f"    also {more.describe()}")
            if len(rest) > 6:
                lines.append(f"    and {len(rest) - 6} more quantities at that point")
            hint = _hint(found)
            if hint:
                lines.append(f"    HINT: {hint}")
        switched = ref.get("switched_off") or []
        if switched:
            lines.append(f"Random layers switched off in every run: {', '.join(switched)}.")
        return "\n".join(lines) if lines else f"Every run trained like {self.reference}."

    def table(self) -> str:
        """Largest difference from the reference, quantity by strategy; '!' marks beyond the
        tolerance, 'failed' a run that raised."""
        labels = [label for label in self.runs if label != self.reference]
        sums = {
            label: comparison.summary(
                self.runs[self.reference], self.runs[label], self.rtol, self.atol
            )
            for label in labels
        }
        rows = list(dict.fromkeys(q for s in sums.values() for q in s))
        header = ["quantity"] + labels
        body = []
        for row in rows:
            cells = [row]
            for label in labels:
                largest, beyond = sums[label].get(row, (None, False))
                cells.append(
                    "-" if largest is None else comparison.cell(largest) + (" !" if beyond else "")
                )
            body.append(cells)
        body.append(
            ["result"]
            + [
                "failed" if (d and d.error) else ("DIFFERS" if d else "same")
                for d in (self.divergences[label] for label in labels)
            ]
        )
        widths = [max(len(str(r[i])) for r in [header] + body) for i in range(len(header))]
        lines = [
            "  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip() for r in [header] + body
        ]
        return "\n".join(lines[:1] + ["  ".join("-" * w for w in widths)] + lines[1:])


def _hint(found: comparison.Divergence) -> str:
    """What the differences at the first point usually mean, when it is recognisable."""
    differences = found.differences
    names = [d.quantity.lower() for d in differences if d.group in ("weight", "optimizer")]
    if any("moving_" in name for name in names):
        return (
            "BatchNormalization normalises each replica's batch on its own: use "
            "BatchNormalization(synchronized=True) to normalise the global batch."
        )
    if found.variables_compared and {d.group for d in differences} <= {"metric", "log"}:
        return "the weights agree here: the replicas' losses or metrics are summed differently."
    return ""


def _arrays(value, path: str, lengths: dict):
    """`value` with numpy arrays for leaves (dicts kept); each leaf's length into `lengths`."""
    if isinstance(value, Mapping):
        return {str(k): _arrays(v, f"{path}[{k!r}]", lengths) for k, v in value.items()}
    array = np.asarray(value)
    lengths[path] = len(array) if array.ndim else -1
    return array


def _check_data(data):
    lengths: dict = {}
    if isinstance(data, Mapping):
        arrays = _arrays(data, "data", lengths)
    elif isinstance(data, (tuple, list)) and data:
        arrays = tuple(_arrays(v, f"data[{i}]", lengths) for i, v in enumerate(data))
    else:
        raise TypeError(
            f"data must be (x, y), (x, y, sample_weight) or a dict of numpy arrays; received "
            f"{type(data).__name__}. HINT: pass the arrays themselves, not a tf.data.Dataset: "
            "each strategy's process batches them in the same order."
        )
    if len(set(lengths.values())) != 1 or -1 in lengths.values():
        raise ValueError(
            f"data's arrays must have the same number of examples; their lengths are {lengths} "
            "(-1: a scalar). HINT: slice every array to the same first dimension."
        )
    return arrays


def _positive_int(value, name: str, hint: str) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{name}={value!r} must be a positive integer. HINT: {hint}")
    return int(value)


def _tolerance(value, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 <= value < 1:
        raise ValueError(
            f"{name}={value!r} must be a number in [0, 1). HINT: float32 training on several "
            f"replicas sums in another order: rtol={RTOL:g}, atol={ATOL:g} (the defaults) suit a "
            "few steps; mixed precision needs about 1e-3."
        )
    return float(value)


def compare_training(
    build_model: Callable,
    data,
    *,
    global_batch_size: int,
    steps: int = 4,
    epochs: int = 2,
    strategies: Sequence[str] = STRATEGIES,
    replicas: int = 2,
    workers: int = 2,
    rtol: float = RTOL,
    atol: float = ATOL,
    random_layers: str = "off",
    seed: int = 0,
    env: Optional[Mapping[str, str]] = None,
    timeout: float = 300.0,
) -> TrainingComparison:
    """Trains `build_model()` under each strategy and compares the runs (see the module).

    Args:
        build_model: a module-level function (the strategies' processes import it) that builds
            and compiles the model, called inside each strategy's scope, returning it.
        data: (x, y), (x, y, sample_weight) or a dict of numpy arrays: the examples in order.
            Batches are `global_batch_size` examples; the data repeats as needed.
        global_batch_size: int. Examples per step over all replicas.
        steps / epochs: ints. `model.fit(epochs=epochs, steps_per_epoch=steps)`.
        strategies: names from `STRATEGIES`; the first is the reference.
        replicas: int. The mirrored strategy's virtual CPUs. workers: int. Processes of the
            multi_worker_mirrored job.
        rtol / atol: floats. A quantity differs where |run - reference| > atol + rtol * |reference|.
        random_layers: "off" (default) sets every Dropout / GaussianNoise layer's rate to 0,
            as the runs cannot draw the same random numbers; "keep" leaves them.
        seed: int. `keras.utils.set_random_seed` before `build_model()` in every run.
        env: mapping. Extra environment variables for the strategies' processes (for example
            TFDIST_KERAS_FIXES); runs with other variables use other processes.
        timeout: float. Seconds each run may take.

    Returns:
        TrainingComparison.

    Raises:
        RuntimeError: called in a strategy pool's own process, e.g. at module level of a file
            without an `if __name__ == "__main__":` guard that the pool imports to find
            build_model (`pools.refuse_inside_a_pool`).
    """
    refuse_inside_a_pool("compare_training")
    reference = function_reference(build_model, "assert_same_training")
    arrays = _check_data(data)
    options = {
        "global_batch_size": _positive_int(
            global_batch_size, "global_batch_size", "the examples of one step, over all replicas."
        ),
        "steps": _positive_int(steps, "steps", "the steps of each epoch, e.g. steps=4."),
        "epochs": _positive_int(epochs, "epochs", "e.g. epochs=2."),
        "random_layers": random_layers,
        "seed": int(seed),
    }
    if random_layers not in RANDOM_LAYER_MODES:
        raise ValueError(
            f"random_layers={random_layers!r} is not one of {list(RANDOM_LAYER_MODES)}. HINT: "
            "'off' switches Dropout off in every run (the default)."
        )
    names = check_strategies(strategies)
    _positive_int(replicas, "replicas", "the virtual CPUs of mirrored, e.g. 2.")
    _positive_int(workers, "workers", "the processes of multi_worker_mirrored, e.g. 2.")
    rtol, atol = _tolerance(rtol, "rtol"), _tolerance(atol, "atol")
    pools = {name: pool_for(name, replicas=replicas, workers=workers, env=env) for name in names}
    # start every pool at once: their processes' start-up is most of a small model's time
    with concurrent.futures.ThreadPoolExecutor(len(pools)) as executor:
        for future in [executor.submit(pool.ensure_started) for pool in set(pools.values())]:
            future.result()

    def run(name: str, initial=None) -> List[tuple]:
        replies = pools[name].call(
            name, RECORD, (reference, arrays, options, initial), timeout=timeout
        )
        labelled = []
        for reply in replies:
            label = name if len(replies) == 1 else f"{name} {reply.task}"
            if reply.ok:
                labelled.append((label, reply.value))
            else:
                labelled.append((label, _failed(reply)))
        return labelled

    runs: Dict[str, dict] = dict(run(names[0]))
    reference_label = next(iter(runs))
    first = runs[reference_label]
    if first.get("error") and not first.get("steps"):
        raise TrainingDiffers(
            f"The reference run ({reference_label}) failed: {first['error']['text']}"
            f"\n{first.get('traceback', '')}",
            TrainingComparison(reference_label, runs, {}, rtol, atol),
        )
    initial = runs[reference_label]["initial_weights"]
    with concurrent.futures.ThreadPoolExecutor(max(1, len(names) - 1)) as executor:
        futures = [executor.submit(run, name, initial) for name in names[1:]]
        for future in futures:
            runs.update(future.result())
    divergences = {
        label: comparison.first_divergence(runs[reference_label], recording, rtol, atol)
        for label, recording in runs.items()
        if label != reference_label
    }
    return TrainingComparison(reference_label, runs, divergences, rtol, atol)


def _failed(reply) -> dict:
    """A run that raised outside fit (building the model, loading weights) as a recording."""
    return {
        "steps": [],
        "epochs": [],
        "variables": [],
        "error": {"step": 0, "text": f"{reply.error} (before training)"},
        "traceback": reply.traceback,
        "output": reply.output,
    }


def assert_same_training(build_model: Callable, data, **kwargs) -> TrainingComparison:
    """Raises `TrainingDiffers` unless training under each strategy equals the reference.

    Takes `compare_training`'s arguments. Returns the comparison when every run agrees.

    Example:

    ```python
    def build_model():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        model.compile(keras.optimizers.Adam(0.01), "mse", metrics=["mae"])
        return model

    def test_trains_the_same_everywhere():
        x = np.random.RandomState(0).randn(64, 4).astype("float32")
        assert_same_training(build_model, (x, x.sum(1)), global_batch_size=16)
    ```
    """
    refuse_inside_a_pool("assert_same_training")
    result = compare_training(build_model, data, **kwargs)
    if not result.same:
        raise TrainingDiffers(result.report() + "\n\n" + result.table(), result)
    return result
