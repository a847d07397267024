"""tfdist.BackupAndRestore never restores a wrong backup in silence, never fails with a raw
TensorFlow error, and never loses what it saved: real model.fit runs, real checkpoints in
tmp_path, and the files damaged as a full disk, a foreign model or a hand edit leaves them.

The backup directory keeps the newest two checkpoints, so that a damaged newest one falls back
to the one before (tfdist.preemption.backup).
"""

import glob
import json
import os
import shutil
import warnings

import numpy as np
import pytest

import tfdist
from tfdist import training_report
from tfdist.preemption.backup import STATE_FILE, BackupStore

X = np.arange(32 * 4, dtype="float32").reshape(32, 4) / 128  # 4 steps an epoch of 8
Y = X[:, ::-1].copy()


def _model(layers=1, strategy=None):
    """Dense(4) layers on 4 features: one more or one fewer layer changes no shape."""
    keras = tfdist.flavour.keras()

    def build():
        model = keras.Sequential(
            [keras.Input((4,))] + [keras.layers.Dense(4) for _ in range(layers)]
        )
        model.compile(optimizer=keras.optimizers.SGD(0.01, momentum=0.5), loss="mse")
        return model

    if strategy is None:
        return build()
    with strategy.scope():
        return build()


def _fit(model, backup, epochs=2, seen=None, **kwargs):
    """fit with a backup kept at the end; `seen` gets optimizer.iterations after the restore."""
    keras = tfdist.flavour.keras()
    kwargs.setdefault("delete_checkpoint", False)
    callbacks = [tfdist.BackupAndRestore(backup, **kwargs)]
    if seen is not None:
        callbacks.append(
            keras.callbacks.LambdaCallback(
                on_train_begin=lambda logs: seen.append(int(model.optimizer.iterations.numpy()))
            )
        )
    return model.fit(X, Y, batch_size=8, epochs=epochs, verbose=0, callbacks=callbacks)


def _state(backup):
    with open(os.path.join(backup, STATE_FILE)) as f:
        return json.load(f)


def _write_state(backup, state):
    with open(os.path.join(backup, STATE_FILE), "w") as f:
        json.dump(state, f)


@pytest.fixture(scope="module")
def two_backups(tmp_path_factory):
    """A backup directory of a fit of 2 epochs of 4 steps saving every 3 steps: the newest
    checkpoint after step 6 (epoch 1, step 2), the one before after step 3."""
    backup = str(tmp_path_factory.mktemp("two") / "backup")
    _fit(_model(), backup, save_freq=3)
    return backup


@pytest.fixture
def backup(two_backups, tmp_path):
    """A copy of `two_backups` of this test's own."""
    copy = str(tmp_path / "backup")
    shutil.copytree(two_backups, copy)
    return copy


def _checkpoint_path(backup, state):
    return os.path.join(backup, state["checkpoint"])


# ------------------------------------------------------------------ 1. another model


@pytest.mark.parametrize("written, restored", [(1, 2), (2, 1)], ids=["one-more", "one-fewer"])
def test_a_backup_of_a_model_with_one_more_or_one_fewer_layer_is_refused(
    tmp_path, virtual_cpus, written, restored, monkeypatch
):
    strategy = tfdist.make_strategy("mirrored")
    backup = str(tmp_path / "backup")
    _fit(_model(written, strategy), backup, epochs=1, save_freq=3)
    newest = _checkpoint_path(backup, _state(backup))
    report = tmp_path / "report.json"  # as under tfdist launch: the refusal reaches it
    monkeypatch.setenv("TFDIST_REPORT_FILE", str(report))
    monkeypatch.setattr(training_report, "_TOTALS", dict(training_report._TOTALS))
    with pytest.raises(ValueError) as caught:
        _fit(_model(restored, strategy), backup, epochs=1)
    assert training_report.read(str(report))["not_restartable"] == (
        f"the backup in {backup} was refused"
    )
    message = str(caught.value)
    assert "does not fit this model" in message and "HINT" in message, message
    assert newest in message, message
    if restored > written:  # the model's second layer has no values in the backup
        assert "lacks" in message and "kernel" in message, message
    else:  # the backup's second layer is no layer of the model
        assert "holds" in message and "kernel" in message, message
    assert "resumes" not in message


def test_the_same_model_under_mirrored_restores_every_variable(tmp_path, virtual_cpus):
    """The check refuses nothing that fits: tf_keras' optimizer makes its momentum variables
    at its first step, so they are made before the restore, which then fills them."""
    keras = tfdist.flavour.keras()
    strategy = tfdist.make_strategy("mirrored")
    backup = str(tmp_path / "backup")
    _fit(_model(strategy=strategy), backup, epochs=1, save_freq=3)
    model, momentums = _model(strategy=strategy), []

    def at_start(logs):
        momentums.extend(v.numpy() for v in model.optimizer.variables if len(v.shape))

    fit = model.fit(
        X,
        Y,
        batch_size=8,
        epochs=1,
        verbose=0,
        callbacks=[
            tfdist.BackupAndRestore(backup),
            keras.callbacks.LambdaCallback(on_train_begin=at_start),
        ],
    )
    assert len(fit.history["loss"]) == 1 and int(model.optimizer.iterations.numpy()) == 4
    assert len(momentums) == 2 and all(np.abs(m).sum() > 0 for m in momentums), momentums


