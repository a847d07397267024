"""Parameter-server training (tfdist.parameter_server) and its Keras 3 fixes (tfdist.fixes).

The Keras fixes are tested in a child process that holds a whole parameter-server cluster (gRPC
servers for 3 workers and 2 ps, in-process): a ParameterServerStrategy connects its process to
the cluster, which the pytest process must never be. The same child runs once with the fixes
and once with TFDIST_KERAS_FIXES=0, which shows each upstream failure the fixes remove. The step
plan and the argument checks: tests/unit/test_parameter_server_plan.py and
tests/inprocess/test_parameter_server_checks.py.
"""

import os

import numpy as np
import pytest

from tfdist.parameter_server import build_for_parameter_server, fit_parameter_server
from tfdist.testing import run_cluster

from helpers.parameter_server import (
    DIM,
    SHARD_BYTES,
    VOCAB,
    _add_one,
    _embedding_dataset_fn,
    _embedding_model,
    _op_types,
    _regression_dataset_fn,
)

STEPS = 60


# ------------------------------------------------------------- the fixes, in a child process


def _attempt(function):
    try:
        return {"ok": function()}
    except Exception as err:  # the upstream failure, reported to the test
        return {"error": f"{type(err).__name__}: {err}"}


def fixes_in_one_process(out_dir):
    """Child process: a 3-worker, 2-ps cluster in this process; each fix's scenario."""
    import tensorflow as tf

    import tfdist
    from tfdist import ClusterSpec, flavour
    from tfdist.fixes import apply_fixes
    from tfdist.strategy import start_local_servers

    keras = flavour.keras()
    spec = ClusterSpec.local(workers=3, ps=2, chief=True, task_type="chief")
    start_local_servers(spec)
    strategy = tfdist.make_strategy(
        "parameter_server",
        cluster=spec,
        variable_partitioner="min_size",
        min_shard_bytes=SHARD_BYTES,
    )
    result = {"fixes": apply_fixes()}

    # atomic assign_add: the graph of one update, on the ps and (unchanged) locally
    with strategy.scope():
        on_ps = keras.Variable(0, dtype="int64")
    local = keras.Variable(0, dtype="int64")
    result["ps_update_ops"] = _op_types(tf.function(lambda: _add_one(on_ps)))
    result["local_update_ops"] = _op_types(tf.function(lambda: _add_one(local)))

    # ... and what it means: optimizer.iterations after 3 x 60 steps on 3 workers
    with strategy.scope():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse")
    for _ in range(3):
        fit_parameter_server(
            model,
            strategy,
            _regression_dataset_fn,
            steps_per_epoch=STEPS,
            steps_per_execution=1,
            verbose=0,
        )
    result["iterations"] = int(model.optimizer.iterations.numpy())
    result["direct"] = model._tfdist_ps_runner[1]._direct

    # the same through ClusterCoordinator.schedule, the public path (every group reads its
    # progress slot first), with groups of 4 steps and a shorter last group
    os.environ["TFDIST_PS_DIRECT_SCHEDULE"] = "0"
    try:
        with strategy.scope():
            public = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
            public.compile(optimizer="sgd", loss="mse")
        for _ in range(3):
            fit_parameter_server(
                public,
                strategy,
                _regression_dataset_fn,
                steps_per_epoch=22,
                steps_per_execution=4,
                verbose=0,
            )
    finally:
        del os.environ["TFDIST_PS_DIRECT_SCHEDULE"]
    result["public_iterations"] = int(public.optimizer.iterations.numpy())
    result["public_direct"] = public._tfdist_ps_runner[1]._direct

    # sharded trainable variables: an Embedding table split over both ps tasks trains
    with strategy.scope():
        sharded = _embedding_model(keras)
    table = sharded.get_layer("table").embeddings
    result["shards"] = [(v.device, v.shape.as_list()) for v in table._value.variables]
    before = table.numpy()

    def train():
        history = fit_parameter_server(
            sharded, strategy, _embedding_dataset_fn, epochs=2, steps_per_epoch=20, verbose=0
        )
        return {
            "loss": history.history["loss"],
            "iterations": int(sharded.optimizer.iterations.numpy()),
            "rows_changed": int((np.abs(table.numpy() - before).sum(1) > 0).sum()),
            "trainable": [(w.value.device, tuple(w.shape)) for w in sharded.trainable_weights],
            "slots": [
                (v.value.device, tuple(v.shape))
                for v in sharded.optimizer.variables
                if tuple(v.shape) == (VOCAB // 2, DIM)
            ],
        }

    result["train"] = _attempt(train)

    # sharded checkpoint: save on the coordinator; restore into a model with no ps, and with
    # the optimizer into a model sharded the same way
    def checkpoint():
        path = tf.train.Checkpoint(model=sharded, optimizer=sharded.optimizer).save(
            os.path.join(out_dir, "ckpt")
        )
        plain = _embedding_model(keras)  # outside the scope: variables on this process
        tf.train.Checkpoint(model=plain).restore(path).expect_partial()
        plain_table = plain.get_layer("table").embeddings
        with strategy.scope():
            again = _embedding_model(keras)
        build_for_parameter_server(again, strategy, _embedding_dataset_fn)
        tf.train.Checkpoint(model=again, optimizer=again.optimizer).restore(
            path
        ).assert_existing_objects_matched()
        return {
            "local_device": plain_table.value.device,
            "equal": bool(np.array_equal(plain_table.numpy(), table.numpy())),
            "same_layout_iterations": int(again.optimizer.iterations.numpy()),
            "same_layout_equal": all(
                np.array_equal(a.numpy(), b.numpy())
                for a, b in zip(
                    again.weights + again.optimizer.variables,
                    sharded.weights + sharded.optimizer.variables,
                )
            ),
        }

    result["checkpoint"] = _attempt(checkpoint)

    def weights_file():
        path = os.path.join(out_dir, "table.weights.h5")
        sharded.save_weights(path)
        plain = _embedding_model(keras)
        plain.load_weights(path)
        return bool(np.array_equal(plain.get_layer("table").embeddings.numpy(), table.numpy()))

    result["weights_file"] = _attempt(weights_file)

    # the plain Keras idiom: model.fit / evaluate / predict of a model built in the scope
    def plain():
        x, y = _regression_dataset_fn(None).unbatch().batch(256).get_single_element()
        x, y = x.numpy(), y.numpy()
        with strategy.scope():
            model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
            model.compile(optimizer="sgd", loss="mse")
        model.fit(x, y, batch_size=16, epochs=2, verbose=0)
        return {
            "iterations": int(model.optimizer.iterations.numpy()),
            "evaluate": model.evaluate(x, y, batch_size=16, verbose=0),
            "predict_vs_call": float(
                np.max(np.abs(model.predict(x, verbose=0) - model(x).numpy()))
            ),
        }

    result["plain"] = _attempt(plain)
    return result


@pytest.fixture(scope="module")
def with_fixes(tmp_path_factory):
    runs = run_cluster(
        fixes_in_one_process,
        workers=1,
        timeout=300,
        args=(str(tmp_path_factory.mktemp("with-fixes")),),
    )
    return runs["worker:0"].value


@pytest.fixture(scope="module")
def without_fixes(tmp_path_factory):
    runs = run_cluster(
        fixes_in_one_process,
        workers=1,
        timeout=300,
        args=(str(tmp_path_factory.mktemp("without-fixes")),),
        env={"TFDIST_KERAS_FIXES": "0"},
    )
    return runs["worker:0"].value


@pytest.mark.slow
def test_the_parameter_server_fixes_are_registered_and_applied(with_fixes, without_fixes):
    names = {
        "parameter_server_atomic_assign_add",
        "parameter_server_sharded_trainable_variables",
        "parameter_server_sharded_checkpoint",
        "parameter_server_fit_evaluate_predict",
    }
    assert names <= set(with_fixes["fixes"])
    assert not names & set(without_fixes["fixes"])


@pytest.mark.slow
def test_assign_add_on_a_ps_variable_is_one_atomic_op(with_fixes, without_fixes):
    # upstream: read, add on the worker, assign back (two workers lose an update)
    assert {"ReadVariableOp", "AssignVariableOp"} <= set(without_fixes["ps_update_ops"])
    assert "AssignAddVariableOp" not in without_fixes["ps_update_ops"]
    assert "AssignAddVariableOp" in with_fixes["ps_update_ops"]
    assert not {"ReadVariableOp", "AssignVariableOp"} & set(with_fixes["ps_update_ops"])
    # a variable that is not on a ps keeps Keras' own update
    assert with_fixes["local_update_ops"] == without_fixes["local_update_ops"]
    assert "AssignVariableOp" in with_fixes["local_update_ops"]


@pytest.mark.slow
def test_optimizer_iterations_count_every_step_of_three_workers(with_fixes, without_fixes):
    assert with_fixes["iterations"] == 3 * STEPS
    # upstream loses updates whenever two workers step at once (about 1 in 5 steps here)
    assert without_fixes["iterations"] < 3 * STEPS


@pytest.mark.slow
def test_both_ways_of_scheduling_count_every_step(with_fixes):
    # tfdist's direct path (a retried group alone reads its progress slot) ...
    assert with_fixes["direct"] is True and with_fixes["iterations"] == 3 * STEPS
    # ... and ClusterCoordinator.schedule (TFDIST_PS_DIRECT_SCHEDULE=0), groups of 4, 4, ..., 2
    assert with_fixes["public_direct"] is False
    assert with_fixes["public_iterations"] == 3 * 22


@pytest.mark.slow
def test_plain_fit_evaluate_predict_on_parameter_server(with_fixes, without_fixes):
    # upstream: Keras 3's fit has no parameter-server support (keras-team/keras#18624)
    assert (
        "you need to pass this dataset to ClusterCoordinator.create_per_worker_dataset"
        in without_fixes["plain"]["error"]
    )
    plain = with_fixes["plain"]["ok"]
    assert plain["iterations"] == 2 * 256 // 16  # one pass over the arrays per epoch
    assert isinstance(plain["evaluate"], float)  # the loss alone: a scalar, as in Keras
    assert plain["predict_vs_call"] < 1e-6


@pytest.mark.slow
def test_an_embedding_table_sharded_over_two_ps_trains(with_fixes, without_fixes):
    assert "'ShardedVariable' object has no attribute 'handle'" in without_fixes["train"]["error"]
    # two shards of 500 rows, one on each ps task (placed round-robin)
    assert sorted((d.split("/device")[0], s) for d, s in with_fixes["shards"]) == [
        ("/job:ps/replica:0/task:0", [500, DIM]),
        ("/job:ps/replica:0/task:1", [500, DIM]),
    ]
    train = with_fixes["train"]["ok"]
    assert train["iterations"] == 40
    assert train["rows_changed"] > VOCAB // 2
    # the optimizer trains each shard where it lives, and keeps its slots there
    shard_places = [(d, s) for d, s in train["trainable"] if s == (500, DIM)]
    assert [d for d, _ in shard_places] == [d for d, _ in with_fixes["shards"]]
    assert sorted(train["slots"]) == sorted(shard_places * 2)


@pytest.mark.slow
def test_a_sharded_model_checkpoints_and_restores_into_a_model_with_no_ps(
    with_fixes, without_fixes
):
    assert (
        "'ShardedVariable' object has no attribute 'device'" in without_fixes["checkpoint"]["error"]
    )
    restored = with_fixes["checkpoint"]["ok"]
    assert "/job:ps" not in restored["local_device"]
    assert restored["equal"]
    # weights and optimizer state (slots per shard) into a model with the same shards
    assert restored["same_layout_iterations"] == 40
    assert restored["same_layout_equal"]


@pytest.mark.slow
def test_a_sharded_model_writes_keras_weight_files(with_fixes, without_fixes):
    assert "__array__" in without_fixes["weights_file"]["error"]
    assert with_fixes["weights_file"] == {"ok": True}
