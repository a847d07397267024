"""Tier 3: parameter-server training in real local clusters (chief + workers + ps processes).

Each job is started once per module and answers many tests: the chief runs one function that
trains, checkpoints and reports a dict; the worker and ps tasks only serve.

    keras3_job   2 workers, 2 ps  Keras 3: three model kinds, callbacks, evaluation, a table
                                  sharded over both ps, checkpoints of both
    resume_job   3 workers, 1 ps  a fresh job restores those checkpoints and trains on
    single_job   1 worker,  1 ps  Keras 3 with one worker; BackupAndRestore through tfdist.fit
    tf_keras_job 2 workers, 1 ps  the same calls under tf_keras (TF_USE_LEGACY_KERAS=1)
"""

import os

import numpy as np
import pytest

from tfdist.testing import run_cluster

pytestmark = pytest.mark.slow

FEATURES, CLASSES = 8, 3
VOCAB, DIM, SEQ = 1000, 16, 4  # a 64 KiB table: sharded above SHARD_BYTES
SHARD_BYTES = 16 << 10
STEPS, EPOCHS = 10, 3


# -------------------------------------------------------------- data and models (any task)


def _blobs(n=2048):
    rng = np.random.RandomState(0)
    x = rng.randn(n, FEATURES).astype("float32")
    y = np.argmax(x @ rng.randn(FEATURES, CLASSES), axis=1).astype("int32")
    return x, y


def _shard_and_batch(dataset, input_context, batch=32):
    dataset = dataset.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
    return dataset.shuffle(256, seed=input_context.input_pipeline_id).batch(
        batch, drop_remainder=True
    )


def blobs_dataset_fn(input_context):
    """(x, y) batches."""
    import tensorflow as tf

    return _shard_and_batch(tf.data.Dataset.from_tensor_slices(_blobs()), input_context)


def dict_dataset_fn(input_context):
    """({"features": x}, y) batches, for a functional model with a named input."""
    import tensorflow as tf

    x, y = _blobs()
    return _shard_and_batch(tf.data.Dataset.from_tensor_slices(({"features": x}, y)), input_context)


def weighted_dataset_fn(input_context):
    """(x, y, sample_weight) batches."""
    import tensorflow as tf

    x, y = _blobs()
    weights = np.where(y == 0, 2.0, 1.0).astype("float32")
    return _shard_and_batch(tf.data.Dataset.from_tensor_slices((x, y, weights)), input_context)


