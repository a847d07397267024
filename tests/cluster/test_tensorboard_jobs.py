"""Keras' TensorBoard callback in real jobs (slow): under multi_worker_mirrored the chief alone
writes the logs, and they hold what one device logs for the same training; under
parameter_server the chief writes what its fit logged. The event files are read back."""

import io
import json
import textwrap

import numpy as np
import pytest

from tfdist.launcher import launch

from helpers.tensorboard_events import event_files, scalars

pytestmark = pytest.mark.slow

SCRIPT = """
import json, os, sys
import numpy as np
import tfdist

strategy = tfdist.make_strategy()
keras = tfdist.flavour.keras()
log_dir, out = sys.argv[1], sys.argv[2]
x = np.random.RandomState(0).rand(64 * 6, 4).astype("float32")
y = x @ np.arange(1, 5, dtype="float32")[:, None] / 4


def build():
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(keras.optimizers.SGD(0.05), "mse", metrics=["mae"])
    return model


with strategy.scope():
    model = build()
board = keras.callbacks.TensorBoard(log_dir)
history = model.fit(x, y, batch_size=64, epochs=3, shuffle=False, verbose=0, callbacks=[board])
if tfdist.task.is_chief():
    reference = build().fit(x, y, batch_size=64, epochs=3, shuffle=False, verbose=0)
    with open(out, "w") as f:
        json.dump({"fit": history.history, "one_device": reference.history}, f)
"""


@pytest.mark.parametrize("ps", [0, 1], ids=["multi_worker_mirrored", "parameter_server"])
def test_the_chief_alone_writes_the_logs_of_the_training(tmp_path, ps):
    pytest.importorskip("tensorboard")  # the `tensorboard` extra of tfdist
    script = tmp_path / "board.py"
    script.write_text(textwrap.dedent(SCRIPT))
    logs, out = tmp_path / "logs", tmp_path / "histories.json"
    text = io.StringIO()
    codes = launch(str(script), [str(logs), str(out)], workers=2, ps=ps, out=text, timeout=240)
    assert set(codes.values()) == {0}, text.getvalue()
    histories = json.loads(out.read_text())
    (train,) = event_files(logs)  # one file: the chief's
    logged = scalars(train)
    assert np.allclose(logged["epoch_loss"], histories["fit"]["loss"], rtol=1e-6), logged
    assert np.allclose(logged["epoch_mae"], histories["fit"]["mae"], rtol=1e-6), logged
    if not ps:  # synchronous: what one device logs
        reference = histories["one_device"]
        assert np.allclose(logged["epoch_loss"], reference["loss"], rtol=1e-5), (logged, reference)
    assert not list(tmp_path.glob("**/workertemp*")), "a worker's temporary logs were left"
