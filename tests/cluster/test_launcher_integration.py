"""tfdist launch with real TensorFlow workers (slow: several seconds a process)."""

import io
import os
import re
import textwrap

import numpy as np
import pytest

from tfdist.launcher import launch

from helpers.paths import SCRIPTS

pytestmark = pytest.mark.slow


def test_a_worker_that_finishes_first_does_not_break_its_peers(tmp_path):
    script = tmp_path / "early.py"
    script.write_text(
        textwrap.dedent("""
        import atexit
        import time
        import tfdist
        spec = tfdist.detect_cluster()
        if spec.task_index == 1:
            # runs after tfdist's exit barrier (atexit is last in, first out): worker 1 is
            # still alive, heartbeating to the leader, long after the barrier
            atexit.register(time.sleep, 6)
        strategy = tfdist.make_strategy()
        import tensorflow as tf
        total = strategy.reduce("SUM", strategy.run(lambda: tf.constant(1.0)), axis=None)
        if spec.task_index == 1:
            time.sleep(6)  # worker 0, the coordination leader, is done long before
            print("still healthy:", tf.reduce_sum(tf.ones([3])).numpy(), flush=True)
        print("done", float(total), flush=True)
    """)
    )
    out = io.StringIO()
    codes = launch(
        str(script), workers=2, out=out, timeout=240, extra_env={"TF_CPP_MIN_LOG_LEVEL": "0"}
    )
    text = out.getvalue()
    assert codes == {"worker:0": 0, "worker:1": 0}, text
    assert "[worker:1] still healthy: 3.0" in text
    # without tfdist's exit barrier the leader's early exit aborts worker 1's collectives, and
    # without the leader waiting for its peers to exit, worker 1's heartbeat fails after it
    assert "Failed to send RPC to coordination service" not in text, text
    assert "StartAbort" not in text, text


def test_restart_resumes_from_backup_after_a_worker_is_killed(tmp_path):
    interrupted, uninterrupted = tmp_path / "interrupted", tmp_path / "uninterrupted"
    interrupted.mkdir()
    uninterrupted.mkdir()
    script = os.path.join(SCRIPTS, "train_backup.py")
    env = {"TF_CPP_MIN_LOG_LEVEL": "2"}
    out = io.StringIO()
    codes = launch(
        script,
        [str(interrupted), "--kill-worker-1-in-epoch", "2"],
        workers=2,
        max_restarts=1,
        timeout=400,
        out=out,
        extra_env=env,
    )
    text = out.getvalue()
    assert codes == {"worker:0": 0, "worker:1": 0}, text[text.find("Restarting") :]
    assert "Task worker:1 was killed by signal 9" in text
    assert "Restarting the job (1/1) on fresh ports" in text
    assert (interrupted / "killed-once").exists()
    epochs = [line.split()[0] for line in (interrupted / "epochs.log").read_text().splitlines()]
    assert epochs == ["0", "1", "2"]  # every epoch finished exactly once, across the restart
    # the summary of the restarted attempt: it trained epochs 2 and 3 only (2 x 12 steps)
    restarted = text[text.rfind("Restarting the job") :]
    for task in ("worker:0", "worker:1"):
        assert re.search(
            rf"\[tfdist\] {task} +exit 0 +[0-9.]+ s  24 steps in [0-9.]+ s, [0-9.]+ steps/s"
            r"  \(1 restart before\)",
            restarted,
        ), restarted
    out = io.StringIO()
    launch(script, [str(uninterrupted)], workers=2, timeout=300, out=out, extra_env=env, check=True)
    assert (
        len(
            re.findall(
                r"exit 0 +[0-9.]+ s  36 steps in [0-9.]+ s, [0-9.]+ steps/s\n", out.getvalue()
            )
        )
        == 2
    )
    resumed = np.load(interrupted / "final.npz")
    reference = np.load(uninterrupted / "final.npz")
    for key in reference.files:
        np.testing.assert_allclose(resumed[key], reference[key], atol=1e-5)
