"""tfdist's Horovod API in a job of one process (real TensorFlow and Keras, no peers): what a
collective returns there, DistributedOptimizer's class and accumulation, the callbacks' errors,
and a clear error for each bad input or unsupported feature."""

import numpy as np
import pytest
import tensorflow as tf

import tfdist.horovod.tensorflow as hvd
import tfdist.horovod.tensorflow.keras as hvdk
from tfdist import flavour
from tfdist.horovod import runtime
from tfdist.horovod.unsupported import Unsupported

keras = flavour.keras()


@pytest.fixture(autouse=True)
def initialized():
    hvd.init()
    yield


def test_before_init_every_query_says_to_call_init(monkeypatch):
    monkeypatch.setattr(runtime, "_RUNTIME", None)
    assert not hvd.is_initialized()
    with pytest.raises(ValueError, match=r"Horovod has not been initialized; use hvd.init\(\)"):
        hvd.rank()


def test_one_process_collectives_return_their_input_scaled():
    assert (hvd.size(), hvd.rank(), hvd.local_size(), hvd.cross_size()) == (1, 0, 1, 1)
    x = tf.constant([1.0, 2.0])
    np.testing.assert_array_equal(hvd.allreduce(x), [1.0, 2.0])
    np.testing.assert_array_equal(hvd.allreduce(x, op=hvd.Sum, postscale_factor=3.0), [3.0, 6.0])
    np.testing.assert_array_equal(hvd.allgather(tf.reshape(x, [2, 1])), [[1.0], [2.0]])
    np.testing.assert_array_equal(hvd.broadcast(x, root_rank=0), [1.0, 2.0])
    assert hvd.broadcast_object({"a": 1}) == {"a": 1}
    np.testing.assert_array_equal(hvd.alltoall(tf.range(3)), [0, 1, 2])
    received, splits = hvd.alltoall(tf.range(3), splits=[3])
    np.testing.assert_array_equal(received, [0, 1, 2])
    np.testing.assert_array_equal(splits, [3])
    assert int(hvd.join()) == 0
    assert hvd.payload_bytes() == 0
    assert int(hvd.size_op()) == 1


def test_bad_arguments_are_named():
    x = tf.constant([1.0])
    with pytest.raises(ValueError, match=r"root_rank must be a rank of this job, 0 to 0.*=1"):
        hvd.broadcast(x, root_rank=1)
    with pytest.raises(ValueError, match=r"rank 1 or more; received a scalar"):
        hvd.allgather(tf.constant(1.0))
    with pytest.raises(ValueError, match=r"op= or average=, not both"):
        hvd.allreduce(x, op=hvd.Sum, average=True)
    with pytest.raises(ValueError, match=r"op must be one of"):
        hvd.allreduce(x, op="mean")
    with pytest.raises(TypeError, match=r"compression must be a Compressor"):
        hvd.allreduce(x, compression="fp16")
    with pytest.raises(TypeError, match=r"wraps a tf.GradientTape"):
        hvd.DistributedGradientTape(object())
    with pytest.raises(ValueError, match=r"gradient_predivide_factor=2.0 needs op=hvd.Average"):
        hvd.DistributedGradientTape(tf.GradientTape(), op=hvd.Sum, gradient_predivide_factor=2.0)


def test_unsupported_features_raise_naming_the_alternative():
    with pytest.raises(Unsupported, match=r"op=hvd.Adasum.*HINT: use op=hvd.Average"):
        hvd.allreduce(tf.constant([1.0]), op=hvd.Adasum)
    with pytest.raises(Unsupported, match=r"process sets"):
        hvd.ProcessSet([0])
    with pytest.raises(Unsupported, match=r"process sets"):
        hvd.init(process_sets=[[0]])
    with pytest.raises(Unsupported, match=r"MPI|init\(comm"):
        hvd.init(comm=[0])
    with pytest.raises(Unsupported, match=r"timeline.*profiler"):
        hvd.start_timeline("t.json")
    with pytest.raises(Unsupported, match=r"elastic.*--workers MIN:MAX"):
        hvd.elastic.run()
    with pytest.raises(RuntimeError, match=r"BroadcastGlobalVariablesCallback"):
        hvdk.broadcast_global_variables(0)


def _model():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    return model


