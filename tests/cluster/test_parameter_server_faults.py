"""Tier 3: faults in a real parameter-server cluster.

A coordinator (chief), 2 workers and 1 ps, each a separate process on loopback, started by
tfdist's launcher (plan_job / run_job). The server tasks run `python -m tfdist serve` under a
small wrapper that records the server's pid and exits 0 whatever becomes of it, so that killing
a server is what it is in a Kubernetes TFJob: that one replica is gone, the others run on (the
launcher itself would stop the whole job at the first task that fails).

Two jobs, run once per module and shared by the tests:

    ps_job      trains, saving a tf.train.Checkpoint after every epoch; in the middle of
                epoch KILL_EPOCH the chief SIGKILLs the ps. fit must raise, within seconds, a
                TaskUnavailableError naming ps:0.
    worker_job  a fresh job: restores that checkpoint, then trains on; the chief SIGKILLs
                worker 1 while it is in the middle of a group of steps. Training completes on
                worker 0, optimizer.iterations grows by exactly the scheduled steps, and the
                group worker 1 had partly applied runs again only for its missing steps.

Then, without a cluster: how a lost ps is told from other TensorFlow errors (a TCP probe of the
ps addresses) and named.
"""

import dataclasses
import os
import pickle
import re
import signal
import sys
import threading
import time

import numpy as np
import pytest

from tfdist.launcher import plan_job, run_job
from tfdist.testing import is_running

slow = pytest.mark.slow

FEATURES, CLASSES, BATCH = 8, 3, 32
K = 8  # steps per scheduled group
STEPS = 32  # steps per epoch: 4 groups
PS_EPOCHS, KILL_EPOCH = 4, 2
WORKER_EPOCHS = 2
PACE_MS = 100  # a batch every PACE_MS on each worker: a group takes ~0.8 s
JOB_TIMEOUT = 240

# Runs the server command given after the pid file, writes the server's pid there, and exits
# 0 when the server ends, killed or not. The launcher stops a task by signalling its process
# group, the server included: the wrapper ignores SIGTERM and outlives its server, so that the
# launcher's SIGKILL (sent while the wrapper runs) still reaches a server slow to stop.
_SERVER_WRAPPER = (
    "import os, signal, subprocess, sys\n"
    "server = subprocess.Popen(sys.argv[2:])\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "with open(sys.argv[1] + '.tmp', 'w') as f:\n"
    "    f.write(str(server.pid))\n"
    "os.replace(sys.argv[1] + '.tmp', sys.argv[1])\n"
    "server.wait()\n"
)


# ------------------------------------------------------------------ data and model (chief)


def _blobs(n=4096):
    rng = np.random.RandomState(0)
    x = rng.randn(n, FEATURES).astype("float32")
    y = np.argmax(x @ rng.randn(FEATURES, CLASSES), axis=1).astype("int32")
    return x, y


def _dataset(input_context, every_ms=0):
    import tensorflow as tf
    from tensorflow.python.data.experimental.ops import testing as data_testing

    dataset = tf.data.Dataset.from_tensor_slices(_blobs()).shard(
        input_context.num_input_pipelines, input_context.input_pipeline_id
    )
    dataset = dataset.shuffle(512, seed=input_context.input_pipeline_id).batch(
        BATCH, drop_remainder=True
    )
    if every_ms:  # SleepDataset: made on the coordinator, runs in the worker's input pipeline
        dataset = dataset.apply(data_testing.sleep(int(every_ms * 1000)))
        # and no prefetching ahead of the steps (tf.data injects a prefetch by default): a
        # worker that waited gets no stock of batches, every step takes `every_ms`
        options = tf.data.Options()
        options.experimental_optimization.inject_prefetch = False
        dataset = dataset.with_options(options)
    return dataset


def paced_dataset_fn(input_context):
    """A batch every PACE_MS on every worker: a group of K steps takes K * PACE_MS."""
    return _dataset(input_context, every_ms=PACE_MS)


