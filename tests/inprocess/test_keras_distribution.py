"""Keras 3's own `keras.distribution` on TensorFlow, in this process (4 logical CPUs).

DataParallel trains on a MirroredStrategy over the mesh's devices and equals one-device
training; a ModelParallel that row-shards an Embedding puts each shard on its own device,
trains the same and checkpoints; meshes and layouts TensorFlow cannot carry are refused before
anything changes. Multi-process jobs: tests/cluster/test_keras_distribution_jobs.py.
"""

import numpy as np
import pytest
import tensorflow as tf

from tfdist import flavour

keras = pytest.importorskip("keras")
if flavour.uses_legacy_keras():
    pytest.skip("tf_keras has no keras.distribution", allow_module_level=True)

from tensorflow.python.distribute import sharded_variable  # noqa: E402

distribution_lib = keras.distribution


@pytest.fixture(autouse=True)
def _no_distribution_after():
    yield
    distribution_lib.set_distribution(None)


def _data(n=64, seed=0):
    rng = np.random.RandomState(seed)
    x = rng.rand(n, 4).astype("float32")
    y = (x @ np.array([[1.0], [-2.0], [0.5], [3.0]], "float32")).astype("float32")
    return x, y


def _mlp():
    return keras.Sequential(
        [keras.Input((4,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(1)]
    )


def _train(model, initial, x, y, batch=16, **compile_args):
    model.set_weights(initial)
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse", **compile_args)
    model.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(batch), epochs=2, verbose=0)
    return [np.array(w) for w in model.get_weights()]


def _reference(build, x, y, **compile_args):
    """Weights after training on the default strategy (no distribution), and the initial ones."""
    model = build()
    initial = model.get_weights()
    return initial, _train(model, initial, x, y, **compile_args)


def _close(got, expected):
    for g, e in zip(got, expected):
        np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-6)


def _devices_of(variable):
    return sorted(v.device.rsplit("/", 1)[-1] for v in variable.value.values)


def test_data_parallel_over_two_devices_equals_one_device_training():
    x, y = _data()
    initial, expected = _reference(_mlp, x, y)
    assert keras.distribution.list_devices() == ["cpu:0", "cpu:1", "cpu:2", "cpu:3"]
    data_parallel = distribution_lib.DataParallel(devices=["cpu:0", "cpu:1"])
    distribution_lib.set_distribution(data_parallel)
    assert distribution_lib.distribution() is data_parallel
    model = _mlp()
    assert model.distribute_strategy.num_replicas_in_sync == 2
    assert _devices_of(model.weights[0]) == ["device:CPU:0", "device:CPU:1"]
    _close(_train(model, initial, x, y), expected)


def test_data_parallel_on_every_device_by_default_and_evaluate():
    x, y = _data()
    initial, expected = _reference(_mlp, x, y)
    mesh = distribution_lib.DeviceMesh((4,), ["data"], devices=distribution_lib.list_devices())
    distribution_lib.set_distribution(distribution_lib.DataParallel(device_mesh=mesh))
    model = _mlp()
    assert model.distribute_strategy.num_replicas_in_sync == 4
    _close(_train(model, initial, x, y), expected)
    distribution_lib.set_distribution(None)
    reference = _mlp()
    reference.set_weights(model.get_weights())
    reference.compile(loss="mse")
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(16)
    np.testing.assert_allclose(
        model.evaluate(data, verbose=0), reference.evaluate(data, verbose=0), rtol=1e-5
    )


def _compiled(model, initial):
    model.set_weights(initial)
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
    return model


def _fit(model, x, y):
    model.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(16), epochs=2, verbose=0)
    return [np.array(w) for w in model.get_weights()]


def test_scope_switches_distributions_and_each_model_keeps_its_own():
    x, y = _data()
    initial, expected = _reference(_mlp, x, y)
    first = distribution_lib.DataParallel(devices=["cpu:0", "cpu:1"])
    second = distribution_lib.DataParallel(devices=["cpu:2", "cpu:3"])
    with first.scope():
        model_a = _compiled(_mlp(), initial)
        with second.scope():
            assert distribution_lib.distribution() is second
            model_b = _compiled(_mlp(), initial)
        assert distribution_lib.distribution() is first
    assert distribution_lib.distribution() is None
    plain = _mlp()
    assert not tf.distribute.has_strategy()
    assert not hasattr(plain.weights[0].value, "values")
    assert _devices_of(model_a.weights[0]) == ["device:CPU:0", "device:CPU:1"]
    assert _devices_of(model_b.weights[0]) == ["device:CPU:2", "device:CPU:3"]
    # each trains on the strategy it was built under, after the distribution changed
    _close(_fit(model_b, x, y), expected)
    _close(_fit(model_a, x, y), expected)


