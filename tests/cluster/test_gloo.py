"""Tier 3: multi_worker_mirrored with communication="gloo" (torch.distributed's Gloo).

One 2-process job checks, on real processes over loopback: exact sums and means of every
dtype Gloo carries, bf16 compression on top, sparse gradients (left to TensorFlow), and that
Keras 3 `fit` (its steps chosen per call by tfdist), `tfdist.fit` and tf_keras `fit` train as
one device does on the global batch, with their gradients counted through Gloo (Keras 3's in
buckets of one tensor, the last layer's first). A second job loses a worker: its peer's Gloo
call fails at once, naming the transport, instead of hanging.
"""

import time

import pytest

pytest.importorskip("torch.distributed")

pytestmark = pytest.mark.slow

GLOO = {"TFDIST_COMMUNICATION": "gloo", "TF_CPP_MIN_LOG_LEVEL": "2"}


def _data(np):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(256, 8)).astype("float32")
    y = (x @ rng.normal(size=(8, 1)) + 0.1).astype("float32")
    return x, y


def _model(keras, seed):
    keras.utils.set_random_seed(seed)
    model = keras.Sequential(
        [keras.Input((8,)), keras.layers.Dense(16, activation="tanh"), keras.layers.Dense(1)]
    )
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
    return model


def _gap(model, reference) -> float:
    import numpy as np

    pairs = zip(model.get_weights(), reference.get_weights())
    return max(float(np.max(np.abs(a - b))) for a, b in pairs)


def _counted(group) -> list:
    """The bytes of every Gloo all-reduce `group` makes from now on, a list that grows."""
    sent = []
    reduce_ = group.all_reduce_

    def counted(array, bfloat16=False):
        sent.append(array.nbytes)
        return reduce_(array, bfloat16=bfloat16)

    group.all_reduce_ = counted
    return sent


def gloo_job():
    import keras
    import numpy as np
    import tensorflow as tf

    import tfdist
    from tfdist.strategy import gloo
    from tfdist.strategy.compression import compress_multi_worker

    strategy = tfdist.make_strategy()  # TFDIST_COMMUNICATION=gloo
    group = gloo.group_of(strategy)
    sent = _counted(group)
    r = tfdist.detect_cluster().task_index + 1
    out = {"rank": group.rank, "size": group.size}

    @tf.function
    def sums():
        def replica():
            ctx = tf.distribute.get_replica_context()
            dense = [
                tf.fill([3, 5], float(r)),
                tf.constant([r, 2 * r], tf.int64),
                tf.fill([7], tf.cast(r, tf.float16)),
                tf.fill([2000], tf.cast(r, tf.bfloat16)),
                tf.constant(0.5 * r, tf.float64),
                tf.fill([40960], 40960.0 * r),  # exact in bfloat16 and float32
            ]
            total = ctx.all_reduce("SUM", dense)
            mean = ctx.all_reduce("MEAN", tf.fill([4], float(r)))
            rows = tf.IndexedSlices(
                tf.fill([1, 3], float(r)), tf.constant([r - 1]), tf.constant([2, 3])
            )
            sparse = tf.convert_to_tensor(ctx.all_reduce("SUM", rows))
            return [tf.cast(tf.reshape(t, [-1])[:1], tf.float64) for t in total] + [
                tf.cast(mean[:1], tf.float64),
                tf.cast(tf.reshape(sparse, [-1]), tf.float64),
            ]

        return [strategy.experimental_local_results(t)[0] for t in strategy.run(replica)]

    plain = [t.numpy().tolist() for t in sums()]
    compress_multi_worker(strategy, "bf16")
    out["bf16"] = [t.numpy().tolist() for t in tf.function(sums.python_function)()]
    compress_multi_worker(strategy, None)
    out["sums"], out["bytes_before_training"] = plain, sum(sent)

    x, y = _data(np)
    reference = _model(keras, 1)
    reference.fit(x, y, batch_size=64, epochs=2, shuffle=False, verbose=0)
    with strategy.scope():
        model = _model(keras, 1)
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(64)
    group.bucket_bytes = 1  # one Gloo call per gradient, the last layer's first
    sent.clear()
    model.fit(dataset, epochs=2, verbose=0)
    group.bucket_bytes = gloo.BUCKET_BYTES
    out["fit_bytes"], out["fit_calls"] = sum(sent), list(sent)
    out["gradient_bytes"] = [4 * int(np.prod(v.shape)) for v in model.trainable_variables]
    out["fit_gap"] = _gap(model, reference)
    out["params_bytes"] = 4 * model.count_params()

    model = tfdist.fit(lambda: _model(keras, 2), dataset, strategy=strategy, verbose=0).model
    reference = _model(keras, 2)
    reference.fit(x, y, batch_size=64, epochs=1, shuffle=False, verbose=0)
    out["tfdist_fit_gap"] = _gap(model, reference)

    import tf_keras

    with strategy.scope():
        model = _model(tf_keras, 3)
    sent.clear()
    model.fit(dataset, epochs=1, verbose=0)
    out["tf_keras_bytes"] = sum(sent)
    reference = _model(tf_keras, 3)
    reference.fit(x, y, batch_size=64, epochs=1, shuffle=False, verbose=0)
    out["tf_keras_gap"] = _gap(model, reference)
    return out


