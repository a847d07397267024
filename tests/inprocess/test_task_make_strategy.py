"""The task context (tfdist.task), set by make_strategy: the cluster given to it counts."""

import tfdist
from tfdist import task
from tfdist.cluster import ClusterSpec

from helpers.task import no_task_set  # noqa: F401  (autouse)

TWO_WORKERS = ClusterSpec.from_hosts(["127.0.0.1:1", "127.0.0.1:2"])


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
