"""Which callbacks make fit and evaluate keep one step per call (tfdist/fixes/executions.py)."""

import pytest

from tfdist import flavour
from tfdist.fixes.executions import MAX_STEPS_PER_EXECUTION, choose

if flavour.uses_legacy_keras():
    pytest.skip("a fix of Keras 3", allow_module_level=True)
keras = pytest.importorskip("keras")


class EveryStep(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        pass


class EveryEpoch(keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        pass


class EveryTestStep(keras.callbacks.Callback):
    def on_test_batch_begin(self, batch, logs=None):
        pass


class SavesEveryStep(keras.callbacks.ModelCheckpoint):
    def on_train_batch_end(self, batch, logs=None):
        pass


@pytest.mark.skipif(
    flavour.keras_version_tuple() < (3, 7),
    reason="the fix is for Keras >= 3.7 (older Keras marks no default hook)",
)
@pytest.mark.parametrize(
    "callback, fit, evaluate",
    [
        (EveryStep(), 1, 16),
        (EveryTestStep(), 1, 1),  # fit's validation calls it too
        (EveryEpoch(), 16, 16),
        (keras.callbacks.LambdaCallback(on_train_batch_end=lambda batch, logs: None), 1, 16),
        (keras.callbacks.LambdaCallback(on_epoch_end=lambda epoch, logs: None), 16, 16),
        (keras.callbacks.ModelCheckpoint("model.keras", save_freq="epoch"), 16, 16),
        (keras.callbacks.ModelCheckpoint("model.keras", save_freq=5), 1, 16),
        (SavesEveryStep("model.keras", save_freq="epoch"), 1, 16),
        (keras.callbacks.BackupAndRestore("backup", save_freq="epoch"), 16, 16),
        (keras.callbacks.BackupAndRestore("backup", save_freq=4), 1, 16),
        (keras.callbacks.EarlyStopping(), 16, 16),
        (keras.callbacks.ProgbarLogger(), 16, 16),  # Keras moves the bar once per call
        (keras.callbacks.History(), 16, 16),
    ],
)
def test_a_callback_with_a_batch_hook_keeps_one_step_per_call(callback, fit, evaluate):
    assert MAX_STEPS_PER_EXECUTION == 16
    assert choose(32, [callback], "fit") == fit
    assert choose(32, keras.callbacks.CallbackList([callback]), "evaluate") == evaluate


def test_tfdist_backup_takes_the_steps_per_call_its_backup_resumes_on(tmp_path):
    import json

    import tfdist
    from tfdist.preemption.backup import BackupStore

    backup = tfdist.BackupAndRestore(str(tmp_path))
    assert choose(32, [backup], "fit") == 16  # no backup yet
    assert choose(32, [tfdist.BackupAndRestore(str(tmp_path), save_freq=3)], "fit") == 1
    state = BackupStore(str(tmp_path), is_chief=True).state_path
    for step, k in ((0, 16), (6, 2), (24, 8), (5, 1)):  # a backup taken inside an epoch
        with open(state, "w") as f:
            json.dump({"checkpoint": "ckpt-1", "epoch": 0, "step": step}, f)
        assert choose(32, [backup], "fit") == k, step
    with open(state, "w") as f:
        f.write("not a backup")
    assert choose(32, [backup], "fit") == 1  # fit's on_train_begin names the bad state


def test_tf_keras_callbacks_say_themselves_whether_they_read_every_step(monkeypatch):
    legacy = pytest.importorskip("tf_keras")
    monkeypatch.setenv("TF_USE_LEGACY_KERAS", "1")
    callbacks = legacy.callbacks

    class LegacyEveryStep(callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            pass

    cases = [
        (LegacyEveryStep(), 1),
        (callbacks.LambdaCallback(on_batch_end=lambda batch, logs: None), 1),
        (callbacks.LambdaCallback(on_epoch_end=lambda epoch, logs: None), 16),
        (callbacks.ModelCheckpoint("model.keras", save_freq="epoch"), 16),
        (callbacks.ModelCheckpoint("model.keras", save_freq=5), 1),
        (callbacks.BackupAndRestore("backup"), 16),  # (tf_keras calls no batch hook of it)
        (callbacks.BackupAndRestore("backup", save_freq=4), 1),
        (callbacks.EarlyStopping(), 16),
        (callbacks.ProgbarLogger(), 16),
        (callbacks.History(), 16),
    ]
    for callback, k in cases:
        assert choose(32, [callback], "fit") == k, callback
    assert choose(32, callbacks.CallbackList([cases[0][0]]), "fit") == 1
