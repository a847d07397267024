"""The task context (tfdist.task): one answer to "am I the chief", from the environment until
make_strategy sets it (that: tests/inprocess/test_task_make_strategy.py)."""

import json

from tfdist import task

from helpers.task import no_task_set  # noqa: F401  (autouse)


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
