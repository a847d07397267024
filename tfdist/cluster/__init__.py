"""The cluster: who is in a TensorFlow job, which task this process is, and how tfdist finds out.

- `spec`: `ClusterSpec`, the immutable, validated value (TF_CONFIG, host lists, local clusters).
- `environments`: the `Environment` protocol and detection (`detect_cluster`): TF_CONFIG, SLURM,
  a single local process.
- `slurm`: the SLURM environment and its node-list parsers.

Nothing here imports TensorFlow at import time.
"""

from tfdist.cluster.environments import (
    DETECTION_ORDER,
    Environment,
    LocalEnvironment,
    TFConfigEnvironment,
    detect_cluster,
    detect_environment,
)
from tfdist.cluster.slurm import SlurmEnvironment, expand_nodelist, expand_tasks_per_node
from tfdist.cluster.spec import JOB_NAMES, ClusterSpec, free_ports
from tfdist.errors import ClusterConfigError

__all__ = [
    "DETECTION_ORDER",
    "JOB_NAMES",
    "ClusterConfigError",
    "ClusterSpec",
    "Environment",
    "LocalEnvironment",
    "SlurmEnvironment",
    "TFConfigEnvironment",
    "detect_cluster",
    "detect_environment",
    "expand_nodelist",
    "expand_tasks_per_node",
    "free_ports",
]