# --------------------------------------------------------------- 2., 3. the state file


def test_a_state_file_of_random_bytes_is_refused_with_its_name(backup):
    with open(os.path.join(backup, STATE_FILE), "wb") as f:
        f.write(b"\xff\xfe\x00\x81 not a state \x80\x9f")
    with pytest.raises(ValueError) as caught:
        _fit(_model(), backup)
    assert not isinstance(caught.value, UnicodeDecodeError), repr(caught.value)
    message = str(caught.value)
    assert os.path.join(backup, STATE_FILE) in message and "HINT" in message, message


@pytest.mark.parametrize(
    "changes, quoted",
    [
        ({"epoch": 99, "step": -3}, None),  # the probe's: either value is named
        ({"step": -3}, "step=-3"),
        ({"epoch": 5, "step": 0}, "epoch=5"),  # past the fit's epochs=2
        ({"epoch": 2, "step": 1}, "epoch=2, step=1"),  # a step after the last epoch's end
        ({"epoch": True}, "epoch=True"),
        ({"step": 1.5}, "step=1.5"),
        ({"epoch": "0"}, "epoch='0'"),
        ({"position": -1}, "position=-1"),
        ({"iterations": -6}, "iterations=-6"),
    ],
    ids=lambda v: json.dumps(v) if isinstance(v, dict) else None,
)
def test_a_state_that_is_no_step_of_this_training_is_refused(backup, changes, quoted):
    _write_state(backup, dict(_state(backup), **changes))
    model = _model()
    with pytest.raises(ValueError) as caught:
        _fit(model, backup)
    message = str(caught.value)
    assert os.path.join(backup, STATE_FILE) in message and "HINT" in message, message
    if quoted is None:
        assert "epoch=99" in message or "step=-3" in message, message
    else:
        assert quoted in message, message
    assert int(model.optimizer.iterations.numpy()) == 0  # nothing trained


def test_the_backup_of_a_finished_training_kept_restores_with_nothing_left(backup, capfd):
    """delete_checkpoint=False keeps the backup of the last epoch's end (epoch == epochs,
    step 0): fit again restores it and trains nothing, as Keras' own callback does, and says
    so."""
    _fit(_model(), backup)  # trains on from step 6 to the end of epoch 2, and keeps that
    assert (_state(backup)["epoch"], _state(backup)["step"]) == (2, 0)
    model, seen = _model(), []
    history = _fit(model, backup, seen=seen)
    assert seen == [8] and history.history == {}
    assert "that training finished its 2 epochs, none is left" in capfd.readouterr().err


# ------------------------------------------------------- 4. a damaged newest checkpoint


def _data_file(prefix):
    (data,) = glob.glob(prefix + ".data-*")
    return data


