"""tfdist.testing.comparison: where two recordings of the same training first differ, and the
table of largest differences (recordings made by hand here; real ones in
tests/cluster/test_same_training.py)."""

import math

import numpy as np
import pytest

from tfdist.testing.comparison import first_divergence, summary
from tfdist.testing.same_training import TrainingComparison

VARIABLES = [
    {"name": "dense/kernel", "group": "weight", "type": "MirroredVariable",
     "aggregation": "mean", "synchronization": "on_write"},
    {"name": "adam/momentum", "group": "optimizer", "type": "MirroredVariable",
     "aggregation": "none", "synchronization": "on_write"},
    {"name": "loss/total", "group": "metric", "type": "SyncOnReadVariable",
     "aggregation": "sum", "synchronization": "on_read"},
]  # fmt: skip


def recording(steps=4, kernel=None, loss=None, total=None, error=None, per_step=True):
    """A 2-epoch recording of `steps` steps whose values change with the step."""
    entries, epochs = [], []
    for i in range(steps):
        entry = {"epoch": i // 2, "batch": i % 2, "logs": {"loss": 1.0 / (i + 1), "mae": 0.5}}
        if loss and i + 1 in loss:
            entry["logs"]["loss"] = loss[i + 1]
        values = [
            np.full((2, 2), 0.1 * (i + 1), "float32"),
            np.full((2, 2), 0.01 * (i + 1), "float32"),
            np.array(10.0 * (i + 1), "float32"),
        ]
        if kernel and i + 1 in kernel:
            values[0] = kernel[i + 1]
        if total and i + 1 in total:
            values[2] = np.array(total[i + 1], "float32")
        if per_step:
            entry.update(iterations=i + 1, values=values)
        entries.append(entry)
        if i % 2 == 1:
            epochs.append({"epoch": i // 2, "step": i + 1, "logs": dict(entry["logs"]),
                           "iterations": i + 1, "values": values})  # fmt: skip
    return {"replicas": 2, "variables": VARIABLES, "steps": entries, "epochs": epochs,
            "error": error, "switched_off": []}  # fmt: skip


def test_the_same_recording_does_not_diverge():
    assert first_divergence(recording(), recording(), 1e-5, 1e-6) is None


def test_the_first_step_and_the_first_variable_that_differ_are_named():
    wrong = np.full((2, 2), 0.3, "float32")
    wrong[0, 1] = 0.35  # step 3's kernel, off by 0.05; its loss too
    found = first_divergence(recording(), recording(kernel={3: wrong}, loss={3: 0.9}), 1e-5, 1e-6)
    assert found.step == 3 and found.where == "after step 3 (epoch 2, batch 1)"
    first = found.differences[0]
    assert (first.quantity, first.group) == ("dense/kernel", "weight")
    assert first.difference == pytest.approx(0.05, rel=1e-5)
    text = first.describe()
    assert "'dense/kernel' [MirroredVariable, aggregation=mean, synchronization=on_write]" in text
    assert "max |diff| 0.05" in text
    assert [d.quantity for d in found.differences] == ["dense/kernel", "loss"]


def test_within_the_tolerance_is_the_same():
    close = np.full((2, 2), 0.1 + 1e-7, "float32")
    assert first_divergence(recording(), recording(kernel={1: close}), 1e-5, 1e-6) is None
    assert first_divergence(recording(), recording(kernel={1: close}), 0.0, 0.0) is not None


def test_a_nan_against_a_number_differs_by_inf():
    nan = np.full((2, 2), np.nan, "float32")
    found = first_divergence(recording(), recording(kernel={2: nan}), 1e-3, 1e-3)
    assert found.step == 2 and math.isinf(found.differences[0].difference)
    assert "inf (NaN/inf" in found.differences[0].describe()
    both = recording(kernel={2: nan})
    assert first_divergence(both, recording(kernel={2: nan}), 0.0, 0.0) is None


def test_only_the_metric_totals_and_logs_differ():
    found = first_divergence(recording(), recording(total={1: 15.0}, loss={1: 1.5}), 1e-5, 1e-6)
    assert [(d.group, d.quantity) for d in found.differences] == [
        ("metric", "loss/total"),
        ("log", "loss"),
    ]
    assert "aggregation=sum, synchronization=on_read" in found.differences[0].describe()
    assert "logged 'loss': 1.5 vs 1" in found.differences[1].describe()


def test_a_run_that_failed_is_reported_at_its_step():
    failed = recording(steps=1, error={"step": 2, "text": "InvalidArgumentError: AddN"})
    found = first_divergence(recording(), failed, 1e-5, 1e-6)
    assert (found.step, found.where, found.error) == (2, "at step 2", "InvalidArgumentError: AddN")


def test_asynchronous_runs_are_compared_at_each_epochs_end():
    """parameter_server records its variables at the end of each epoch only."""
    ps = recording(per_step=False)
    assert first_divergence(recording(), ps, 1e-5, 1e-6) is None
    off = recording(per_step=False, kernel={4: np.zeros((2, 2), "float32")})
    ps["epochs"][1]["values"] = off["epochs"][1]["values"]
    found = first_divergence(recording(), ps, 1e-5, 1e-6)
    assert found.where == "at the end of epoch 2 (step 4)" and found.step == 4


def test_the_summary_table_marks_what_is_beyond_the_tolerance():
    runs = {
        "one_device": recording(),
        "mirrored": recording(kernel={2: np.full((2, 2), 0.25, "float32")}),
        "parameter_server": recording(per_step=False),
    }
    result = TrainingComparison(
        "one_device",
        runs,
        {
            label: first_divergence(runs["one_device"], runs[label], 1e-5, 1e-6)
            for label in ("mirrored", "parameter_server")
        },
        1e-5,
        1e-6,
    )
    assert not result.same
    lines = result.table().splitlines()
    assert lines[0].split() == ["quantity", "mirrored", "parameter_server"]
    rows = {line.split()[0]: line.split()[1:] for line in lines[2:]}
    assert rows["weights"] == ["0.05", "!", "0"]
    assert rows["loss"] == ["0", "0"]
    assert rows["result"] == ["DIFFERS", "same"]
    report = result.report()
    assert report.startswith("Training differs from one_device under mirrored (rtol=1e-05")
    assert "- mirrored (2 replicas): first differs after step 2 (epoch 1, batch 2)" in report
    assert summary(runs["one_device"], runs["parameter_server"], 1e-5, 1e-6)["weights"] == (
        0.0,
        False,
    )


def test_an_error_from_inside_a_tf_function_is_its_cause_in_one_line():
    from tfdist.testing.recording import error_text

    traced = RuntimeError(
        'in user code:\n\n    File "/keras/trainer.py", line 104, in one_step_on_data  **\n'
        "        return self.train_step(data)\n\n"
        "    RuntimeError: Exception encountered when calling Cond.call().\n\n"
        "    \x1b[1m`merge_call` called while defining a new graph\x1b[0m\n"
    )
    assert error_text(traced) == (
        "RuntimeError: Exception encountered when calling Cond.call(). "
        "`merge_call` called while defining a new graph"
    )
    long = error_text(ValueError("x" * 2000), limit=300)
    assert long.startswith("ValueError: xxx") and " ... " in long and len(long) == 300