def ids_dataset_fn(input_context):
    """(token ids, label) batches for the embedding model: the label is the first token's.

    100 tokens spread over the whole table (so over every shard), each seen often enough to
    learn in a few epochs.
    """
    import tensorflow as tf

    tokens = np.arange(0, VOCAB, 10)
    ids = np.random.RandomState(1).choice(tokens, size=(4096, SEQ)).astype("int32")
    labels = ((ids[:, 0] // 10) % 2).astype("float32")
    return _shard_and_batch(tf.data.Dataset.from_tensor_slices((ids, labels)), input_context)


def _compile(keras, model, **options):
    model.compile(
        optimizer=keras.optimizers.Adam(0.02),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=[keras.metrics.SparseCategoricalAccuracy(name="acc")],
        **options,
    )
    return model


def functional(keras, **options):
    inputs = keras.Input((FEATURES,), name="features")
    hidden = keras.layers.Dense(32, activation="relu")(inputs)
    return _compile(keras, keras.Model(inputs, keras.layers.Dense(CLASSES)(hidden)), **options)


def sequential(keras, **options):
    return _compile(
        keras,
        keras.Sequential(
            [
                keras.Input((FEATURES,)),
                keras.layers.Dense(32, activation="relu"),
                keras.layers.Dense(CLASSES),
            ]
        ),
        **options,
    )


def subclassed(keras, **options):
    class TwoLayers(keras.Model):
        def __init__(self):
            super().__init__()
            self.hidden = keras.layers.Dense(32, activation="relu")
            self.out = keras.layers.Dense(CLASSES)

        def call(self, x):
            return self.out(self.hidden(x))

    return _compile(keras, TwoLayers(), **options)


def embedding(keras):
    inputs = keras.Input((SEQ,), dtype="int32")
    table = keras.layers.Embedding(VOCAB, DIM, name="table")(inputs)
    outputs = keras.layers.Dense(1)(keras.layers.Flatten()(table))
    model = keras.Model(inputs, outputs)
    model.compile(
        optimizer=keras.optimizers.Adam(0.05),
        loss=keras.losses.BinaryCrossentropy(from_logits=True),
    )
    return model


def _iterations(model) -> int:
    return int(model.optimizer.iterations.numpy())


def _jobs(variables) -> list:
    """The jobs holding `variables` (Keras 3 variables wrap a tf.Variable; tf_keras' are one)."""
    return sorted({getattr(v, "_value", v).device.split("/replica")[0] for v in variables})


def _values(variables) -> list:
    return [np.array(v.numpy()) for v in variables]


# ---------------------------------------------------------------------- chief functions


def plain_keras_idiom(keras, strategy, steps_per_epoch=None, validation_steps=None):
    """model.fit / evaluate / predict as on any other strategy: arrays with validation_split,
    a batched dataset with validation_data (tf_keras needs the step counts)."""
    import tensorflow as tf

    x, y = _blobs(512)
    with strategy.scope():
        model = sequential(keras)
    arrays = model.fit(
        x,
        y,
        batch_size=32,
        epochs=2,
        validation_split=0.25,
        verbose=0,
        steps_per_epoch=steps_per_epoch,
        validation_steps=validation_steps,
    )
    after_arrays = _iterations(model)
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(32)
    batched = model.fit(
        dataset,
        epochs=1,
        validation_data=dataset,
        verbose=0,
        steps_per_epoch=steps_per_epoch and 16,
        validation_steps=validation_steps,
    )
    predicted = model.predict(x, batch_size=64, verbose=0)
    return {
        "arrays": arrays.history,
        "iterations_after_arrays": after_arrays,
        "dataset": batched.history,
        "iterations": _iterations(model),
        "evaluate": model.evaluate(
            x, y, batch_size=64, return_dict=True, verbose=0, steps=validation_steps and 8
        ),
        "predict_shape": list(predicted.shape),
        "predict_vs_call": float(np.max(np.abs(predicted - model(x).numpy()))),
    }


def keras3_job(out_dir):
    import tensorflow as tf

    import tfdist
    from tfdist import flavour
    from tfdist.parameter_server import evaluate_parameter_server, fit_parameter_server

    keras = flavour.keras()
    # "auto" in the chief of a job with ps tasks: parameter_server
    strategy = tfdist.make_strategy(variable_partitioner="min_size", min_shard_bytes=SHARD_BYTES)
    result = {"strategy": type(strategy).__name__, "keras": keras.__name__}

    # three kinds of models, three kinds of data, three ways to set steps_per_execution
    runs = {
        "functional": (functional, dict_dataset_fn, dict(steps_per_execution=3), {}),
        "sequential": (sequential, weighted_dataset_fn, {}, dict(steps_per_execution=4)),
        "subclassed": (subclassed, blobs_dataset_fn, {}, {}),
    }
    for kind, (build, dataset_fn, compiled, passed) in runs.items():
        with strategy.scope():
            model = build(keras, **compiled)
        history = fit_parameter_server(
            model,
            strategy,
            dataset_fn,
            epochs=EPOCHS,
            steps_per_epoch=STEPS,
            verbose=0,
            validation_dataset_fn=dataset_fn,
            validation_steps=3,
            **passed,
        )
        result[kind] = {
            "history": history.history,
            "epochs": history.epoch,
            "iterations": _iterations(model),
            "jobs": _jobs(model.weights + model.optimizer.variables + model.metrics_variables),
        }
        if kind == "functional":
            path = tf.train.Checkpoint(model=model, optimizer=model.optimizer).save(
                os.path.join(out_dir, "dense", "ckpt")
            )
            result["dense"] = {
                "path": path,
                "iterations": _iterations(model),
                "weights": _values(model.weights),
                "optimizer": _values(model.optimizer.variables),
            }

    # callbacks: batch hooks per scheduled group, EarlyStopping, LearningRateScheduler,
    # ModelCheckpoint
    class Recorder(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.events = []

        def on_epoch_begin(self, epoch, logs=None):
            self.events.append(("epoch_begin", epoch))

        def on_train_batch_begin(self, batch, logs=None):
            self.events.append(("batch_begin", batch))

        def on_train_batch_end(self, batch, logs=None):
            self.events.append(("batch_end", batch, sorted(logs)))

        def on_epoch_end(self, epoch, logs=None):
            self.events.append(("epoch_end", epoch, sorted(logs)))

    recorder = Recorder()
    with strategy.scope():
        model = functional(keras)
    callbacks = [
        recorder,
        # loss falls every epoch, so in "max" mode the second epoch is no improvement: stop
        keras.callbacks.EarlyStopping(monitor="loss", mode="max", patience=1),
        keras.callbacks.LearningRateScheduler(lambda epoch, lr: 0.01 * (epoch + 1)),
        keras.callbacks.ModelCheckpoint(
            os.path.join(out_dir, "epoch-{epoch}.weights.h5"), save_weights_only=True
        ),
    ]
    history = fit_parameter_server(
        model,
        strategy,
        dict_dataset_fn,
        epochs=6,
        steps_per_epoch=STEPS,
        steps_per_execution=4,
        callbacks=callbacks,
        verbose=0,
    )
    result["callbacks"] = {
        "history": history.history,
        "iterations": _iterations(model),
        "stop_training": model.stop_training,
        "events": recorder.events,
        "learning_rate": float(model.optimizer.learning_rate.numpy()),
        "files": sorted(f for f in os.listdir(out_dir) if f.endswith(".h5")),
    }
    result["evaluate"] = {
        "dict": evaluate_parameter_server(
            model, strategy, dict_dataset_fn, steps=5, return_dict=True, verbose=0
        ),
        "list": evaluate_parameter_server(
            model, strategy, dict_dataset_fn, steps=5, steps_per_execution=2, verbose=0
        ),
    }

    # an embedding table sharded over both ps tasks
    with strategy.scope():
        model = embedding(keras)
    table = model.get_layer("table").embeddings
    history = fit_parameter_server(
        model,
        strategy,
        ids_dataset_fn,
        epochs=3,
        steps_per_epoch=25,
        steps_per_execution=5,
        verbose=0,
    )
    path = tf.train.Checkpoint(model=model, optimizer=model.optimizer).save(
        os.path.join(out_dir, "sharded", "ckpt")
    )
    result["sharded"] = {
        "path": path,
        "loss": history.history["loss"],
        "iterations": _iterations(model),
        "shards": [
            (v.device.split("/device")[0], v.shape.as_list()) for v in table._value.variables
        ],
        "table": table.numpy(),
        "weights": _values(model.weights),
    }
    result["plain"] = plain_keras_idiom(keras, strategy)
    return result


def resume_job(out_dir, dense, sharded_path):
    import tensorflow as tf

    import tfdist
    from tfdist import flavour
    from tfdist.parameter_server import build_for_parameter_server, fit_parameter_server

    keras = flavour.keras()
    strategy = tfdist.make_strategy("parameter_server")
    with strategy.scope():
        model = functional(keras, steps_per_execution=3)
    build_for_parameter_server(model, strategy, dict_dataset_fn)
    status = tf.train.Checkpoint(model=model, optimizer=model.optimizer).restore(dense)
    status.assert_existing_objects_matched()
    result = {
        "workers": strategy.extended._num_workers,
        "restored": {
            "iterations": _iterations(model),
            "weights": _values(model.weights),
            "optimizer": _values(model.optimizer.variables),
            "jobs": _jobs(model.weights + model.optimizer.variables),
        },
    }
    history = fit_parameter_server(
        model,
        strategy,
        dict_dataset_fn,
        epochs=EPOCHS + 1,
        initial_epoch=EPOCHS,
        steps_per_epoch=11,
        steps_per_execution=4,
        verbose=0,
    )
    result["resumed"] = {"iterations": _iterations(model), "epochs": history.epoch}

    # the table that was sharded over 2 ps tasks, into a model on this job's single ps
    with strategy.scope():
        model = embedding(keras)
    tf.train.Checkpoint(model=model).restore(sharded_path).expect_partial()
    table = model.get_layer("table").embeddings
    result["sharded"] = {"type": type(table.value).__name__, "table": table.numpy()}
    return result


def single_job(out_dir):
    import tfdist
    from tfdist import flavour
    from tfdist.parameter_server import fit_parameter_server

    keras = flavour.keras()
    strategy = tfdist.make_strategy()
    with strategy.scope():
        model = sequential(keras)
    history = fit_parameter_server(
        model,
        strategy,
        blobs_dataset_fn,
        epochs=2,
        steps_per_epoch=7,
        steps_per_execution=3,
        verbose=0,
    )
    result = {
        "workers": strategy.extended._num_workers,
        "iterations": _iterations(model),
        "loss": history.history["loss"],
    }
    result["backup"] = _interrupted_and_resumed(keras, strategy, out_dir)
    # no steps_per_epoch: an epoch is one pass over the arrays, ceil(500 / 32) = 16 steps
    x, y = _blobs(500)
    history = tfdist.fit(
        lambda: sequential(keras),
        (x, y),
        strategy=strategy,
        global_batch_size=32,
        epochs=2,
        verbose=0,
    )
    result["one_pass"] = {
        "iterations": _iterations(history.model),
        "evaluate": tfdist.evaluate(
            history.model, (x, y), strategy=strategy, global_batch_size=32, verbose=0
        ),
    }
    return result


def _interrupted_and_resumed(keras, strategy, out_dir):
    """tfdist.fit with BackupAndRestore: stopped after epoch 2 of 4, then run again."""
    import tfdist

    x, y = _blobs(512)
    backup = os.path.join(out_dir, "backup")
    seen = {"first": [], "second": []}

    class Record(keras.callbacks.Callback):
        def __init__(self, run):
            super().__init__()
            self.run = run

        def on_train_begin(self, logs=None):  # after BackupAndRestore's: the restored state
            seen[self.run + "_start"] = (_iterations(self.model), _values(self.model.weights))

        def on_epoch_begin(self, epoch, logs=None):
            seen[self.run].append(epoch)

        def on_epoch_end(self, epoch, logs=None):
            seen[self.run + "_end"] = (_iterations(self.model), _values(self.model.weights))
            if self.run == "first" and epoch == 1:
                raise KeyboardInterrupt("the job is interrupted")

    def fit(run):
        return tfdist.fit(
            lambda: sequential(keras),
            (x, y),
            strategy=strategy,
            global_batch_size=32,
            epochs=4,
            steps_per_epoch=5,
            verbose=0,
            callbacks=[keras.callbacks.BackupAndRestore(backup), Record(run)],
        )

    try:
        fit("first")
    except KeyboardInterrupt:
        pass
    history = fit("second")
    return dict(
        seen,
        history_epochs=history.epoch,
        backup_left=os.path.exists(backup),
        iterations=_iterations(history.model),
    )


def tf_keras_job():
    import tfdist
    from tfdist import flavour
    from tfdist.parameter_server import evaluate_parameter_server, fit_parameter_server

    keras = flavour.keras()
    strategy = tfdist.make_strategy()
    with strategy.scope():
        model = functional(keras, steps_per_execution=3)
    history = fit_parameter_server(
        model,
        strategy,
        dict_dataset_fn,
        epochs=EPOCHS,
        steps_per_epoch=STEPS,
        validation_dataset_fn=dict_dataset_fn,
        validation_steps=3,
        verbose=0,
        callbacks=[keras.callbacks.LearningRateScheduler(lambda epoch, lr: 0.01 * (epoch + 1))],
    )
    return {
        "keras": keras.__name__,
        "history": history.history,
        "iterations": _iterations(model),
        "jobs": _jobs(model.weights),
        "evaluate": evaluate_parameter_server(
            model, strategy, dict_dataset_fn, steps=4, return_dict=True, verbose=0
        ),
        "plain": plain_keras_idiom(keras, strategy, steps_per_epoch=12, validation_steps=4),
    }


# ----------------------------------------------------------------------------- the jobs


@pytest.fixture(scope="module")
def out_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("ps")


@pytest.fixture(scope="module")
def keras3(out_dir):
    runs = run_cluster(keras3_job, workers=2, ps=2, args=(str(out_dir),), timeout=400)
    assert set(runs) == {"chief:0", "worker:0", "worker:1", "ps:0", "ps:1"}
    return runs["chief:0"].value


@pytest.fixture(scope="module")
def resumed(keras3, out_dir):
    runs = run_cluster(
        resume_job,
        workers=3,
        ps=1,
        timeout=300,
        args=(str(out_dir), keras3["dense"]["path"], keras3["sharded"]["path"]),
    )
    return runs["chief:0"].value


# ------------------------------------------------------------------------------ the tests


def _assert_all_equal(expected, actual):
    assert len(expected) == len(actual)
    for want, got in zip(expected, actual):
        np.testing.assert_array_equal(want, got)


@pytest.mark.parametrize("kind", ["functional", "sequential", "subclassed"])
def test_each_kind_of_keras3_model_trains_with_its_compiled_loss_and_metrics(keras3, kind):
    assert keras3["strategy"] == "ParameterServerStrategyV2"
    assert keras3["keras"] == "keras"
    run = keras3[kind]
    history = run["history"]
    assert run["epochs"] == list(range(EPOCHS))
    assert sorted(history) == ["acc", "loss", "val_acc", "val_loss"]
    assert all(len(values) == EPOCHS for values in history.values())
    assert history["loss"][-1] < history["loss"][0]
    assert history["acc"][-1] > history["acc"][0]
    # 2 workers, exact: 3 epochs x 10 steps, in groups of 3 / 4 / 1 steps with a remainder
    assert run["iterations"] == EPOCHS * STEPS
    # weights, optimizer state and metric state all live on the ps tasks
    assert run["jobs"] == ["/job:ps"]


def test_batch_callbacks_run_once_per_scheduled_group_in_order(keras3):
    events = keras3["callbacks"]["events"]
    first = events[: events.index(("epoch_begin", 1))]
    assert first[0] == ("epoch_begin", 0)
    # steps_per_execution=4 over 10 steps: groups 0-3, 4-7, 8-9
    assert [e[1] for e in first if e[0] == "batch_begin"] == [0, 4, 8]
    assert [e[1] for e in first if e[0] == "batch_end"] == [3, 7, 9]
    assert all(e[2] == ["acc", "loss"] for e in first if e[0] == "batch_end")
    assert first[-1][:2] == ("epoch_end", 0)
    assert first[-1][2] == ["acc", "loss"]  # LearningRateScheduler, later, adds its own


def test_early_stopping_learning_rate_schedule_and_model_checkpoint(keras3):
    run = keras3["callbacks"]
    # EarlyStopping stopped the 6-epoch fit after its second epoch, at an exact step count
    assert run["stop_training"] is True
    assert len(run["history"]["loss"]) == 2
    assert run["iterations"] == 2 * STEPS
    # LearningRateScheduler set the rate on the ps before each epoch
    assert run["history"]["learning_rate"] == pytest.approx([0.01, 0.02])
    assert run["learning_rate"] == pytest.approx(0.02)
    # ModelCheckpoint wrote a Keras weights file per epoch, on the coordinator
    assert run["files"] == ["epoch-1.weights.h5", "epoch-2.weights.h5"]


def test_evaluate_returns_the_aggregate_metrics(keras3):
    run = keras3["evaluate"]
    assert sorted(run["dict"]) == ["acc", "loss"]
    assert 0.0 <= run["dict"]["acc"] <= 1.0
    assert len(run["list"]) == 2  # [loss, acc]
    assert 0.0 <= run["list"][1] <= 1.0


def test_weights_files_from_model_checkpoint_load_into_a_local_model(keras3, out_dir):
    import keras

    model = functional(keras)
    model.optimizer.build(model.trainable_variables)
    model.load_weights(str(out_dir / "epoch-2.weights.h5"))
    assert int(model.optimizer.iterations.numpy()) == 2 * STEPS
    assert model.predict(_blobs(8)[0], verbose=0).shape == (8, CLASSES)


def test_an_embedding_table_sharded_over_two_ps_trains_in_a_real_cluster(keras3):
    run = keras3["sharded"]
    assert sorted(run["shards"]) == [
        ("/job:ps/replica:0/task:0", [500, DIM]),
        ("/job:ps/replica:0/task:1", [500, DIM]),
    ]
    assert run["iterations"] == 3 * 25
    assert run["loss"][-1] < run["loss"][0]


def test_a_fresh_job_resumes_at_the_saved_step_with_the_saved_state(keras3, resumed):
    saved = keras3["dense"]
    restored = resumed["restored"]
    assert restored["iterations"] == saved["iterations"] == EPOCHS * STEPS
    assert restored["jobs"] == ["/job:ps"]
    _assert_all_equal(saved["weights"], restored["weights"])
    _assert_all_equal(saved["optimizer"], restored["optimizer"])
    # and trains on, with 3 workers, one more epoch of 11 steps in groups of 4, 4, 3: exact
    assert resumed["workers"] == 3
    assert resumed["resumed"] == {"iterations": EPOCHS * STEPS + 11, "epochs": [EPOCHS]}


def test_a_sharded_checkpoint_restores_into_one_ps_and_into_a_local_model(keras3, resumed):
    table = keras3["sharded"]["table"]
    assert table.shape == (VOCAB, DIM)
    # the job with one ps holds the table whole, with the values of the 2-ps job
    assert resumed["sharded"]["type"] != "ShardedVariable"
    np.testing.assert_array_equal(resumed["sharded"]["table"], table)
    # and a plain local model (no strategy, this process) reads the same checkpoint
    import keras
    import tensorflow as tf

    model = embedding(keras)
    tf.train.Checkpoint(model=model).restore(keras3["sharded"]["path"]).expect_partial()
    _assert_all_equal(keras3["sharded"]["weights"], [w.numpy() for w in model.weights])


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    runs = run_cluster(
        single_job, workers=1, ps=1, timeout=240, args=(str(tmp_path_factory.mktemp("single")),)
    )
    return runs["chief:0"].value


def _assert_the_plain_idiom_trained(plain, arrays_steps, dataset_steps):
    assert sorted(plain["arrays"]) == ["acc", "loss", "val_acc", "val_loss"]
    assert plain["arrays"]["loss"][-1] < plain["arrays"]["loss"][0]
    assert sorted(plain["dataset"]) == ["acc", "loss", "val_acc", "val_loss"]
    assert plain["iterations_after_arrays"] == arrays_steps
    assert plain["iterations"] == arrays_steps + dataset_steps
    assert plain["evaluate"]["acc"] > 0.7 and set(plain["evaluate"]) == {"acc", "loss"}
    assert plain["predict_shape"] == [512, CLASSES] and plain["predict_vs_call"] < 1e-5


def test_the_plain_keras_idiom_trains_keras3_models_on_parameter_server(keras3):
    # 384 training examples after validation_split=0.25, batch 32: 12 steps x 2 epochs;
    # then one pass over a dataset of 16 batches
    _assert_the_plain_idiom_trained(keras3["plain"], 2 * 12, 16)


def test_one_worker_counts_every_step(single):
    assert single["workers"] == 1
    # 2 epochs x 7 steps in groups of 3, 3, 1
    assert single["iterations"] == 14
    assert single["loss"][-1] < single["loss"][0]


def test_without_step_counts_an_epoch_is_one_pass_over_the_data(single):
    assert single["one_pass"]["iterations"] == 2 * 16
    assert set(single["one_pass"]["evaluate"]) == {"acc", "loss"}


def test_backup_and_restore_resumes_an_interrupted_fit_at_the_next_epoch(single):
    backup = single["backup"]
    assert backup["first"] == [0, 1]
    # the second run starts from the state saved at the end of epoch 2, and trains 3 and 4
    assert backup["second"] == [2, 3] and backup["history_epochs"] == [2, 3]
    assert backup["second_start"][0] == backup["first_end"][0] == 2 * 5
    _assert_all_equal(backup["first_end"][1], backup["second_start"][1])
    assert backup["iterations"] == 4 * 5
    assert not backup["backup_left"]  # deleted at the end of a completed fit


def test_the_same_calls_train_a_tf_keras_model():
    runs = run_cluster(tf_keras_job, workers=2, ps=1, timeout=300, env={"TF_USE_LEGACY_KERAS": "1"})
    result = runs["chief:0"].value
    assert result["keras"] == "tf_keras"
    assert result["iterations"] == EPOCHS * STEPS
    assert result["jobs"] == ["/job:ps"]
    history = result["history"]
    assert {"loss", "acc", "val_loss", "val_acc"} <= set(history)
    assert history["loss"][-1] < history["loss"][0]
    assert [float(lr) for lr in history["lr"]] == pytest.approx([0.01, 0.02, 0.03])
    assert sorted(result["evaluate"]) == ["acc", "loss"]
    _assert_the_plain_idiom_trained(result["plain"], 2 * 12, 16)