def _truncate(prefix):
    data = _data_file(prefix)
    with open(data, "r+b") as f:
        f.truncate(os.path.getsize(data) // 2)  # the disk filled up during the save


def _garbage(prefix):
    data = _data_file(prefix)
    size = os.path.getsize(data)
    with open(data, "wb") as f:
        f.write(np.random.default_rng(0).bytes(size))


def _no_index(prefix):
    os.remove(prefix + ".index")


DAMAGES = {"data-truncated": _truncate, "data-garbage": _garbage, "index-missing": _no_index}


def _tfdist_warnings(caught):
    return [w for w in caught if "tfdist" in str(w.message) and "backup" in str(w.message)]


@pytest.mark.parametrize("damage", list(DAMAGES))
def test_a_damaged_newest_backup_falls_back_to_the_previous_with_one_warning(backup, damage):
    state = _state(backup)
    assert state["iterations"] == 6 and state["previous"]["iterations"] == 3, state
    newest = _checkpoint_path(backup, state)
    DAMAGES[damage](newest)
    model, seen = _model(), []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _fit(model, backup, seen=seen)
    ours = _tfdist_warnings(caught)
    assert len(ours) == 1, [str(w.message) for w in caught]
    assert os.path.basename(newest) in str(ours[0].message), str(ours[0].message)
    assert seen == [3]  # the previous backup's optimizer step, and the steps after it
    assert int(model.optimizer.iterations.numpy()) == 8
    # the next saves wrote checkpoints of new names; the damaged one is gone
    assert glob.glob(newest + ".*") == [] and os.path.exists(newest + "_temp") is False


@pytest.mark.parametrize("damage", list(DAMAGES))
def test_when_every_backup_is_damaged_fit_is_refused_naming_the_directory(backup, damage):
    state = _state(backup)
    kept = [state] + ([state["previous"]] if "previous" in state else [])
    for entry in kept:
        DAMAGES[damage](_checkpoint_path(backup, entry))
    model = _model()
    with pytest.raises(ValueError) as caught:
        _fit(model, backup)
    message = str(caught.value)
    assert backup in message and "HINT" in message and "scratch" in message, message
    assert "does not fit" not in message, message  # damaged, not another model's
    for entry in kept:
        assert entry["checkpoint"] in message, message
    assert int(model.optimizer.iterations.numpy()) == 0


def test_a_directory_of_the_earlier_format_still_restores(backup):
    """One checkpoint and one state, format 1: what tfdist wrote before it kept two."""
    state = _state(backup)
    for path in glob.glob(_checkpoint_path(backup, state["previous"]) + ".*"):
        os.remove(path)
    old = {k: v for k, v in state.items() if k != "previous"}
    _write_state(backup, dict(old, format=1))
    seen = []
    _fit(_model(), backup, seen=seen)
    assert seen == [6]


def test_checkpoints_that_no_state_file_lists_are_named_before_training_from_scratch(backup):
    """A first save cut short, or a state file removed: no silent start from scratch."""
    os.remove(os.path.join(backup, STATE_FILE))
    model = _model()
    with pytest.warns(RuntimeWarning, match="ckpt-1.index, ckpt-2.index") as caught:
        _fit(model, backup, epochs=1)
    assert STATE_FILE in str(caught[0].message) and "HINT" in str(caught[0].message)
    assert int(model.optimizer.iterations.numpy()) == 4  # from scratch
    assert _state(backup)["checkpoint"] == "ckpt-3" and glob.glob(backup + "/ckpt-1.*") == []


# ---------------------------------------------------------------- the store's own files


def _checkpoint(value):
    import tensorflow as tf

    variable = tf.Variable(value)
    return variable, tf.train.Checkpoint(v=variable)


def test_the_store_keeps_the_newest_two_checkpoints_and_the_state_lists_both(tmp_path):
    store = BackupStore(str(tmp_path / "backup"), is_chief=True)
    variable, checkpoint = _checkpoint(1.0)
    for value, step in ((1.0, 1), (2.0, 2), (3.0, 3)):
        variable.assign(value)
        store.save(checkpoint, {"epoch": 0, "step": step})
    assert sorted(os.listdir(tmp_path / "backup")) == [
        "ckpt-2.data-00000-of-00001",
        "ckpt-2.index",
        "ckpt-3.data-00000-of-00001",
        "ckpt-3.index",
        STATE_FILE,
    ]
    states = store.states()
    assert [(s["step"], os.path.basename(s["checkpoint"])) for s in states] == [
        (3, "ckpt-3"),
        (2, "ckpt-2"),
    ]
    for state, value in zip(states, (3.0, 2.0)):
        variable.assign(0.0)
        checkpoint.read(state["checkpoint"]).assert_consumed()
        assert variable.numpy() == value


@pytest.mark.parametrize("at", ["checkpoint", "state", "rename", "cleanup"])
def test_a_task_killed_at_any_point_of_a_save_leaves_a_whole_backup(tmp_path, monkeypatch, at):
    import tensorflow as tf

    directory = str(tmp_path / "backup")
    store = BackupStore(directory, is_chief=True)
    variable, checkpoint = _checkpoint(1.0)
    store.save(checkpoint, {"epoch": 0, "step": 1})
    variable.assign(2.0)
    store.save(checkpoint, {"epoch": 0, "step": 2})
    variable.assign(3.0)

    def killed(*args, **kwargs):
        raise KeyboardInterrupt

    if at == "checkpoint":  # killed while the data is half written
        write = type(checkpoint).write

        def half(self, prefix, *args, **kwargs):
            path = write(self, prefix, *args, **kwargs)
            _truncate(path)
            os.remove(path + ".index")
            raise KeyboardInterrupt

        monkeypatch.setattr(type(checkpoint), "write", half)
    elif at == "state":
        monkeypatch.setattr(tf.io.gfile, "GFile", killed)
    elif at == "rename":
        monkeypatch.setattr(tf.io.gfile, "rename", killed)
    else:
        monkeypatch.setattr(tf.io.gfile, "remove", killed)
    with pytest.raises(KeyboardInterrupt):
        store.save(checkpoint, {"epoch": 0, "step": 3})
    monkeypatch.undo()
    variable.assign(0.0)
    state = BackupStore(directory, is_chief=True).restore(checkpoint, store.states())
    assert (state["step"], variable.numpy()) in ((2, 2.0), (3, 3.0))


def test_delete_removes_every_checkpoint_kept_and_left(tmp_path, monkeypatch):
    import tensorflow as tf

    directory = str(tmp_path / "backup")
    store = BackupStore(directory, is_chief=True)
    _, checkpoint = _checkpoint(1.0)
    store.save(checkpoint, {"epoch": 0, "step": 1})
    store.save(checkpoint, {"epoch": 0, "step": 2})

    def killed(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(tf.io.gfile, "remove", killed)  # killed while removing the oldest
    with pytest.raises(KeyboardInterrupt):
        store.save(checkpoint, {"epoch": 0, "step": 3})
    monkeypatch.undo()
    BackupStore(directory, is_chief=True).delete()
    assert not os.path.exists(directory)


def test_a_finished_fit_leaves_no_backup_behind(tmp_path):
    backup = str(tmp_path / "backup")
    _fit(_model(), backup, save_freq=1, delete_checkpoint=True)
    assert not os.path.exists(backup)


# ------------------------------------------------------------------- 5. the file system


@pytest.mark.parametrize("where", ["a-file", "under-a-file", "not-writable"])
def test_a_backup_dir_that_cannot_be_written_is_refused_before_training(tmp_path, where):
    if where == "a-file":  # made a file after the callback was made
        backup = str(tmp_path / "backup")
        make = lambda: (tmp_path / "backup").write_text("a file")  # noqa: E731
    elif where == "under-a-file":
        (tmp_path / "file").write_text("a file")
        backup, make = str(tmp_path / "file" / "backup"), lambda: None
    elif os.geteuid() == 0:  # root writes any directory it may chmod: /proc it cannot
        if not os.path.isdir("/proc/self"):
            pytest.skip("no /proc: no directory root cannot write")
        backup, make = "/proc/self/tfdist-backup", lambda: None
    else:
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o555)
        backup, make = str(locked / "backup"), lambda: None
    model = _model()
    callback = tfdist.BackupAndRestore(backup)
    make()
    with pytest.raises((ValueError, OSError)) as caught:
        model.fit(X, Y, batch_size=8, epochs=1, verbose=0, callbacks=[callback])
    message = str(caught.value)
    assert backup in message and "HINT" in message, message
    assert int(model.optimizer.iterations.numpy()) == 0  # refused before training


def test_a_save_that_fails_mid_training_keeps_the_previous_backup_and_names_the_cause(
    tmp_path, monkeypatch
):
    import tensorflow as tf

    from tfdist import signals

    backup = str(tmp_path / "backup")
    write, calls = tf.train.Checkpoint.write, []

    def full_disk(self, prefix, *args, **kwargs):
        calls.append(prefix)
        if len(calls) < 2:
            return write(self, prefix, *args, **kwargs)
        os.makedirs(prefix + "_temp")  # what TensorFlow leaves when its write fails
        with open(os.path.join(prefix + "_temp", "part-00000-of-00001.data"), "wb") as f:
            f.write(b"\0" * 100)
        raise tf.errors.ResourceExhaustedError(
            None, None, f"{prefix}_temp/part-00000-of-00001.data; No space left on device"
        )

    monkeypatch.setattr(tf.train.Checkpoint, "write", full_disk)
    with pytest.raises(OSError) as caught:
        _fit(_model(), backup, epochs=1, save_freq=1)
    monkeypatch.undo()
    message = str(caught.value)
    assert backup in message and "No space left on device" in message, message
    assert "HINT" in message, message
    assert signals._LISTENERS == []  # SIGTERM ends the process again
    # the backup of step 1 is whole, and nothing of the failed save is left
    assert sorted(os.listdir(backup)) == [
        "ckpt-1.data-00000-of-00001",
        "ckpt-1.index",
        STATE_FILE,
    ]
    seen = []
    _fit(_model(), backup, epochs=1, seen=seen)
    assert seen == [1]


def test_the_savers_retracing_warning_is_unsaid_and_others_are_not(caplog):
    """A checkpoint of variables on several tasks (parameter servers) builds a new tf.function
    at each save, and TensorFlow warns of retracing from the fifth backup on."""
    import logging

    from tfdist.preemption import backup

    logger = logging.getLogger("tensorflow")
    saver = (
        "6 out of the last 6 calls to <function MultiDeviceSaver.save.<locals>.tf_function_save "
        "at 0x7f> triggered tf.function retracing. Tracing is expensive"
    )
    with caplog.at_level(logging.WARNING, logger="tensorflow"):
        with backup._saver_retracing_unsaid():
            logger.warning(saver)
            logger.warning("5 out of the last 5 calls to <function step> triggered retracing")
        logger.warning(saver)
    said = [r.getMessage() for r in caplog.records]
    assert said == ["5 out of the last 5 calls to <function step> triggered retracing", saver]
