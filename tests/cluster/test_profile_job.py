"""`tfdist launch --profile START:END` on real jobs (slow): each task writes a TensorFlow
profiler trace of those steps, where TensorBoard's profile plugin looks for it; under
parameter_server the servers trace with the chief."""

import json
import os
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


@pytest.mark.parametrize("flavour", ["keras", "tf_keras"])
def test_under_parameter_server_the_servers_trace_with_the_chief(tmp_path, flavour):
    """The workers run the steps and the ps tasks hold the variables: they trace too, as long
    as the chief does (tf_keras, which refuses batch-level callbacks here: whole epochs)."""
    script = tmp_path / "train_ps.py"
    script.write_text(
        textwrap.dedent("""
        import numpy as np
        import tfdist
        strategy = tfdist.make_strategy()
        keras = tfdist.flavour.keras()

        def build():
            model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
            model.compile("sgd", "mse")
            return model

        x = np.random.RandomState(0).rand(64 * 4, 4).astype("float32")
        history = tfdist.fit(build, (x, x[:, :1]), strategy=strategy, epochs=3,
                             global_batch_size=64, steps_per_epoch=4, verbose=0)
        print("trained", int(history.model.optimizer.iterations.numpy()), flush=True)
    """)
    )
    logs = tmp_path / "logs"
    env = dict(os.environ, TF_USE_LEGACY_KERAS="1" if flavour == "tf_keras" else "0")
    done = subprocess.run(
        [sys.executable, "-m", "tfdist", "launch", "--workers", "2", "--ps", "1",
         "--log-dir", str(logs), "--profile", "5:9", "--timeout", "240", str(script)],
        capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "trained 12" in done.stdout, done.stdout
    tasks = ("chief-0", "worker-0", "worker-1", "ps-0")
    covered = {t: json.loads((logs / "profile" / t / "steps.json").read_text()) for t in tasks}
    first, last = covered["chief-0"]["first"], covered["chief-0"]["last"]
    assert first <= 5 and last >= 8, covered  # whole calls, or whole epochs (tf_keras)
    assert all(c == {"first": first, "last": last} for c in covered.values()), covered
    size = {}
    for task in tasks:
        (trace,) = (logs / "profile" / task).glob("plugins/profile/*/*.xplane.pb")
        size[task] = trace.stat().st_size
    # the coordinator sends each step to a worker that is free: a worker may have run none
    assert size["chief-0"] > 1000 and size["ps-0"] > 1000, size
    assert max(size["worker-0"], size["worker-1"]) > 1000, size
