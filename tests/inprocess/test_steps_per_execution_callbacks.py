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


@pytest.mark.parametrize(
    "callback, fit, evaluate",
    [
        (EveryStep(), 1, 16),
        (EveryTestStep(), 1, 1),  # fit's validation calls it too
        (EveryEpoch(), 16, 16),
        (keras.callbacks.LambdaCallback(on_train_batch_end=lambda batch, logs: None), 1, 16),
        (keras.callbacks.LambdaCallback(on_epoch_end=lambda epoch, logs: None), 16, 16),
        (keras.callbacks.ModelCheckpoint("model.keras", save_freq="epoch"), 1, 16),
        (keras.callbacks.EarlyStopping(), 16, 16),
        (keras.callbacks.ProgbarLogger(), 16, 16),  # Keras moves the bar once per call
        (keras.callbacks.History(), 16, 16),
    ],
)
def test_a_callback_with_a_batch_hook_keeps_one_step_per_call(callback, fit, evaluate):
    assert MAX_STEPS_PER_EXECUTION == 16
    assert choose(32, [callback], "fit") == fit
    assert choose(32, keras.callbacks.CallbackList([callback]), "evaluate") == evaluate
