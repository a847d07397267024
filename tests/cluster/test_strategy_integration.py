"""Tier 3: real local multi-process clusters on loopback (slow: several seconds a process)."""

import os
import subprocess
import sys
import time

import pytest

from tfdist import ClusterSpec
from tfdist.testing import ClusterRunError, is_running

pytestmark = pytest.mark.slow


def mwms_allreduce():
    import tensorflow as tf

    import tfdist

    strategy = tfdist.make_strategy()
    spec = tfdist.detect_cluster()
    value = float(spec.task_index + 1) * 10.0
    per_replica = strategy.run(lambda: tf.constant(value))
    total = strategy.reduce("SUM", per_replica, axis=None)
    return {
        "type": type(strategy).__name__,
        "replicas": strategy.num_replicas_in_sync,
        "sum": float(total),
        "is_chief": strategy.extended.should_checkpoint,
        "implementation": strategy.extended._communication_options.implementation.name,
        "timeout": strategy.extended._communication_options.timeout_seconds,
    }


def test_two_process_multi_worker_all_reduce_gives_both_workers_the_exact_sum(run_cluster):
    runs = run_cluster(mwms_allreduce, workers=2, timeout=180)
    results = [runs[f"worker:{i}"].value for i in range(2)]
    for result in results:
        assert result["type"] == "CollectiveAllReduceStrategy"
        assert result["replicas"] == 2
        assert result["sum"] == 30.0
        assert result["implementation"] == "RING"
        assert result["timeout"] is None
    assert [r["is_chief"] for r in results] == [True, False]


def parameter_server_placement():
    import tensorflow as tf

    import tfdist

    spec = tfdist.detect_cluster()
    plain = tfdist.make_strategy()
    with plain.scope():
        weights = tf.Variable(tf.ones([4, 3]))
    coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(plain)

    @tf.function
    def step():
        weights.assign_add(tf.ones([4, 3]))
        return tf.reduce_sum(weights)

    for _ in range(6):
        coordinator.schedule(step)
    coordinator.join()
    sharded_strategy = tfdist.make_strategy("parameter_server", variable_partitioner="fixed")
    with sharded_strategy.scope():
        table = tf.Variable(tf.reshape(tf.range(40, dtype=tf.float32), [10, 4]))
    return {
        "task": spec.task,
        "type": type(plain).__name__,
        "weights_device": weights.device,
        "weights_sum": float(tf.reduce_sum(weights)),
        "shard_devices": [v.device for v in table.variables],
        "shard_shapes": [v.shape.as_list() for v in table.variables],
        "table": tf.concat([v.read_value() for v in table.variables], 0).numpy().tolist(),
    }


def test_parameter_server_places_and_partitions_variables_on_the_ps_tasks(run_cluster):
    runs = run_cluster(parameter_server_placement, workers=2, ps=2, timeout=240)
    assert set(runs) == {"chief:0", "worker:0", "worker:1", "ps:0", "ps:1"}
    result = runs["chief:0"].value
    assert result["task"] == "chief:0"
    assert result["type"] == "ParameterServerStrategyV2"
    assert "/job:ps/" in result["weights_device"]
    # six steps scheduled over two workers each added 1 to all 12 entries
    assert result["weights_sum"] == 12 * 7
    assert ["/job:ps/replica:0/task:0" in d for d in result["shard_devices"]] == [True, False]
    assert ["/job:ps/replica:0/task:1" in d for d in result["shard_devices"]] == [False, True]
    assert result["shard_shapes"] == [[5, 4], [5, 4]]
    assert result["table"] == [[float(4 * r + c) for c in range(4)] for r in range(10)]


def hang_on_worker_one(pid_dir):
    import tensorflow as tf

    import tfdist

    spec = tfdist.detect_cluster()
    with open(os.path.join(pid_dir, f"{spec.task_index}.pid"), "w") as f:
        f.write(str(os.getpid()))
    strategy = tfdist.make_strategy()
    if spec.task_index == 1:
        time.sleep(3600)  # a worker that hangs; worker 0 then waits in the all-reduce
    return float(strategy.reduce("SUM", strategy.run(lambda: tf.constant(1.0)), axis=None))


def test_a_hung_worker_is_killed_and_reported(run_cluster, tmp_path):
    started = time.monotonic()
    with pytest.raises(ClusterRunError, match=r"hang_on_worker_one\) timed out after 40 s") as err:
        run_cluster(hang_on_worker_one, workers=2, args=(str(tmp_path),), timeout=40)
    assert time.monotonic() - started < 40 + 20
    assert "--- worker:1" in str(err.value)
    pids = [int(p.read_text()) for p in tmp_path.glob("*.pid")]
    assert len(pids) == 2
    assert not [pid for pid in pids if is_running(pid)]  # no orphan survives the timeout


def test_a_peer_that_never_joins_is_an_error_naming_the_cluster():
    spec = ClusterSpec.local(workers=2, task_type="worker", task_index=1)
    env = dict(os.environ, TF_CONFIG=spec.to_json(), TFDIST_STARTUP_TIMEOUT="5")
    code = "import tfdist; tfdist.make_strategy()"
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode != 0
    assert time.monotonic() - started < 90
    assert "RuntimeError: Task worker:1 could not form the multi-worker cluster" in proc.stderr
    assert spec.cluster["worker"][0] in proc.stderr
    assert "HINT: start every task of the cluster" in proc.stderr
