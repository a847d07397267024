"""Keras' TensorBoard callback under mirrored writes what one device writes for the same
training: the event files read back. Multi-process jobs: tests/cluster/test_tensorboard_jobs.py."""

import numpy as np
import pytest

import tfdist

from helpers.tensorboard_events import event_files, scalars

X = np.random.RandomState(0).rand(64 * 5, 4).astype("float32")
Y = X @ np.arange(1, 5, dtype="float32")[:, None] / 4


def _fit_logged(log_dir, strategy=None):
    keras = tfdist.flavour.keras()

    def build():
        keras.utils.set_random_seed(1)
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        model.compile(keras.optimizers.SGD(0.05), "mse", metrics=["mae"])
        return model

    if strategy is None:
        model = build()
    else:
        with strategy.scope():
            model = build()
    return model.fit(
        X, Y, batch_size=64, epochs=3, shuffle=False, verbose=0,
        validation_data=(X[:64], Y[:64]),
        callbacks=[keras.callbacks.TensorBoard(str(log_dir))],
    ).history  # fmt: skip


def test_mirrored_logs_the_scalars_one_device_logs(tmp_path, virtual_cpus):
    pytest.importorskip("tensorboard")  # the `tensorboard` extra of tfdist
    mirrored = _fit_logged(tmp_path / "mirrored", tfdist.make_strategy("mirrored"))
    one = _fit_logged(tmp_path / "one")
    for run in ("train", "validation"):
        (logged,) = event_files(tmp_path / "mirrored", run)
        (reference,) = event_files(tmp_path / "one", run)
        logged, reference = scalars(logged), scalars(reference)
        assert set(logged) == set(reference) and "epoch_loss" in logged, (logged, reference)
        for tag, values in reference.items():
            assert np.allclose(logged[tag], values, rtol=1e-5), (run, tag, logged[tag], values)
    assert np.allclose(
        mirrored["loss"], scalars(event_files(tmp_path / "mirrored")[0])["epoch_loss"]
    )
    assert np.allclose(mirrored["loss"], one["loss"], rtol=1e-5)