def test_distributed_optimizer_keeps_the_class_name_module_and_config():
    sgd = keras.optimizers.SGD(learning_rate=0.1, momentum=0.9)
    opt = hvdk.DistributedOptimizer(sgd)
    assert type(opt).__name__ == "SGD" and isinstance(opt, type(sgd))
    assert type(opt).__module__ == type(sgd).__module__
    assert opt.get_config() == sgd.get_config()
    assert opt is not sgd
    with pytest.raises(ValueError, match=r"already a DistributedOptimizer"):
        hvdk.DistributedOptimizer(opt)
    with pytest.raises(TypeError, match=r"wraps a Keras optimizer.*DistributedGradientTape"):
        hvdk.DistributedOptimizer(tf.compat.v1.train.GradientDescentOptimizer(0.1))
    with pytest.raises(ValueError, match=r"backward_passes_per_step must be a whole number"):
        hvdk.DistributedOptimizer(sgd, backward_passes_per_step=0)


def test_backward_passes_apply_the_average_every_nth_step():
    model = _model()
    kernel = model.trainable_variables[0]
    start = kernel.numpy()
    opt = hvdk.DistributedOptimizer(
        keras.optimizers.SGD(0.5), backward_passes_per_step=2, average_aggregated_gradients=True
    )
    g1 = [tf.ones_like(v) for v in model.trainable_variables]
    g2 = [3.0 * tf.ones_like(v) for v in model.trainable_variables]
    opt.apply_gradients(zip(g1, model.trainable_variables))
    np.testing.assert_array_equal(kernel.numpy(), start)  # accumulated, not applied
    assert int(opt.iterations.numpy()) == 0
    opt.apply_gradients(zip(g2, model.trainable_variables))
    np.testing.assert_allclose(kernel.numpy(), start - 0.5 * 2.0)  # the mean of 1 and 3
    assert int(opt.iterations.numpy()) == 1


def test_backward_passes_inside_fit():
    model = _model()
    opt = hvdk.DistributedOptimizer(keras.optimizers.SGD(0.1), backward_passes_per_step=3)
    model.compile(optimizer=opt, loss="mse")
    x, y = np.ones((12, 3), "float32"), np.zeros((12, 2), "float32")
    model.fit(x, y, batch_size=2, epochs=1, verbose=0)
    assert int(opt.iterations.numpy()) == 2


def test_learning_rate_callbacks_refuse_a_schedule():
    model = _model()
    schedule = keras.optimizers.schedules.ExponentialDecay(0.1, 10, 0.9)
    model.compile(optimizer=keras.optimizers.SGD(schedule), loss="mse")
    callback = hvdk.callbacks.LearningRateWarmupCallback(initial_lr=0.1, warmup_epochs=1)
    x, y = np.ones((4, 3), "float32"), np.zeros((4, 2), "float32")
    with pytest.raises(ValueError, match=r"has a schedule or none.*float learning rate"):
        model.fit(x, y, epochs=1, verbose=0, callbacks=[callback])
    with pytest.raises(ValueError, match=r"initial_lr is required"):
        hvdk.callbacks.LearningRateScheduleCallback(initial_lr=None, multiplier=0.5)


def test_schedule_callback_sets_the_rate_per_epoch():
    model = _model()
    model.compile(optimizer=hvdk.DistributedOptimizer(keras.optimizers.SGD(1.0)), loss="mse")
    callback = hvdk.callbacks.LearningRateScheduleCallback(initial_lr=0.2, multiplier=0.5)
    x, y = np.ones((4, 3), "float32"), np.zeros((4, 2), "float32")
    history = model.fit(x, y, epochs=3, batch_size=2, verbose=0, callbacks=[callback])
    np.testing.assert_allclose(history.history["lr"], [0.2, 0.1, 0.05], rtol=1e-6)


def test_load_model_restores_the_optimizer_state_as_a_distributed_one(tmp_path):
    model = _model()
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    x, y = np.ones((4, 3), "float32"), np.zeros((4, 2), "float32")
    model.fit(x, y, epochs=1, batch_size=2, verbose=0)
    path = str(tmp_path / "model.keras")
    model.save(path)
    loaded = hvdk.load_model(path)
    assert type(loaded.optimizer).__name__ == "Adam"
    assert getattr(type(loaded.optimizer), "_tfdist_distributed", False)
    assert int(loaded.optimizer.iterations.numpy()) == 2
    loaded.fit(x, y, epochs=1, batch_size=2, verbose=0)
    assert int(loaded.optimizer.iterations.numpy()) == 4
