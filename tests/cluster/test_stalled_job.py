"""The launcher's progress lines and stall detection on real jobs (slow): a worker held up in a
callback makes a 2-worker job stall; the launcher names it, prints every task's stacks and lets
the job finish; under parameter_server the servers show theirs too. With both turned off, a
task reports no progress: no thread of tfdist's runs in it, and the summary still counts its
steps."""

import io
import re
import textwrap

import pytest

from tfdist.launcher import launch

pytestmark = pytest.mark.slow

HELD_AT, HELD_FOR, STALL = 12, 12, 4  # worker 1 sleeps 12 s after step 12; a stall after 4 s


def test_a_held_up_worker_is_named_with_every_tasks_stacks_and_the_job_goes_on(
    tmp_path, monkeypatch
):
    script = tmp_path / "held.py"
    script.write_text(
        textwrap.dedent(f"""
        import os, time
        import numpy as np
        import tfdist
        strategy = tfdist.make_strategy()
        keras = tfdist.flavour.keras()
        worker = tfdist.detect_cluster().task_index

        class HoldUp(keras.callbacks.Callback):
            def on_train_batch_end(self, batch, logs=None):
                if worker == 1 and batch == {HELD_AT}:
                    hold_up_the_job()

        def hold_up_the_job():
            time.sleep({HELD_FOR})

        x = np.random.RandomState(0).rand(64 * 30, 4).astype("float32")
        with strategy.scope():
            model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
            model.compile("sgd", "mse")
        model.fit(x, x[:, :1], batch_size=64, epochs=1, verbose=0, callbacks=[HoldUp()])
        print("trained", int(model.optimizer.iterations.numpy()), flush=True)
        import threading
        print("reporter", any(t.name == "tfdist-progress" for t in threading.enumerate()))
    """)
    )
    monkeypatch.setenv("TFDIST_STALL_TIMEOUT", str(STALL))
    monkeypatch.setenv("TFDIST_STATUS_EVERY", "1")
    out = io.StringIO()
    logs = tmp_path / "logs"
    codes = launch(str(script), workers=2, out=out, timeout=240, log_dir=str(logs))
    text = out.getvalue()
    assert codes == {"worker:0": 0, "worker:1": 0}, text
    assert "[worker:0] trained 30" in text and "[worker:1] trained 30" in text, text
    assert "[worker:0] reporter True" in text, text
    stalls = [line for line in text.splitlines() if line.startswith("[tfdist] Stall:")]
    assert len(stalls) == 1, text  # once per stall
    # both are named (the launcher sees them stop within a second or two of each other), with
    # the step each is at: worker:1 held up after its step 13, worker:0 waiting for it
    head = stalls[0].split(". The job goes on")[0]
    assert head.startswith(
        f"[tfdist] Stall: No task has made a training step for {STALL} s: worker:0 at step "
    ), stalls[0]
    assert head.endswith(f"worker:1 at step {HELD_AT + 1}"), stalls[0]
    assert stalls[0] in (logs / "launcher.log").read_text().splitlines()  # and in the job's log
    for task in ("worker:0", "worker:1"):
        assert f"[{task}] tfdist: the stack of every thread of this task" in text, text
        log = (logs / f"{task.replace(':', '-')}.log").read_text()
        assert "tfdist: the stack of every thread of this task" in log, task
    # the held-up worker's stack shows where it is held up
    assert "in hold_up_the_job" in "\n".join(
        line for line in text.splitlines() if line.startswith("[worker:1]")
    ), text
    progress = [line for line in text.splitlines() if line.startswith("[tfdist] step ")]
    assert progress and all("/30" in line for line in progress), text
    assert any("steps/s" in line for line in progress), text


def test_with_progress_and_stalls_off_a_task_runs_no_reporter_and_still_counts_its_steps(
    tmp_path, monkeypatch
):
    script = tmp_path / "quiet.py"
    script.write_text(
        textwrap.dedent("""
        import threading
        import numpy as np
        import tfdist
        strategy = tfdist.make_strategy()
        keras = tfdist.flavour.keras()
        x = np.zeros((64 * 5, 4), "float32")
        with strategy.scope():
            model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
            model.compile("sgd", "mse")
        model.fit(x, x[:, :1], batch_size=64, epochs=2, verbose=0)
        print("reporter", any(t.name == "tfdist-progress" for t in threading.enumerate()))
    """)
    )
    monkeypatch.setenv("TFDIST_STALL_TIMEOUT", "0")
    monkeypatch.setenv("TFDIST_STATUS_EVERY", "0")
    out = io.StringIO()
    codes = launch(str(script), workers=1, out=out, timeout=120)
    text = out.getvalue()
    assert codes == {"worker:0": 0}, text
    assert "[worker:0] reporter False" in text, text
    assert re.search(r"\[tfdist\] worker:0 +exit 0 .* 10 steps in ", text), text


def test_at_a_stall_of_a_parameter_server_job_its_servers_show_their_stacks_too(
    tmp_path, monkeypatch
):
    script = tmp_path / "held_ps.py"
    script.write_text(
        textwrap.dedent(f"""
        import time
        import numpy as np
        import tfdist
        strategy = tfdist.make_strategy()
        keras = tfdist.flavour.keras()

        class HoldUp(keras.callbacks.Callback):
            def on_epoch_end(self, epoch, logs=None):
                if epoch == 0:
                    time.sleep({HELD_FOR})

        def build():
            model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
            model.compile("sgd", "mse")
            return model

        x = np.random.RandomState(0).rand(64 * 6, 4).astype("float32")
        history = tfdist.fit(build, (x, x[:, :1]), strategy=strategy, epochs=2,
                             global_batch_size=64, steps_per_epoch=6, verbose=0,
                             callbacks=[HoldUp()])
        print("trained", int(history.model.optimizer.iterations.numpy()), flush=True)
    """)
    )
    monkeypatch.setenv("TFDIST_STALL_TIMEOUT", str(STALL))
    out = io.StringIO()
    codes = launch(str(script), workers=2, ps=1, out=out, timeout=240)
    text = out.getvalue()
    assert set(codes.values()) == {0}, text
    assert "[chief:0] trained 12" in text, text
    assert text.count("[tfdist] Stall:") == 1, text
    for task in ("chief:0", "worker:0", "worker:1", "ps:0"):
        assert f"[{task}] tfdist: the stack of every thread of this task" in text, text