def test_a_model_built_under_a_distribution_compiles_outside_it():
    x, y = _data()
    initial, expected = _reference(_mlp, x, y)
    with distribution_lib.DataParallel(devices=["cpu:0", "cpu:1"]).scope():
        model = _mlp()
    model.set_weights(initial)
    model.compile(optimizer="sgd", loss="mse")  # the optimizer is made under the model's strategy
    model.optimizer.learning_rate = 0.05
    assert model.optimizer.iterations.value.__class__.__name__ == "MirroredVariable"
    _close(_fit(model, x, y), expected)


def test_the_same_distribution_reuses_its_strategy_and_clear_session_drops_it():
    distribution_lib.set_distribution(distribution_lib.DataParallel(devices=["cpu:0", "cpu:1"]))
    first = tf.distribute.get_strategy()
    distribution_lib.set_distribution(distribution_lib.DataParallel(devices=["cpu:0", "cpu:1"]))
    assert tf.distribute.get_strategy() is first
    keras.utils.clear_session()
    assert distribution_lib.distribution() is None and not tf.distribute.has_strategy()
    distribution_lib.set_distribution(distribution_lib.DataParallel(devices=["cpu:0", "cpu:1"]))
    assert tf.distribute.get_strategy() is first


def test_mixed_precision_and_steps_per_execution():
    x, y = _data()
    keras.config.set_dtype_policy("mixed_bfloat16")
    try:
        initial, expected = _reference(_mlp, x, y, steps_per_execution=2)
        distribution_lib.set_distribution(distribution_lib.DataParallel(devices=["cpu:0", "cpu:1"]))
        model = _mlp()
        assert model.layers[0].compute_dtype == "bfloat16"
        got = _train(model, initial, x, y, steps_per_execution=2)
        assert int(model.optimizer.iterations.numpy()) == 8
    finally:
        keras.config.set_dtype_policy("float32")
    for g, e in zip(got, expected):  # bfloat16 activations: a sum in another order rounds apart
        np.testing.assert_allclose(g, e, rtol=2e-2, atol=2e-2)


def test_distribute_dataset_in_one_process_returns_the_dataset():
    dataset = tf.data.Dataset.range(8).batch(4)
    data_parallel = distribution_lib.DataParallel(devices=["cpu:0", "cpu:1"])
    if hasattr(data_parallel, "distribute_dataset"):  # Keras 3.3-3.15
        assert data_parallel.distribute_dataset(dataset) is dataset
    else:  # Keras 3.16 shards in the TensorFlow dataset adapter
        from keras.src.trainers.data_adapters.tf_dataset_adapter import TFDatasetAdapter

        assert TFDatasetAdapter(dataset, distribution=data_parallel)._dataset is dataset


def test_a_mesh_of_devices_that_do_not_exist_is_refused_and_nothing_changes():
    with pytest.raises(ValueError, match=r"\['cpu:7'\] that this job does not have.*cpu:3"):
        distribution_lib.set_distribution(distribution_lib.DataParallel(devices=["cpu:0", "cpu:7"]))
    assert distribution_lib.distribution() is None and not tf.distribute.has_strategy()
    with pytest.raises(ValueError, match="more than once"):
        distribution_lib.set_distribution(distribution_lib.DataParallel(devices=["cpu:1", "CPU:1"]))
    with pytest.raises(ValueError, match="not a Keras device name"):
        distribution_lib.set_distribution(distribution_lib.DataParallel(devices=["tpu0"]))


def test_a_distribution_inside_a_strategy_scope_is_refused():
    with tf.distribute.OneDeviceStrategy("/cpu:0").scope():
        with pytest.raises(RuntimeError, match="only one"):
            distribution_lib.set_distribution(distribution_lib.DataParallel(devices=["cpu:0"]))
    assert distribution_lib.distribution() is None


def test_an_unknown_distribution_class_is_refused():
    class Custom(distribution_lib.DataParallel):
        pass

    custom = Custom(devices=["cpu:0"])
    # a subclass of DataParallel is still DataParallel: it runs
    distribution_lib.set_distribution(custom)
    distribution_lib.set_distribution(None)
    from keras.src.distribution.distribution_lib import Distribution

    class Other(Distribution):
        pass

    other = Other(distribution_lib.DeviceMesh((1,), ["batch"], devices=["cpu:0"]))
    with pytest.raises(TypeError, match="DataParallel and ModelParallel"):
        distribution_lib.set_distribution(other)


# ------------------------------------------------------------------ ModelParallel, row shards


def _embedding_model():
    return keras.Sequential(
        [
            keras.Input((3,), dtype="int32"),
            keras.layers.Embedding(10, 4, name="emb"),
            keras.layers.Flatten(),
            keras.layers.Dense(1, name="head"),
        ]
    )


