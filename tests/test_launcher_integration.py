"""tfdist launch with real TensorFlow workers (slow: several seconds a process)."""

import io
import textwrap

import pytest

from tfdist.launcher import launch

pytestmark = pytest.mark.slow


def test_a_worker_that_finishes_first_does_not_break_its_peers(tmp_path):
    script = tmp_path / "early.py"
    script.write_text(textwrap.dedent("""
        import time
        import tfdist
        strategy = tfdist.make_strategy()
        import tensorflow as tf
        spec = tfdist.detect_cluster()
        total = strategy.reduce("SUM", strategy.run(lambda: tf.constant(1.0)), axis=None)
        if spec.task_index == 1:
            time.sleep(8)  # worker 0, the coordination leader, is done long before
            print("still healthy:", tf.reduce_sum(tf.ones([3])).numpy(), flush=True)
        print("done", float(total), flush=True)
    """))
    out = io.StringIO()
    codes = launch(str(script), workers=2, out=out, timeout=240,
                   extra_env={"TF_CPP_MIN_LOG_LEVEL": "0"})
    text = out.getvalue()
    assert codes == {"worker:0": 0, "worker:1": 0}, text
    assert "[worker:1] still healthy: 3.0" in text
    # without tfdist's exit barrier the leader's early exit aborts worker 1's collectives
    assert "Failed to send RPC to coordination service" not in text, text
    assert "StartAbort" not in text, text