def test_sums_and_every_fit_through_gloo(run_cluster):
    runs = run_cluster(gloo_job, workers=2, env=GLOO, timeout=300)
    for task, run in runs.items():
        got = run.value
        assert got["size"] == 2 and got["rank"] == int(task[-1])
        # float32, int64, float16, bfloat16, float64, 40960 * (1 + 2), MEAN, sparse rows
        expected = [[3.0], [3.0], [3.0], [3.0], [1.5], [122880.0], [1.5], [1.0] * 3 + [2.0] * 3]
        assert got["sums"] == expected
        assert got["bf16"] == expected
        assert got["bytes_before_training"] > 0  # the dense sums went through Gloo
        # 4 global batches of 64 per epoch, 2 epochs: every step's gradients crossed Gloo
        assert got["fit_bytes"] >= 8 * got["params_bytes"], got
        # each step's gradients in buckets of one, from the last layer's (8 steps)
        step = got["gradient_bytes"][::-1]
        calls = got["fit_calls"]
        starts = [i for i in range(len(calls)) if calls[i : i + len(step)] == step]
        assert len(starts) == 8 and step == [4, 64, 64, 512], (step, calls)
        assert got["fit_gap"] < 1e-5, got
        assert got["tfdist_fit_gap"] < 1e-5, got
        assert got["tf_keras_bytes"] >= 4 * got["params_bytes"], got  # tf_keras: 4 steps
        assert got["tf_keras_gap"] < 1e-5, got


def lost_peer_job(report):
    import json
    import os

    import tensorflow as tf

    import tfdist

    strategy = tfdist.make_strategy()
    x = tf.Variable(tf.ones([1 << 16]))

    @tf.function
    def step():
        return strategy.run(
            lambda: tf.distribute.get_replica_context().all_reduce("SUM", tf.identity(x))
        )

    step()
    if tfdist.detect_cluster().task_index == 1:
        os._exit(0)  # lost without a word (no exit barrier); 0: run_cluster lets worker 0 go on
    time.sleep(1)
    started = time.monotonic()
    error = None
    try:
        step()
    except Exception as err:  # noqa: BLE001 - the message is what is checked
        error = str(err)
    with open(report, "w") as f:  # the exit barrier fails next: the peer is gone
        json.dump({"seconds": time.monotonic() - started, "error": error}, f)


def test_a_lost_peer_fails_the_gloo_all_reduce_at_once_naming_it(run_cluster, tmp_path):
    import json

    report = tmp_path / "worker0.json"
    runs = run_cluster(
        lost_peer_job, workers=2, args=(str(report),), env=GLOO, timeout=120, check=False
    )
    assert runs["worker:1"].returncode == 0 and runs["worker:1"].value is None
    assert report.exists(), runs["worker:0"].output
    got = json.loads(report.read_text())
    assert got["error"] is not None and "Gloo all-reduce" in got["error"], got
    assert got["seconds"] < 30, got


def horovod_job():
    import numpy as np
    import tensorflow as tf

    import tfdist.horovod.tensorflow as hvd
    from tfdist.horovod.runtime import runtime

    hvd.init()  # TFDIST_COMMUNICATION=gloo
    group = runtime().gloo
    sent = _counted(group)
    r = hvd.rank() + 1
    out = {
        "sum": hvd.allreduce(tf.fill([5], float(r)), op=hvd.Sum).numpy().tolist(),
        "average": hvd.allreduce(tf.fill([3], float(r))).numpy().tolist(),
        "grouped": [
            t.numpy().tolist()
            for t in hvd.grouped_allreduce(
                [tf.constant([r, r], tf.int64), tf.fill([2, 2], float(r))], op=hvd.Sum
            )
        ],
        "max": hvd.allreduce(tf.constant([float(r)]), op=hvd.Max).numpy().tolist(),
    }
    w = tf.Variable(np.ones([4, 1], "float32"))
    x = tf.constant(np.full([2, 4], r, "float32"))
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tf.matmul(x, w))
    tape = hvd.DistributedGradientTape(tape)
    (grad,) = tape.gradient(loss, [w])
    out["gradient"] = grad.numpy().ravel().tolist()  # the mean of 2 * r over the ranks
    out["sent"] = len(sent)
    return out


def test_the_horovod_api_sums_through_gloo(run_cluster):
    runs = run_cluster(horovod_job, workers=2, env=GLOO, timeout=240)
    for run in runs.values():
        got = run.value
        assert got["sum"] == [3.0] * 5
        assert got["average"] == [1.5] * 3
        assert got["grouped"] == [[3, 3], [[3.0, 3.0], [3.0, 3.0]]]
        assert got["max"] == [2.0]  # Max stays on TensorFlow's collectives
        assert got["gradient"] == [3.0] * 4
        assert got["sent"] >= 4, got  # sum, average, grouped (two dtypes), the gradient


def test_a_killed_worker_restarts_the_gloo_job_from_its_backup(tmp_path):
    import io
    import os

    from tfdist.launcher import launch

    from helpers.paths import SCRIPTS

    out = io.StringIO()
    codes = launch(
        os.path.join(SCRIPTS, "train_backup.py"),
        [str(tmp_path), "--kill-worker-1-in-epoch", "2"],
        workers=2,
        max_restarts=1,
        timeout=400,
        out=out,
        extra_env=GLOO,
    )
    text = out.getvalue()
    assert codes == {"worker:0": 0, "worker:1": 0}, text[-3000:]
    assert "Task worker:1 was killed by signal 9" in text
    assert "Restarting the job (1/1) on fresh ports" in text
    epochs = [line.split()[0] for line in (tmp_path / "epochs.log").read_text().splitlines()]
    assert epochs == ["0", "1", "2"]  # every epoch once, across the restart (a new Gloo group)