def _ids(n=64, seed=1):
    rng = np.random.RandomState(seed)
    x = rng.randint(0, 10, (n, 3)).astype("int32")
    y = rng.rand(n, 1).astype("float32")
    return x, y


def _model_parallel(layouts, shape=(1, 2), devices=("cpu:0", "cpu:1")):
    mesh = distribution_lib.DeviceMesh(shape, ["batch", "model"], devices=list(devices))
    layout_map = distribution_lib.LayoutMap(mesh)
    for key, axes in layouts.items():
        layout_map[key] = axes
    return distribution_lib.ModelParallel(
        device_mesh=mesh, layout_map=layout_map, batch_dim_name="batch"
    )


def test_row_sharded_embedding_trains_like_one_device_and_checkpoints(tmp_path):
    x, y = _ids()
    initial, expected = _reference(_embedding_model, x, y)
    distribution_lib.set_distribution(
        _model_parallel({".*emb/embeddings": ("model", None), "head/output": ("batch", None)})
    )
    model = _embedding_model()
    table = model.get_layer("emb").embeddings
    assert isinstance(table.value, sharded_variable.ShardedVariable)
    shards = table.value.variables
    assert [s.shape[0] for s in shards] == [5, 5]
    assert [s.device.rsplit("/", 1)[-1] for s in shards] == ["device:CPU:0", "device:CPU:1"]
    assert not isinstance(model.get_layer("head").kernel.value, sharded_variable.ShardedVariable)
    _close(_train(model, initial, x, y), expected)

    trained = [np.array(w) for w in model.get_weights()]
    tf.train.Checkpoint(model=model).write(str(tmp_path / "ckpt"))
    model.save_weights(str(tmp_path / "model.weights.h5"))
    fresh = _embedding_model()  # row-sharded as well
    tf.train.Checkpoint(model=fresh).read(str(tmp_path / "ckpt")).assert_existing_objects_matched()
    _close(fresh.get_weights(), trained)
    distribution_lib.set_distribution(None)
    plain = _embedding_model()  # the checkpoint and the weights file hold the whole table
    tf.train.Checkpoint(model=plain).read(str(tmp_path / "ckpt")).assert_existing_objects_matched()
    _close(plain.get_weights(), trained)
    plain = _embedding_model()
    plain.load_weights(str(tmp_path / "model.weights.h5"))
    _close(plain.get_weights(), trained)


def test_uneven_rows_split_as_tensorflow_partitioners_do():
    distribution_lib.set_distribution(
        _model_parallel({".*emb/embeddings": ("model", None)}, (1, 3), ("cpu:0", "cpu:1", "cpu:3"))
    )
    model = _embedding_model()
    shards = model.get_layer("emb").embeddings.value.variables
    assert [s.shape[0] for s in shards] == [4, 3, 3]
    assert shards[2].device.endswith("CPU:3")


def test_model_parallel_without_sharded_variables_is_data_parallel():
    x, y = _data()
    initial, expected = _reference(_mlp, x, y)
    distribution_lib.set_distribution(
        _model_parallel(
            {".*dense.*/kernel": (None, None)}, (2, 2), ("cpu:0", "cpu:1", "cpu:2", "cpu:3")
        )
    )
    model = _mlp()
    assert model.distribute_strategy.num_replicas_in_sync == 4
    _close(_train(model, initial, x, y), expected)


@pytest.mark.parametrize(
    "layouts, shape, message",
    [
        ({"d1/kernel": (None, "model")}, (1, 2), r"\(None, 'model'\) cannot run on TensorFlow"),
        ({"d1/kernel": ("model", "batch")}, (1, 2), "cannot run on TensorFlow"),
        ({"d1/kernel": ("batch", None)}, (1, 2), "over the batch axis 'batch'"),
        ({"d1/kernel": ("model", None)}, (2, 2), "batch axis 'batch' of size 2"),
    ],
)
def test_layouts_tensorflow_cannot_shard_are_refused_with_the_alternatives(layouts, shape, message):
    devices = ("cpu:0", "cpu:1", "cpu:2", "cpu:3")[: shape[0] * shape[1]]
    with pytest.raises(ValueError, match=message) as raised:
        distribution_lib.set_distribution(_model_parallel(layouts, shape, devices))
    assert "parameter_server" in str(raised.value)
    assert distribution_lib.distribution() is None


def test_a_model_built_before_the_distribution_is_refused_not_trained_on_one_device():
    x, y = _data()
    model = _mlp()
    model.compile(optimizer="sgd", loss="mse")
    distribution_lib.set_distribution(distribution_lib.DataParallel(devices=["cpu:0", "cpu:1"]))
    with pytest.raises(ValueError, match="'sequential.*' was built before .*set_distribution"):
        model.fit(x, y, batch_size=16, verbose=0)
    distribution_lib.set_distribution(None)
    model.fit(x, y, batch_size=16, verbose=0)  # on one device, as it was built
