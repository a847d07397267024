"""Keras' TensorBoard callback and the launcher's progress lines in real jobs (slow), under Keras 3
and tf_keras: under multi_worker_mirrored (Keras' own `model.fit`) the chief alone writes the
logs, and they hold what one device logs for the same training; under parameter_server
(`tfdist.fit`) the chief writes what its fit logged. The event files are read back. Every job
shows its progress (`[tfdist] step N/T`), read from its training tasks."""

import io
import json
import re
import textwrap

import numpy as np
import pytest

from tfdist.launcher import launch

from helpers.tensorboard_events import event_files, scalars

pytestmark = pytest.mark.slow

STEPS = 18  # 3 epochs of 6 batches

SCRIPT = """
import json, os, sys, time
import numpy as np
import tfdist

strategy = tfdist.make_strategy()
keras = tfdist.flavour.keras()
log_dir, out = sys.argv[1], sys.argv[2]
x = np.random.RandomState(0).rand(64 * 6, 4).astype("float32")
y = x @ np.arange(1, 5, dtype="float32")[:, None] / 4


class Slowly(keras.callbacks.Callback):  # the launcher reads each epoch's step
    def on_epoch_end(self, epoch, logs=None):
        time.sleep(1.5)


def build():
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(keras.optimizers.SGD(0.05), "mse", metrics=["mae"])
    return model


board = keras.callbacks.TensorBoard(log_dir)
if tfdist.task.current().cluster.num_ps:  # Keras 3 cannot fit here: tfdist.fit
    history = tfdist.fit(build, (x, y), strategy=strategy, epochs=3, global_batch_size=64,
                         steps_per_epoch=6, verbose=0, callbacks=[board, Slowly()])
else:  # the plain Keras idiom
    with strategy.scope():
        model = build()
    history = model.fit(x, y, batch_size=64, epochs=3, shuffle=False, verbose=0,
                        callbacks=[board, Slowly()])
if tfdist.task.is_chief():
    reference = build().fit(x, y, batch_size=64, epochs=3, shuffle=False, verbose=0)
    with open(out, "w") as f:
        json.dump({"fit": history.history, "one_device": reference.history}, f)
"""


@pytest.mark.parametrize("flavour", ["keras", "tf_keras"])
@pytest.mark.parametrize("ps", [0, 1], ids=["multi_worker_mirrored", "parameter_server"])
def test_the_chief_alone_writes_the_logs_and_the_job_shows_its_progress(
    tmp_path, ps, flavour, monkeypatch
):
    pytest.importorskip("tensorboard")  # the `tensorboard` extra of tfdist
    monkeypatch.setenv("TFDIST_STATUS_EVERY", "1")
    script = tmp_path / "board.py"
    script.write_text(textwrap.dedent(SCRIPT))
    logs, out = tmp_path / "logs", tmp_path / "histories.json"
    text = io.StringIO()
    env = {"TF_USE_LEGACY_KERAS": "1" if flavour == "tf_keras" else "0"}
    verbose = flavour == "tf_keras"  # --verbose: each task's step in the progress line too
    codes = launch(
        str(script),
        [str(logs), str(out)],
        workers=2,
        ps=ps,
        out=text,
        timeout=240,
        extra_env=env,
        verbose=verbose,
    )
    output = text.getvalue()
    assert set(codes.values()) == {0}, output
    histories = json.loads(out.read_text())
    (train,) = event_files(logs)  # one file: the chief's
    logged = scalars(train)
    assert np.allclose(logged["epoch_loss"], histories["fit"]["loss"], rtol=1e-6), logged
    assert np.allclose(logged["epoch_mae"], histories["fit"]["mae"], rtol=1e-6), logged
    if not ps:  # synchronous: what one device logs
        reference = histories["one_device"]
        for tag, key in (("epoch_loss", "loss"), ("epoch_mae", "mae")):
            assert np.allclose(logged[tag], reference[key], rtol=1e-5), (tag, logged, reference)
    assert not list(tmp_path.glob("**/workertemp*")), "a worker's temporary logs were left"
    # the progress of the fit, from the tasks that train (the chief alone under parameter_server)
    # (the chief's one-device reference fit, of as many steps, may be seen after it: from 0)
    steps = [int(m) for m in re.findall(rf"^\[tfdist\] step (\d+)/{STEPS}\b", output, re.M)]
    assert steps and 0 < max(steps) <= STEPS, (steps, output)
    chief = "chief:0" if ps else "worker:0"  # its fit and the one-device reference's
    trainers = [chief] if ps else ["worker:0", "worker:1"]
    each = r"; " + ", ".join(rf"{t} \d+( [0-9.]+/s)?" for t in trainers) + "$"
    assert bool(re.search(rf"^\[tfdist\] step \d+/{STEPS}.*{each}", output, re.M)) == verbose
    assert re.search(rf"^\[tfdist\] {chief} +exit 0 .* {2 * STEPS} steps in ", output, re.M), output
