"""Which task this process is: one answer to "am I the chief, which worker, how many workers".

`make_strategy` sets the context from the cluster it used (so a cluster passed as
`make_strategy(cluster=...)` counts, not only the environment's); everything else in tfdist
reads it here: progress bars and once-per-job messages on the chief only, the data sharding
warning, the training helpers. Before any strategy is made, the context is the environment's
cluster (`tfdist.detect_cluster()`), read afresh at each call; a cluster description that does
not parse counts as one process here, and `make_strategy` reports it.

Imports the cluster only; never TensorFlow.
"""

from __future__ import annotations

import threading
from typing import Optional

from tfdist.cluster import ClusterSpec, detect_cluster
from tfdist.errors import ClusterConfigError

__all__ = ["Task", "current", "is_chief", "set_current"]


class Task:
    """This process's place in its job: a read-only view of the cluster it trains in.

    Attributes:
        cluster: the ClusterSpec.
        strategy: the name of the strategy made with it ("mirrored", ...), or None before
            `make_strategy`.
    """

    __slots__ = ("cluster", "strategy")

    def __init__(self, cluster: ClusterSpec, strategy: Optional[str] = None):
        self.cluster, self.strategy = cluster, strategy

    @property
    def task_type(self) -> Optional[str]:
        return self.cluster.task_type

    @property
    def task_index(self) -> Optional[int]:
        return self.cluster.task_index

    @property
    def is_chief(self) -> bool:
        """The task that logs, shows progress and writes checkpoints (worker 0 without a chief)."""
        return self.cluster.is_chief

    @property
    def num_workers(self) -> int:
        """Training processes (workers, and the chief when it trains); 1 for a single process."""
        return self.cluster.num_workers

    def __repr__(self) -> str:
        return f"Task({self.cluster!r}, strategy={self.strategy!r})"


_LOCK = threading.Lock()
_CURRENT: list = []  # the Task set by make_strategy, once one was made


def set_current(cluster: ClusterSpec, strategy: Optional[str] = None) -> Task:
    """Makes `cluster` this process's task (called by `make_strategy`)."""
    task = Task(cluster, strategy)
    with _LOCK:
        _CURRENT[:] = [task]
    return task


def current() -> Task:
    """The task set by the last `make_strategy`, else the environment's."""
    with _LOCK:
        if _CURRENT:
            return _CURRENT[0]
    try:
        return Task(detect_cluster())
    except ClusterConfigError:
        return Task(ClusterSpec({}))


def is_chief() -> bool:
    return current().is_chief
