"""tfdist.testing.assert_same_training on real strategies: models that must train the same pass,
and each fix that changes numbers, removed, makes it fail and name what differs.

The strategies run in the shared pools of this test process (tfdist.testing.pools): a local
process with 2 virtual CPUs (one_device, mirrored), 2 multi_worker_mirrored processes and a
parameter_server chief with one worker and one ps, started once. A run with a fix removed
(TFDIST_KERAS_FIXES=-name) uses pools of its own, with only the strategies it needs.
"""

import os
import subprocess
import sys

import numpy as np
import pytest

from tfdist import fixes, flavour
from tfdist.fixes.record import APPLIED, APPLIES
from tfdist.testing import TrainingDiffers, assert_same_training, compare_training

from helpers import same_training_models as models
from helpers.paths import EXAMPLES, TESTS

pytestmark = pytest.mark.slow  # starts local processes and clusters

EVERY_STRATEGY = ("one_device", "mirrored", "multi_worker_mirrored", "parameter_server")


def _tf_keras() -> bool:
    return flavour.uses_legacy_keras()


MIRRORED = ("one_device", "mirrored")


@pytest.mark.parametrize(
    "build, data, batch, strategies",
    [
        # 16 examples a step; the 8th and last of 120 examples has 8
        (models.sequential_with_dropout, models.regression(), 16, EVERY_STRATEGY),
        (models.functional_embedding_batch_norm, models.tokens(), 16, EVERY_STRATEGY),
        (models.subclassed_with_custom_train_step, models.regression(), 16, EVERY_STRATEGY),
        # 15 a step: 8 and 7 on the two replicas (mirrored weighs them by their examples)
        (models.sequential_with_dropout, models.regression(), 15, MIRRORED),
        (models.functional_embedding_batch_norm, models.tokens(), 15, MIRRORED),
    ],
    ids=[
        "sequential_dropout",
        "functional_embedding_batch_norm",
        "subclassed_train_step",
        "sequential_dropout_uneven",
        "functional_embedding_batch_norm_uneven",
    ],
)
def test_models_train_the_same_under_every_strategy(build, data, batch, strategies):
    if build is models.subclassed_with_custom_train_step and flavour.keras_version_tuple() < (3, 8):
        pytest.skip("a custom train_step on Keras < 3.8: see the test of the upstream bug below")
    result = assert_same_training(
        build, data, global_batch_size=batch, steps=4, epochs=2, strategies=strategies
    )
    labels = {"one_device", "mirrored"}
    if strategies == EVERY_STRATEGY:
        labels |= {
            "multi_worker_mirrored worker:0",
            "multi_worker_mirrored worker:1",
            "parameter_server",
        }
    assert result.same and set(result.runs) == labels
    reference = result.runs["one_device"]
    assert len(reference["steps"]) == 8 and reference["steps"][-1].get("iterations") == 8
    names = [v["name"] for v in reference["variables"]]
    assert {"weight", "optimizer", "metric"} <= {v["group"] for v in reference["variables"]}
    mirrored = {v["name"]: v for v in result.runs["mirrored"]["variables"]}
    assert mirrored[names[0]]["type"] == "MirroredVariable"
    assert result.runs["mirrored"]["replicas"] == 2
    # every run moved from the same initial weights, and trained
    first = np.concatenate([np.ravel(w) for w in reference["initial_weights"]])
    last = np.concatenate([np.ravel(v) for v in reference["steps"][-1]["values"][:1]])
    assert not np.allclose(first[: last.size], last)
    if build is models.sequential_with_dropout:
        assert reference["switched_off"] == ["dropout (Dropout rate=0.5)"]
        assert "Random layers switched off in every run: dropout" in result.report()


def test_batch_normalization_of_each_replicas_batch_is_reported():
    """Plain BatchNormalization normalises each replica's half of the batch: a real difference,
    named with the layer's variables and the hint to synchronise."""
    with pytest.raises(TrainingDiffers) as caught:
        assert_same_training(
            models.functional_plain_batch_norm,
            models.regression(),
            global_batch_size=16,
            strategies=("one_device", "mirrored"),
        )
    message = str(caught.value)
    assert "- mirrored (2 replicas): first differs after step 1 (epoch 1, batch 1): " in message
    assert "max |diff|" in message and "MirroredVariable" in message
    assert "moving_variance" in message or "moving_var" in message
    table = caught.value.comparison.table()
    assert table.splitlines()[0].split() == ["quantity", "mirrored"]
    assert "DIFFERS" in table.splitlines()[-1]


def _named_weight(result, name):
    found = result.divergences["mirrored"]
    assert found is not None and found.step == 1, result.report()
    first = found.differences[0]
    assert (first.group, first.quantity) == ("weight", name), result.report()
    return first


def _weights_at_step_one(result):
    """The summed gradient is wrong: the first weight differs after the first step."""
    _named_weight(result, "sequential/dense/kernel")


def _nan_in_the_first_weight(result):
    first = _named_weight(result, "sequential/dense/kernel")
    assert first.difference == float("inf") and "NaN/inf" in first.describe()


def _fails_with(*texts):
    def check(result):
        failed = [found for found in result.divergences.values() if found is not None]
        assert failed and all(found.error for found in failed), result.report()
        for found in failed:
            assert found.step == 1 and any(text in found.error for text in texts), found.error

    return check


def _metric_totals_or_logs(result):
    found = result.divergences["mirrored"]
    assert found is not None, result.report()
    assert {d.group for d in found.differences} <= {"metric", "log"}, result.report()
    assert found.differences[0].group == "metric"
    assert "aggregation" in found.differences[0].describe()


