"""`tfdist launch --profile START:END` on a real 2-worker job (slow): each task writes a
TensorFlow profiler trace of those steps, where TensorBoard's profile plugin looks for it."""

import json
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.slow


def test_every_task_traces_the_steps_asked_for(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(
        textwrap.dedent("""
        import numpy as np
        import tfdist
        strategy = tfdist.make_strategy()
        keras = tfdist.flavour.keras()
        x = np.random.RandomState(0).rand(64 * 12, 4).astype("float32")
        with strategy.scope():
            model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
            model.compile("sgd", "mse")
        model.fit(x, x[:, :1], batch_size=64, epochs=1, verbose=0)
        model.fit(x, x[:, :1], batch_size=64, epochs=1, verbose=0)  # traces nothing more
        print("trained", int(model.optimizer.iterations.numpy()), flush=True)
    """)
    )
    logs = tmp_path / "logs"
    done = subprocess.run(
        [sys.executable, "-m", "tfdist", "launch", "--workers", "2", "--log-dir", str(logs),
         "--profile", "3:6", "--timeout", "240", str(script)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for task in ("worker-0", "worker-1"):
        folder = logs / "profile" / task
        covered = json.loads((folder / "steps.json").read_text())
        assert covered["first"] <= 3 and covered["last"] >= 5, covered  # whole calls
        (trace,) = folder.glob("plugins/profile/*/*.xplane.pb")
        assert trace.stat().st_size > 1000, trace
    assert done.stdout.count("trained 24") == 2, done.stdout