def plain_dataset_fn(input_context):
    return _dataset(input_context)


def _model(keras):
    keras.utils.set_random_seed(1)
    model = keras.Sequential(
        [
            keras.Input((FEATURES,)),
            keras.layers.Dense(32, activation="relu"),
            keras.layers.Dense(CLASSES),
        ]
    )
    model.compile(
        optimizer=keras.optimizers.Adam(0.01),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=[keras.metrics.SparseCategoricalAccuracy(name="acc")],
    )
    return model


def _server_pid(out_dir, task):
    with open(os.path.join(out_dir, task.replace(":", "-") + ".pid")) as f:
        return int(f.read())


def _iterations(model):
    return int(model.optimizer.iterations.numpy())


# ---------------------------------------------------------------------- chief functions


def ps_job(out_dir):
    """Trains with a checkpoint per epoch; kills ps:0 in the middle of epoch KILL_EPOCH."""
    import tensorflow as tf

    import tfdist
    from tfdist import flavour
    from tfdist.parameter_server import fit_parameter_server

    keras = flavour.keras()
    strategy = tfdist.make_strategy()
    with strategy.scope():
        model = _model(keras)
    checkpoint = tf.train.Checkpoint(model=model, optimizer=model.optimizer)
    saved, killed = {}, {}

    class CheckpointEachEpoch(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            saved["path"] = checkpoint.save(os.path.join(out_dir, "ckpt", "ckpt"))
            saved.update(
                epoch=epoch,
                iterations=_iterations(model),
                weights=[w.numpy() for w in model.weights],
                optimizer=[v.numpy() for v in model.optimizer.variables],
            )

    class KillThePs(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = epoch

        def on_train_batch_end(self, batch, logs=None):
            if self.epoch == KILL_EPOCH and batch >= K and not killed:
                killed.update(at=time.monotonic(), iterations=_iterations(model))
                os.kill(_server_pid(out_dir, "ps:0"), signal.SIGKILL)

    error = None
    try:
        fit_parameter_server(
            model,
            strategy,
            paced_dataset_fn,
            epochs=PS_EPOCHS,
            steps_per_epoch=STEPS,
            steps_per_execution=K,
            verbose=0,
            callbacks=[CheckpointEachEpoch(), KillThePs()],
        )
    except Exception as err:  # pylint: disable=broad-except
        error = {
            "type": type(err).__name__,
            "module": type(err).__module__,
            "message": str(err),
            "tasks": getattr(err, "tasks", None),
            "seconds": time.monotonic() - killed.get("at", time.monotonic()),
        }
    return {"error": error, "saved": saved, "killed_at_iterations": killed.get("iterations")}


def worker_job(out_dir, checkpoint_path):
    """A fresh job: restores the checkpoint, trains on, kills worker 1 in the middle of a group."""
    import logging

    import tensorflow as tf

    import tfdist
    from tfdist import flavour
    from tfdist.parameter_server import (
        build_for_parameter_server,
        evaluate_parameter_server,
        fit_parameter_server,
    )

    keras = flavour.keras()
    strategy = tfdist.make_strategy()
    with strategy.scope():
        model = _model(keras)
    build_for_parameter_server(model, strategy, plain_dataset_fn)
    status = tf.train.Checkpoint(model=model, optimizer=model.optimizer).restore(checkpoint_path)
    status.assert_existing_objects_matched()
    restored = {
        "iterations": _iterations(model),
        "weights": [w.numpy() for w in model.weights],
        "optimizer": [v.numpy() for v in model.optimizer.variables],
    }
    before = evaluate_parameter_server(
        model, strategy, plain_dataset_fn, steps=8, return_dict=True, verbose=0
    )

    warnings = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: warnings.append(record.getMessage())
    logging.getLogger("tfdist").addHandler(handler)

    # Which group each worker runs: tfdist hands ClusterCoordinator a _Group per scheduled
    # group, called on the worker's thread of the coordinator, with [slot, base, size].
    from tensorflow.python.eager import context

    from tfdist.parameter_server import runner as ps_runner

    running, original_call = {}, ps_runner._Group.__call__

    def recording_call(group, iterator, meta):
        running[context.context().device_name] = int(meta.numpy()[0])
        return original_call(group, iterator, meta)

    ps_runner._Group.__call__ = recording_call
    killed, stop = {}, threading.Event()

    def kill_worker_1_in_the_middle_of_a_group():
        # The runner's progress slots (on the ps) count each group's applied steps; `bases`
        # holds what a slot will count once its group is done.
        runner_of = lambda: getattr(model, "_tfdist_ps_runner", (None, None))[1]  # noqa: E731
        while not stop.is_set():
            slot = running.get("/job:worker/replica:0/task:1/device:CPU:0")
            runner = runner_of()
            if slot is not None and runner is not None and runner._bases:
                remaining = runner._bases[slot] - int(runner._progress.numpy()[slot])
                if 2 <= remaining <= K - 1:  # at least 1 step applied, at least 2 to go
                    os.kill(_server_pid(out_dir, "worker:1"), signal.SIGKILL)
                    killed.update(slot=slot, applied=K - remaining, iterations=_iterations(model))
                    return
            time.sleep(0.02)

    killer = threading.Thread(target=kill_worker_1_in_the_middle_of_a_group, daemon=True)
    killer.start()
    try:
        history = fit_parameter_server(
            model,
            strategy,
            paced_dataset_fn,
            epochs=WORKER_EPOCHS,
            steps_per_epoch=STEPS,
            steps_per_execution=K,
            verbose=0,
        )
    finally:
        stop.set()
        killer.join(timeout=10)
        ps_runner._Group.__call__ = original_call
    after = evaluate_parameter_server(
        model, strategy, plain_dataset_fn, steps=8, return_dict=True, verbose=0
    )
    return {
        "restored": restored,
        "killed": dict(killed),
        "history": history.history,
        "iterations": _iterations(model),
        "weights": [w.numpy() for w in model.weights],
        "before": before,
        "after": after,
        "warnings": warnings,
    }


# ---------------------------------------------------------------------------- the driver


def _run_job(fn, out_dir, *args):
    """Runs `fn(out_dir, *args)` on the chief of a 2-worker, 1-ps job; returns its value.

    The chief runs tfdist's own child (`python -m tfdist.launcher.run_function`, as
    `run_cluster` does); the server tasks run the launcher's `python -m tfdist serve` inside
    `_SERVER_WRAPPER`.
    """
    from tfdist.testing.clusters import function_reference

    module, qualname, source = function_reference(fn)
    call_file = os.path.join(out_dir, "call.pkl")
    with open(call_file, "wb") as f:
        pickle.dump(((str(out_dir),) + args, {}), f)
    paths = [os.path.dirname(source)] + [p for p in sys.path if p and os.path.isdir(p)]
    plans = plan_job(
        "tfdist.launcher.run_function",
        [module, qualname, source, call_file, str(out_dir)],
        workers=2,
        ps=1,
        module=True,
        extra_env={
            "PYTHONPATH": os.pathsep.join(dict.fromkeys(paths)),
            "TF_CPP_MIN_LOG_LEVEL": "2",
        },
    )
    plans = [
        dataclasses.replace(
            p,
            argv=(
                sys.executable,
                "-c",
                _SERVER_WRAPPER,
                os.path.join(out_dir, p.task.replace(":", "-") + ".pid"),
            )
            + tuple(p.argv),
        )
        if p.serves
        else p
        for p in plans
    ]
    started = time.monotonic()
    result = run_job(plans, timeout=JOB_TIMEOUT, grace=3.0, quiet=True)
    seconds = time.monotonic() - started
    tails = "\n".join(
        f"--- {name} (exit {r.returncode})\n{r.tail}" for name, r in result.tasks.items()
    )
    chief_output = "\n".join(result.tasks["chief:0"].output)
    with open(os.path.join(out_dir, "chief-0.pkl"), "rb") as f:
        status, value = pickle.load(f)
    assert result.ok and status == "ok", f"{result.reason}: {value}\n{tails}"
    for task in ("worker:0", "worker:1", "ps:0"):  # no server outlives its job
        assert not is_running(_server_pid(out_dir, task)), task
    return value, seconds, chief_output


@pytest.fixture(scope="module")
def ps_lost(tmp_path_factory):
    out_dir = tmp_path_factory.mktemp("ps-lost")
    value, seconds, output = _run_job(ps_job, out_dir)
    return dict(value, job_seconds=seconds, output=output)


@pytest.fixture(scope="module")
def worker_lost(tmp_path_factory, ps_lost):
    out_dir = tmp_path_factory.mktemp("worker-lost")
    value, seconds, output = _run_job(worker_job, out_dir, ps_lost["saved"]["path"])
    return dict(value, job_seconds=seconds, output=output)


# ------------------------------------------------------------------------------ the tests


@slow
def test_a_lost_ps_stops_training_within_seconds_with_an_error_naming_it(ps_lost):
    error = ps_lost["error"]
    assert error is not None, "fit went on without its ps"
    assert error["type"] == "TaskUnavailableError" and error["module"] == "tfdist.errors"
    assert error["tasks"] == ["ps:0"]
    assert "ps:0" in error["message"] and "unreachable" in error["message"]
    assert "restore the last checkpoint" in error["message"]
    assert error["seconds"] < 30, error  # no hang: TensorFlow's error, or tfdist's watchdog
    assert ps_lost["killed_at_iterations"] >= KILL_EPOCH * STEPS


@slow
def test_the_checkpoint_saved_before_the_ps_was_lost_restores_in_a_fresh_job(ps_lost, worker_lost):
    saved, restored = ps_lost["saved"], worker_lost["restored"]
    assert saved["epoch"] == KILL_EPOCH - 1  # the last epoch that ended before the kill
    assert saved["iterations"] == restored["iterations"] == KILL_EPOCH * STEPS
    for want, got in zip(
        saved["weights"] + saved["optimizer"], restored["weights"] + restored["optimizer"]
    ):
        np.testing.assert_array_equal(want, got)


@slow
def test_a_lost_worker_costs_no_step_and_applies_none_twice(worker_lost):
    killed = worker_lost["killed"]
    assert killed, "worker 1 was never seen in the middle of a group"
    assert 1 <= killed["applied"] <= K - 2
    # training completed on worker 0: exactly the scheduled steps on top of the restored ones
    start = worker_lost["restored"]["iterations"]
    assert worker_lost["iterations"] == start + WORKER_EPOCHS * STEPS
    assert len(worker_lost["history"]["loss"]) == WORKER_EPOCHS
    # the group worker 1 had partly applied ran again on worker 0, for its missing steps only
    reruns = [w for w in worker_lost["warnings"] if "ran again" in w]
    assert reruns, worker_lost["output"][-3000:]
    applied = [int(re.search(r"(\d+) of its steps had been applied", w).group(1)) for w in reruns]
    assert len(reruns) == 1 and applied[0] >= killed["applied"], (killed, reruns)
    assert all("worker/replica:0/task:0" in w for w in reruns)


@slow
def test_nothing_applied_before_the_worker_was_lost_is_lost(worker_lost):
    # training went on from the restored weights (not from scratch) and kept improving
    before, after = worker_lost["before"], worker_lost["after"]
    # Asynchronous steps at a constant learning rate keep the loss near its floor (about
    # 0.05-0.09 here, whatever the restored point was); from scratch it would be about 2.3.
    assert after["loss"] < before["loss"] + 0.1
    assert after["acc"] >= before["acc"] - 0.02
    assert after["acc"] > 0.85
    changed = [
        not np.array_equal(a, b)
        for a, b in zip(worker_lost["restored"]["weights"], worker_lost["weights"])
    ]
    assert all(changed)
