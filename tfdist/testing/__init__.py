"""`tfdist.testing`: test distributed TensorFlow code on CPUs, in-process or as local clusters.

- `run_cluster(fn, workers=2, ...)`: a function run in every task of a local multi-process
  cluster, with each task's exit code, output and return value (`clusters`).
- `assert_same_training(build_model, data, global_batch_size=...)`: the same model trained with
  `model.fit` under one_device, mirrored, multi_worker_mirrored and parameter_server must train
  the same, step by step (`same_training`), in strategy processes started once and shared
  (`pools`).
- The pytest plugin (`plugin`, registered through the `pytest11` entry point): the fixtures
  `virtual_cpus`, `free_ports`, `run_cluster`; the markers `requires_gpu(n)` and
  `tfdist_strategies(...)`, which runs one test body under each strategy; an env-leak guard.

Importing this package imports neither TensorFlow nor pytest.
"""

from tfdist.testing.clusters import ClusterRunError, TaskRun, is_running, run_cluster
from tfdist.testing.pools import STRATEGIES, PoolError, close_pools
from tfdist.testing.same_training import (
    TrainingComparison,
    TrainingDiffers,
    assert_same_training,
    compare_training,
)

__all__ = [
    "STRATEGIES",
    "ClusterRunError",
    "PoolError",
    "TaskRun",
    "TrainingComparison",
    "TrainingDiffers",
    "assert_same_training",
    "close_pools",
    "compare_training",
    "is_running",
    "run_cluster",
]
