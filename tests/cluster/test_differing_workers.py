"""Workers of a multi_worker_mirrored job that build different models are stopped while they build
them, and workers that would fit differently before the first step (arrays or tf.data datasets
of fewer batches, another steps_per_epoch, more epochs), every one of them with the same message
naming the workers and the difference (real 2- and 3-worker jobs); then the job trains on. A
worker that makes a variable the others never make is told which worker did not, within
TFDIST_STARTUP_TIMEOUT. The comparisons themselves: tests/unit/test_fit_agreement.py; 2 workers:
the proof of the fix `multi_worker_differing_variables_named` (tests/cluster/test_each_fix.py)."""

import io
import re
import textwrap

import pytest

from tfdist.launcher import launch

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("workers", [2, 3])
def test_workers_with_other_models_steps_or_epochs_are_told_which_and_the_job_goes_on(
    tmp_path, workers
):
    script = tmp_path / "differ.py"
    script.write_text(
        textwrap.dedent("""
        import os
        import numpy as np
        import tensorflow as tf
        import tfdist
        strategy = tfdist.make_strategy()
        keras = tfdist.flavour.keras()
        cluster = tfdist.detect_cluster()
        me, last = cluster.task_index, cluster.num_workers - 1
        x = np.random.RandomState(0).rand(64 * 6, 4).astype("float32")

        def build(*units):
            with strategy.scope():
                layers = [keras.layers.Dense(n) for n in units]
                model = keras.Sequential([keras.Input((4,)), *layers])
                model.compile("sgd", "mse")
            return model

        try:
            build(2 if me == last else 1)  # the last worker builds a wider layer
        except ValueError as err:
            print("refused:", err, flush=True)
        model = build(1)

        def fit(rows, epochs):
            try:
                model.fit(x[:rows], x[:rows, :1], batch_size=64, epochs=epochs, verbose=0)
            except ValueError as err:
                print("refused:", err, flush=True)

        fit(4 * 64 if me == last else 6 * 64, 1)  # the last worker has 4 batches, the others 6
        fit(6 * 64, 2 if me == 1 else 1)  # worker 1 asks for 2 epochs
        fit(6 * 64, 1)
        print("trained", int(model.optimizer.iterations.numpy()), flush=True)
        try:
            build(1, 1) if me == last else build(1)  # the last worker builds a layer more
        except ValueError as err:
            print("refused:", err, flush=True)
        model = build(1)
        fit(6 * 64, 1)
        print("trained", int(model.optimizer.iterations.numpy()), flush=True)

        def dataset(rows):
            return tf.data.Dataset.from_tensor_slices((x[:rows], x[:rows, :1])).batch(64)

        try:  # a dataset of 5 batches on the last worker, of 6 on the others
            model.fit(dataset(5 * 64 if me == last else 6 * 64), epochs=1, verbose=0)
        except ValueError as err:
            print("refused:", err, flush=True)
        try:  # the same endless dataset everywhere, but worker 0 asks for 3 steps per epoch
            steps = 3 if me == 0 else 6
            model.fit(dataset(6 * 64).repeat(), steps_per_epoch=steps, epochs=1, verbose=0)
        except ValueError as err:
            print("refused:", err, flush=True)
        model.fit(dataset(6 * 64), epochs=1, verbose=0)
        print("trained", int(model.optimizer.iterations.numpy()), flush=True)
        os.environ["TFDIST_STARTUP_TIMEOUT"] = "5"
        if me == last:  # the last worker alone builds a model more: the others make no variable
            try:
                build(1)
            except RuntimeError as err:
                print("late:", err, flush=True)
    """)
    )
    out = io.StringIO()
    codes = launch(str(script), workers=workers, out=out, timeout=240)
    text = out.getvalue()
    assert codes == {f"worker:{i}": 0 for i in range(workers)}, text
    last = f"worker:{workers - 1}"
    alike = "worker:0 and worker:1" if workers == 3 else "worker:0"
    for worker in range(workers):
        task = f"worker:{worker}"
        refused = [line for line in text.splitlines() if line.startswith(f"[{task}] refused:")]
        assert len(refused) == 6, text
        assert (
            "build different models, so their variables cannot start from the chief's values: "
            f"variable number 1 made in the strategy's scope is kernel [4, 1] float32 on {alike}, "
            f"but kernel [4, 2] float32 on {last}. Seen on {task}" in refused[0]
        ), refused
        assert "HINT: every worker must build the same model" in refused[0], refused
        assert (
            "do not train the same thing, so their collectives cannot agree: the fits differ in "
            f"steps per epoch: 6 on worker:0, 4 on {last}. Seen on {task}, before the first step "
            "of fit number 1." in refused[1]
        ), refused
        assert "the fits differ in epochs: 1 on worker:0, 2 on worker:1" in refused[2], refused
        assert "fit number 2" in refused[2] and "HINT" in refused[2], refused
        assert f"[{task}] trained 6" in text, text
        # a layer more on the last worker: its kernel meets the others' optimizer step counter
        assert re.search(
            r"variable number \d+ made in the strategy's scope is iteration \[\] int64 on "
            rf"{alike}, but kernel \[1, 1\] float32 on {last}",
            refused[3],
        ), refused
        assert text.count(f"[{task}] trained 6") == 2, text
        assert (  # a tf.data dataset of fewer batches
            f"the fits differ in steps per epoch: 6 on worker:0, 5 on {last}. Seen on {task}"
            in refused[4]
        ), refused
        assert (  # steps_per_epoch= of another value
            "the fits differ in steps per epoch: 3 on worker:0, 6 on worker:1" in refused[5]
        ), refused
        assert f"[{task}] trained 12" in text, text  # and the job trains on
    late = [line for line in text.splitlines() if "late:" in line]
    assert len(late) == 1 and late[0].startswith(f"[{last}] late: worker:0 did not make "), late
    assert f"in the strategy's scope (kernel [4, 1] float32 on {last}) within 5 s" in late[0]
