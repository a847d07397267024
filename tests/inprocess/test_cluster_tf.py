"""tfdist.cluster's TensorFlow outputs: `ClusterSpec.to_tf()` and `resolver()` (they import
TensorFlow, and initialise no device)."""

import pytest

from tfdist.cluster import ClusterSpec

from helpers.cluster_spec import FULL, FULL_TASKS


def test_to_tf():
    import tensorflow as tf

    tf_spec = ClusterSpec(FULL, "worker", 1).to_tf()
    assert isinstance(tf_spec, tf.train.ClusterSpec)
    assert sorted(tf_spec.jobs) == sorted(FULL)
    for job, addresses in FULL.items():
        assert tf_spec.job_tasks(job) == addresses


@pytest.mark.parametrize("task_type, task_index", FULL_TASKS)
def test_resolver(task_type, task_index):
    import tensorflow as tf

    spec = ClusterSpec(FULL, task_type, task_index)
    resolver = spec.resolver()
    assert isinstance(resolver, tf.distribute.cluster_resolver.SimpleClusterResolver)
    assert (resolver.task_type, resolver.task_id) == (task_type, task_index)
    assert resolver.rpc_layer == "grpc"
    tf_spec = resolver.cluster_spec()
    assert {job: tf_spec.num_tasks(job) for job in tf_spec.jobs} == {
        job: len(a) for job, a in FULL.items()
    }
    assert resolver.master(resolver.task_type, resolver.task_id) == (
        f"grpc://{FULL[task_type][task_index]}"
    )
