"""Cluster detection: which launcher started this process, and what is its cluster?

Every environment implements one small protocol, `Environment`: a `name`, `detect(env)` and
`cluster_spec(env)`, each reading a mapping (default `os.environ`) and never writing it:

- `TFConfigEnvironment`: the TF_CONFIG variable (hand-written scripts, `tfdist launch`, and
  Kubeflow TFJob pods, which get TF_CONFIG from the operator).
- `SlurmEnvironment` (tfdist.cluster.slurm): the variables of a SLURM `srun` step.
- `LocalEnvironment`: a single process with no cluster.

`detect_cluster(env)` tries them in the order of `DETECTION_ORDER`. Imports the spec and the
SLURM environment; never TensorFlow.
"""

from __future__ import annotations

import os
from typing import Mapping, Optional, Protocol

from tfdist.cluster.slurm import SlurmEnvironment
from tfdist.cluster.spec import ClusterSpec

__all__ = [
    "DETECTION_ORDER",
    "Environment",
    "LocalEnvironment",
    "SlurmEnvironment",
    "TFConfigEnvironment",
    "detect_cluster",
    "detect_environment",
]


class Environment(Protocol):
    """What a launcher's environment tells tfdist: whether this process runs under it, and its
    cluster. A new launcher (a scheduler, an operator) needs one class with these three members,
    and a place in `DETECTION_ORDER`."""

    name: str

    def detect(self, env: Optional[Mapping[str, str]] = None) -> bool:
        """True when `env` (default `os.environ`) shows this launcher started the process."""

    def cluster_spec(self, env: Optional[Mapping[str, str]] = None) -> ClusterSpec:
        """This process's cluster, read from `env`; raises ClusterConfigError when invalid."""


def _env(env: Optional[Mapping[str, str]]) -> Mapping[str, str]:
    return os.environ if env is None else env


class TFConfigEnvironment:
    """TF_CONFIG set in the environment: the explicit contract of a TensorFlow job."""

    name = "tf_config"

    @staticmethod
    def detect(env: Optional[Mapping[str, str]] = None) -> bool:
        return bool(_env(env).get("TF_CONFIG", "").strip())

    @staticmethod
    def cluster_spec(env: Optional[Mapping[str, str]] = None) -> ClusterSpec:
        return ClusterSpec.from_tf_config(_env(env).get("TF_CONFIG", ""))


class LocalEnvironment:
    """No launcher: a single process (which may still have several local devices)."""

    name = "local"

    @staticmethod
    def detect(env: Optional[Mapping[str, str]] = None) -> bool:
        return True

    @staticmethod
    def cluster_spec(env: Optional[Mapping[str, str]] = None) -> ClusterSpec:
        return ClusterSpec({})


# TF_CONFIG first: it is the explicit contract, and what Kubeflow TFJob pods get (a TFJob may
# even run inside a SLURM-managed node). SLURM next, only inside an srun step. Else one process.
DETECTION_ORDER = (TFConfigEnvironment, SlurmEnvironment, LocalEnvironment)


def detect_environment(env: Optional[Mapping[str, str]] = None):
    """Returns the first environment class of `DETECTION_ORDER` that detects itself."""
    for environment in DETECTION_ORDER:
        if environment.detect(env):
            return environment
    raise AssertionError("LocalEnvironment always detects")  # pragma: no cover


def detect_cluster(env: Optional[Mapping[str, str]] = None) -> ClusterSpec:
    """Returns the `ClusterSpec` of this process, read from `env` (default `os.environ`).

    Priority: TF_CONFIG, then a SLURM srun step, then a single local process. The mapping is
    only read, never written.

    Raises:
        ClusterConfigError: the detected environment describes an invalid cluster.
        TypeError: `env` is not a mapping of variable names to values.
    """
    if env is not None and not isinstance(env, Mapping):
        raise TypeError(
            f"env must be a mapping of environment variables (like os.environ). Received: "
            f"env={env!r} (of type {type(env).__name__}). HINT: leave it out to read os.environ."
        )
    return detect_environment(env).cluster_spec(env)
