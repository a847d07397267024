"""The task context (tfdist.task): one answer to "am I the chief", set by make_strategy."""

import json

import pytest

import tfdist
from tfdist import task
from tfdist.cluster import ClusterSpec

TWO_WORKERS = ClusterSpec.from_hosts(["127.0.0.1:1", "127.0.0.1:2"])


@pytest.fixture(autouse=True)
def no_task_set(monkeypatch):
    monkeypatch.setattr(task, "_CURRENT", [])
    monkeypatch.delenv("TF_CONFIG", raising=False)
    monkeypatch.delenv("SLURM_STEP_ID", raising=False)


def test_before_make_strategy_the_environment_decides(monkeypatch):
    assert task.is_chief() and task.current().num_workers == 1
    tf_config = {"cluster": {"worker": ["h:1", "h:2"]}, "task": {"type": "worker", "index": 1}}
    monkeypatch.setenv("TF_CONFIG", json.dumps(tf_config))
    assert not task.is_chief()
    assert (task.current().task_type, task.current().task_index) == ("worker", 1)
    assert task.current().num_workers == 2


def test_a_broken_cluster_description_counts_as_one_process_until_make_strategy(monkeypatch):
    monkeypatch.setenv("TF_CONFIG", "{not json")
    assert task.is_chief() and task.current().cluster.is_single_process


def test_the_cluster_given_to_make_strategy_is_the_task_everywhere(monkeypatch):
    """A cluster passed as make_strategy(cluster=...) counts, not the environment's: the
    progress bars, the once-per-job messages and the sharding warning follow it."""
    from tfdist import precision, training

    second = TWO_WORKERS.replace_task("worker", 1)
    tfdist.make_strategy("default", cluster=second)
    assert task.current().cluster is second and task.current().strategy == "default"
    assert not task.is_chief()
    assert training._chief_verbose(1) == 0  # no progress bar off the chief
    assert not precision._once(("test_task", "key"))  # once-per-job messages: the chief only

    tfdist.make_strategy("default", cluster=TWO_WORKERS)  # worker 0 leads
    assert task.is_chief() and training._chief_verbose(1) == 1