# fix -> (model, data, global batch, strategies, more arguments, what the report shows without it)
WITHOUT_THE_FIX = {
    "uneven_batches_weighted_by_examples": (
        models.sgd_mlp,
        models.regression(),
        15,
        ("one_device", "mirrored"),
        {},
        _weights_at_step_one,
    ),
    "symbolic_build_from_a_local_batch": (
        models.sgd_mlp,
        models.regression(),
        15,
        ("one_device", "mirrored"),
        {},
        _fails_with("AddN must have the same size and shape"),
    ),
    "loss_scale_skip_agreed_by_all_replicas": (
        models.mixed_float16_mlp,
        models.overflowing(),
        16,
        ("one_device", "mirrored"),
        {"replicas": 4, "rtol": 1e-3, "atol": 1e-4},
        _nan_in_the_first_weight,
    ),
    "gradient_accumulation_under_a_strategy": (
        models.accumulating_mlp,
        models.regression(),
        16,
        ("one_device", "mirrored"),
        {},
        _fails_with("merge_call"),
    ),
    "multi_worker_mean_of_metric_results": (
        models.sgd_mlp,
        models.regression(),
        16,
        ("one_device", "multi_worker_mirrored"),
        {},
        _fails_with("Invalid reduction dimension"),
    ),
    "metric_variables_summed_over_replicas": (
        models.sgd_mlp,
        models.regression(),
        16,
        ("one_device", "mirrored"),
        {},
        _metric_totals_or_logs,
    ),
}


@pytest.mark.parametrize("fix", list(WITHOUT_THE_FIX))
def test_each_fix_that_changes_numbers_removed_is_named(fix):
    """Where the fix applies to this release, removing it makes the comparison fail and name
    the variable, the log or the error; where the release has no such bug, it passes without."""
    if _tf_keras():
        pytest.skip("the fixes are of Keras 3")
    build, data, batch, strategies, kwargs, shows = WITHOUT_THE_FIX[fix]
    arguments = dict(global_batch_size=batch, strategies=strategies, steps=3, epochs=1, **kwargs)
    assert_same_training(build, data, **arguments)  # with every fix: the same
    state = {status.name: status.state for status in fixes.report()}.get(fix)
    result = compare_training(build, data, env={"TFDIST_KERAS_FIXES": f"-{fix}"}, **arguments)
    if state in (APPLIED, APPLIES):
        assert not result.same
        shows(result)
    else:
        assert result.same, result.report()


def test_an_uneven_batch_between_workers_weighs_each_workers_mean_the_same():
    """multi_worker_mirrored keeps Keras' weighting of a batch that does not split evenly (8
    and 7 of 15): the fix's extra all-reduces between processes would cost fit half its
    throughput (benchmarks/bench_uneven_batches.py). The comparison shows it at step 1."""
    if _tf_keras():
        pytest.skip("Keras 3")
    result = compare_training(
        models.sgd_mlp,
        models.regression(),
        global_batch_size=15,
        strategies=("one_device", "multi_worker_mirrored"),
        steps=2,
        epochs=1,
    )
    _a_weight_differs_first_at_step_one(
        result, "multi_worker_mirrored worker:0", "multi_worker_mirrored worker:1"
    )


def _a_weight_differs_first_at_step_one(result, *labels):
    for label in labels:
        found = result.divergences[label]
        assert found is not None and found.step == 1, result.report()
        assert found.differences[0].group == "weight", result.report()


def test_a_custom_train_step_before_keras_3_8_takes_num_replicas_times_the_step():
    """keras-team/keras#19891 for a custom train_step, which tfdist's loss_scaled_for_replicas
    does not reach: the comparison shows it on the weights."""
    if flavour.keras_version_tuple() >= (3, 8) or _tf_keras():
        pytest.skip("Keras >= 3.8 scales the loss in compute_loss")
    result = compare_training(
        models.subclassed_with_custom_train_step,
        models.regression(),
        global_batch_size=16,
        strategies=("one_device", "mirrored"),
    )
    _a_weight_differs_first_at_step_one(result, "mirrored")


def test_tfdist_verify_prints_the_table_and_exits_by_the_verdict(tmp_path):
    """The example script trains the same everywhere (exit 0); a script with a plain
    BatchNormalization differs under mirrored (exit 1, the report names the variable)."""
    example = str(EXAMPLES / "testing" / "digits_same_training.py")
    same = _verify([example])
    assert same.returncode == 0, same.stdout + same.stderr
    lines = same.stdout.splitlines()
    header = next(line for line in lines if line.startswith("quantity"))
    assert header.split() == [
        "quantity",
        "mirrored",
        "multi_worker_mirrored",
        "worker:0",
        "multi_worker_mirrored",
        "worker:1",
        "parameter_server",
    ]
    rows = {line.split()[0]: line.split()[1:] for line in lines if line.split()}
    assert rows["result"] == ["same"] * 4
    assert {"accuracy", "loss", "iterations", "weights", "optimizer", "metric"} <= set(rows)
    assert "Random layers switched off in every run: dropout (Dropout rate=0.2)" in same.stdout

    script = tmp_path / "plain_norm.py"
    script.write_text(
        "from helpers.same_training_models import functional_plain_batch_norm as build_model\n"
        "from helpers.same_training_models import regression\n"
        "GLOBAL_BATCH_SIZE = 16\n"
        "DATA = regression()\n"
    )
    differs = _verify([str(script), "--strategies", "one_device,mirrored", "--steps", "2"])
    assert differs.returncode == 1, differs.stdout + differs.stderr
    assert "DIFFERS" in differs.stdout and "moving_var" in differs.stdout
    assert "HINT: BatchNormalization normalises each replica's batch" in differs.stdout


def _verify(args):
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])
    )
    return subprocess.run(
        [sys.executable, "-m", "tfdist", "verify", *args],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
