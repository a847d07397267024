"""The backup files and the stop agreement of one process, with real TensorFlow checkpoints."""

import json
import os

import numpy as np
import pytest

import tfdist
from tfdist.preemption.agreement import Agreement
from tfdist.preemption.backup import STATE_FILE, BackupStore


def _checkpoint(value):
    import tensorflow as tf

    variable = tf.Variable(value)
    return variable, tf.train.Checkpoint(v=variable)


def test_the_chief_keeps_the_newest_two_checkpoints_and_a_state_that_points_to_them(tmp_path):
    store = BackupStore(str(tmp_path / "backup"), is_chief=True)
    assert store.latest() is None
    variable, checkpoint = _checkpoint(1.0)
    store.save(checkpoint, {"epoch": 0, "step": 3})
    variable.assign(2.0)
    store.save(checkpoint, {"epoch": 1, "step": 0})
    assert sorted(os.listdir(tmp_path / "backup")) == [
        "ckpt-1.data-00000-of-00001",
        "ckpt-1.index",
        "ckpt-2.data-00000-of-00001",
        "ckpt-2.index",
        STATE_FILE,
    ]
    state = store.latest()
    assert (state["epoch"], state["step"], state["saves"]) == (1, 0, 2)
    assert [s["step"] for s in store.states()] == [0, 3]  # the newest, then the one before
    variable.assign(0.0)
    checkpoint.read(state["checkpoint"]).assert_consumed()
    assert variable.numpy() == 2.0
    store.delete()
    assert not os.path.exists(tmp_path / "backup")


def test_a_save_cut_short_leaves_the_previous_backup_whole(tmp_path, monkeypatch):
    store = BackupStore(str(tmp_path), is_chief=True)
    variable, checkpoint = _checkpoint(1.0)
    store.save(checkpoint, {"epoch": 0, "step": 5})
    variable.assign(9.0)

    def killed(*args, **kwargs):
        raise KeyboardInterrupt  # the task dies between the checkpoint and the state

    import tensorflow as tf

    monkeypatch.setattr(tf.io.gfile, "rename", killed)
    with pytest.raises(KeyboardInterrupt):
        store.save(checkpoint, {"epoch": 0, "step": 9})
    monkeypatch.undo()
    state = store.latest()
    assert state["step"] == 5
    checkpoint.read(state["checkpoint"]).assert_consumed()
    assert variable.numpy() == 1.0


def test_other_workers_write_only_a_scratch_copy_that_is_removed(tmp_path, monkeypatch):
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setenv("TMPDIR", str(scratch))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)  # read TMPDIR again
    _, checkpoint = _checkpoint(1.0)
    BackupStore(str(tmp_path / "backup"), is_chief=False).save(checkpoint, {"epoch": 0})
    assert not os.path.exists(tmp_path / "backup")
    assert os.listdir(scratch) == []


def test_one_process_stops_after_the_step_that_was_running_when_the_signal_came():
    agreement = Agreement(worker=0, num_workers=1)
    try:
        assert not agreement.at_boundary(1) and not agreement.at_boundary(2)
        agreement.notice()
        agreement.notice()  # the watchdog thread and the main thread both report it
        assert agreement.at_boundary(3)
        assert agreement.stop_after == 3 and agreement.claimed_by == 0
    finally:
        agreement.close()


def test_fit_saves_every_n_steps_and_the_state_says_where(tmp_path, virtual_cpus):
    keras = tfdist.flavour.keras()
    strategy = tfdist.make_strategy("mirrored")
    x = np.arange(64 * 4, dtype="float32").reshape(64, 4) / 256
    y = x.sum(axis=1, keepdims=True)
    with strategy.scope():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse")
    import tensorflow as tf

    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(8)  # 8 steps an epoch
    backup = str(tmp_path / "backup")
    callback = tfdist.BackupAndRestore(backup, save_freq=3, delete_checkpoint=False)
    assert isinstance(callback, tfdist.BackupAndRestore)
    assert isinstance(callback, keras.callbacks.Callback)
    model.fit(data, epochs=2, verbose=0, callbacks=[callback])
    with open(os.path.join(backup, STATE_FILE)) as f:
        state = json.load(f)
    # saves after steps 3, 6, 9, 12 and 15 of 16: the last in epoch 2 (index 1), step 7
    assert (state["epoch"], state["step"], state["iterations"], state["saves"]) == (1, 7, 15, 5)
    assert state["position"] == 7 and state["reason"] == "steps"


def test_a_fit_that_fails_in_a_step_leaves_sigterm_as_it_was(tmp_path, virtual_cpus):
    import tensorflow as tf

    from tfdist import signals

    keras = tfdist.flavour.keras()
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")

    def broken(x, y):  # the third batch cannot be read
        tf.debugging.assert_less(tf.reduce_min(x), 2.0, message="a broken record")
        return x, y

    x = np.repeat(np.arange(6, dtype="float32"), 4).reshape(24, 1).repeat(4, axis=1)
    data = tf.data.Dataset.from_tensor_slices((x, x[:, :1])).batch(4).map(broken)
    with pytest.raises(tf.errors.InvalidArgumentError, match="a broken record"):
        model.fit(data, verbose=0, callbacks=[tfdist.BackupAndRestore(str(tmp_path / "b"))])
    assert signals._LISTENERS == []  # SIGTERM ends the process again
    assert getattr(model.train_function, "__self__", None) is None  # Keras' own function


def test_steps_skipped_on_resume_are_not_counted_for_save_freq(tmp_path, virtual_cpus):
    """A save among the skipped steps would pair the restored weights with an earlier step."""
    import tensorflow as tf

    keras = tfdist.flavour.keras()
    x = np.arange(64 * 4, dtype="float32").reshape(64, 4) / 256
    data = tf.data.Dataset.from_tensor_slices((x, x.sum(axis=1, keepdims=True))).batch(8)
    backup = str(tmp_path / "backup")

    def fit(epochs):
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse")
        callback = tfdist.BackupAndRestore(backup, save_freq=3, delete_checkpoint=False)
        model.fit(data, epochs=epochs, verbose=0, callbacks=[callback])
        with open(os.path.join(backup, STATE_FILE)) as f:
            return json.load(f)

    # a first run stops after epoch 1 of 8 steps: its last save was after step 6
    assert fit(1)["step"] == 6
    # resumed at step 7 (6 skipped), the next saves come after 3 trained steps: 9, 12, 15
    state = fit(2)
    assert (state["epoch"], state["step"], state["iterations"]) == (1, 7, 15)
    assert state["saves"] == 2 + 3  # 2 in the first run, 3 after the resume


def test_a_program_with_its_own_sigterm_handler_is_told_there_is_no_save(tmp_path, virtual_cpus):
    import signal

    keras = tfdist.flavour.keras()
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: None)
    try:
        with pytest.warns(RuntimeWarning, match="SIGTERM handler of its own"):
            model.fit(
                np.zeros((8, 4)),
                np.zeros((8, 1)),
                verbose=0,
                callbacks=[tfdist.BackupAndRestore(str(tmp_path / "b"))],
            )
    finally:
        signal.signal(signal.SIGTERM, previous)
