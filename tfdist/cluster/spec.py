"""`ClusterSpec`: who is in a TensorFlow job, and which task this process is.

A `ClusterSpec` is an immutable value: jobs (`chief`, `worker`, `ps`, `evaluator`) mapped to
ordered "host:port" addresses, plus the current task. It is validated once, when built, so that
a mistake in a TF_CONFIG or a host list is reported here, with the value and the fix, and never
as a hang or a traceback from deep inside TensorFlow.

This module does not import TensorFlow at import time; only `to_tf()` and `resolver()` do.
"""

from __future__ import annotations

import json
import re
import socket
import threading
from types import MappingProxyType
from typing import Any, Iterable, Mapping, Optional, Sequence, Union

from tfdist.errors import ClusterConfigError, is_count, is_int

__all__ = ["ClusterConfigError", "ClusterSpec", "JOB_NAMES", "free_ports"]

# The jobs TensorFlow's strategies understand, in the order TF_CONFIG lists them.
JOB_NAMES = ("chief", "worker", "ps", "evaluator")

_HOST_PORT = re.compile(r"^(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.\-]+):(?P<port>[^:]*)$")


# name -> cluster_spec(env, **options) of the environments that build specs from a scheduler's
# variables (filled by tfdist.cluster.slurm).
_ENVIRONMENT_READERS: dict = {}


def _parse_address(address: Any, where: str) -> str:
    if not isinstance(address, str):
        raise ClusterConfigError(
            f"{where}: expected a 'host:port' string. Received: {address!r} "
            f"(of type {type(address).__name__}). HINT: write addresses like 'node1:2222'."
        )
    match = _HOST_PORT.match(address.strip())
    if not match:
        raise ClusterConfigError(
            f"{where}: {address!r} is not a 'host:port' address. HINT: write it like "
            "'node1:2222' or '[::1]:2222' (IPv6 in brackets)."
        )
    port_text = match.group("port")
    if not (port_text.isascii() and port_text.isdigit()) or not 1 <= int(port_text) <= 65535:
        raise ClusterConfigError(
            f"{where}: port {port_text!r} in {address!r} is not a port number from 1 to 65535. "
            "HINT: pick a free port, e.g. with `tfdist.ClusterSpec.local()` on one machine."
        )
    return f"{match.group('host')}:{int(port_text)}"


def _parse_index(index: Any, where: str) -> int:
    if not is_int(index):
        if isinstance(index, str) and index.strip().isascii() and index.strip().isdigit():
            return int(index)
        raise ClusterConfigError(
            f"{where}: the task index must be a non-negative integer. Received: {index!r} "
            f'(of type {type(index).__name__}). HINT: write it as a number, e.g. "index": 0.'
        )
    if index < 0:
        raise ClusterConfigError(
            f"{where}: the task index must be a non-negative integer. Received: {index}. "
            "HINT: task indices count from 0."
        )
    return index


def _normalize_job(job: str, addresses: Any) -> tuple:
    where = f"job {job!r}"
    if isinstance(addresses, str):
        raise ClusterConfigError(
            f"{where}: expected a list of 'host:port' addresses. Received the string "
            f"{addresses!r}. HINT: write [{addresses!r}] (a list, even for one address)."
        )
    if isinstance(addresses, Mapping):
        # TensorFlow also accepts {index: address}; only a dense one makes sense for a job.
        try:
            indices = sorted(int(k) for k in addresses)
        except (TypeError, ValueError):
            raise ClusterConfigError(
                f"{where}: expected a list of addresses, or a mapping from task index to "
                f"address. Received keys {list(addresses)!r}."
            ) from None
        if indices != list(range(len(indices))):
            raise ClusterConfigError(
                f"{where}: task indices {indices} are not 0..{len(indices) - 1}. HINT: list "
                "every task of the job, in index order."
            )
        addresses = [addresses[k] for k in sorted(addresses, key=int)]
    if not isinstance(addresses, (list, tuple)):
        raise ClusterConfigError(
            f"{where}: expected a list of 'host:port' addresses. Received: {addresses!r} "
            f"(of type {type(addresses).__name__})."
        )
    if not addresses:
        raise ClusterConfigError(
            f"{where} has no addresses. HINT: remove the job, or list at least one "
            "'host:port' for it."
        )
    return tuple(_parse_address(a, f"{where}, task {i}") for i, a in enumerate(addresses))


def _normalize_cluster(cluster: Any) -> dict:
    if not isinstance(cluster, Mapping):
        raise ClusterConfigError(
            "The cluster must map job names to lists of 'host:port' addresses, like "
            "{'worker': ['node1:2222', 'node2:2222']}. Received: "
            f"{cluster!r} (of type {type(cluster).__name__})."
        )
    unknown = [job for job in cluster if job not in JOB_NAMES]
    if unknown:
        hint = " HINT: 'master' is the old name of 'chief'." if "master" in unknown else ""
        raise ClusterConfigError(
            f"Unknown job name(s) {unknown!r} in the cluster. Choose from: "
            f"{', '.join(JOB_NAMES)}.{hint}"
        )
    jobs = {job: _normalize_job(job, cluster[job]) for job in JOB_NAMES if job in cluster}
    seen: dict = {}
    for job, addresses in jobs.items():
        for index, address in enumerate(addresses):
            if address in seen:
                raise ClusterConfigError(
                    f"Address {address!r} is used twice: by {seen[address]} and by "
                    f"{job}:{index}. HINT: every task needs its own host:port."
                )
            seen[address] = f"{job}:{index}"
    if len(jobs.get("chief", ())) > 1:
        raise ClusterConfigError(
            f"A cluster has at most one chief. Received {len(jobs['chief'])}: "
            f"{list(jobs['chief'])!r}. HINT: move the others to the 'worker' job."
        )
    if len(jobs.get("evaluator", ())) > 1:
        raise ClusterConfigError(
            f"A cluster has at most one evaluator. Received {len(jobs['evaluator'])}: "
            f"{list(jobs['evaluator'])!r}."
        )
    if "ps" in jobs and "worker" not in jobs:
        raise ClusterConfigError(
            f"A 'ps' job ({list(jobs['ps'])!r}) needs a 'worker' job to train: parameter "
            "servers only hold variables. HINT: add workers, e.g. --worker host:port."
        )
    if "ps" in jobs and "chief" not in jobs:
        raise ClusterConfigError(
            f"A parameter-server cluster needs a 'chief' job: the coordinator that runs the "
            f"training program while the workers and ps tasks serve. Received: {_plain(jobs)!r}. "
            'HINT: add "chief": ["host:port"] to the cluster (TF_CONFIG, --chief host:port, '
            "ClusterSpec.local(..., chief=True)); `tfdist launch --ps N` adds it for you."
        )
    if jobs and not ("chief" in jobs or "worker" in jobs):
        raise ClusterConfigError(
            f"The cluster {_plain(jobs)!r} has no 'chief' or 'worker' job, so nothing would "
            "train. HINT: add at least one worker."
        )
    return jobs


def _plain(jobs: Mapping) -> dict:
    return {job: list(addresses) for job, addresses in jobs.items()}


# Ports handed out by `free_ports` in this process, so that two local clusters built at the
# same time never share one (the OS may offer a just-released port again).
_RESERVED_PORTS: set = set()
_RESERVED_LOCK = threading.Lock()


def free_ports(n: int) -> list:
    """Returns `n` distinct TCP ports that are free on every interface right now.

    A port is never returned twice by one process, so concurrently built local clusters do
    not collide. TensorFlow's gRPC server binds all interfaces, so the check does too.
    """
    if not is_count(n):
        raise ValueError(f"free_ports(n) needs a non-negative integer. Received: n={n!r}.")
    ports: list = []
    held = []
    try:
        with _RESERVED_LOCK:
            while len(ports) < n:
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                sock.bind(("", 0))
                held.append(sock)  # keep it bound so the OS cannot offer it again now
                port = sock.getsockname()[1]
                if port not in _RESERVED_PORTS:
                    _RESERVED_PORTS.add(port)
                    ports.append(port)
    finally:
        for sock in held:
            sock.close()
    return ports


class ClusterSpec:
    """An immutable description of a TensorFlow cluster and of the current task.

    Args:
        cluster: Mapping. Job name (`chief`, `worker`, `ps`, `evaluator`) -> list of
            "host:port" addresses, in task-index order. An empty mapping means a single
            process with no cluster (plain local training).
        task_type: str. The job of this process. Defaults to the chief, else worker 0.
        task_index: int. The index of this process in its job. Defaults to 0.

    Raises:
        ClusterConfigError: the cluster or the task is invalid; the message says how to fix it.

    Example:

    ```python
    spec = tfdist.ClusterSpec.from_hosts(workers=["node1:2222", "node2:2222"], task_index=1)
    spec.num_workers     # 2
    spec.to_tf_config()  # {"cluster": {"worker": [...]}, "task": {"type": "worker", "index": 1}}
    ```
    """

    __slots__ = ("_jobs", "_task_type", "_task_index")

    def __init__(
        self,
        cluster: Mapping[str, Sequence[str]],
        task_type: Optional[str] = None,
        task_index: Optional[int] = None,
    ):
        jobs = _normalize_cluster(cluster)
        if not jobs:
            if task_type is not None or task_index not in (None, 0):
                raise ClusterConfigError(
                    f"Task {task_type}:{task_index} was given for an empty cluster. HINT: list "
                    "the cluster's jobs, or leave the task out for single-process training."
                )
            task_type, task_index = None, None
        else:
            if task_type is None:
                task_type = "chief" if "chief" in jobs else "worker"
            if task_type not in jobs:
                known = ", ".join(f"{j} ({len(a)} tasks)" for j, a in jobs.items())
                raise ClusterConfigError(
                    f"Task type {task_type!r} is not a job of this cluster, which has: {known}. "
                    "HINT: set task.type to one of these jobs."
                )
            task_index = _parse_index(0 if task_index is None else task_index, "task")
            if task_index >= len(jobs[task_type]):
                raise ClusterConfigError(
                    f"Task {task_type}:{task_index} is not in the cluster: job {task_type!r} has "
                    f"{len(jobs[task_type])} task(s), so the index must be 0 to "
                    f"{len(jobs[task_type]) - 1}. HINT: fix task.index, or add the task's "
                    "address to the job."
                )
        object.__setattr__(self, "_jobs", MappingProxyType(jobs))
        object.__setattr__(self, "_task_type", task_type)
        object.__setattr__(self, "_task_index", task_index)

    def __setattr__(self, name, value):
        raise AttributeError(f"ClusterSpec is immutable; cannot set {name!r}.")

    def __delattr__(self, name):
        raise AttributeError(f"ClusterSpec is immutable; cannot delete {name!r}.")

    def __reduce__(self):
        # copy / deepcopy / pickle rebuild through __init__ (the slots cannot be set directly).
        return (ClusterSpec, (self.cluster, self._task_type, self._task_index))

    # ----------------------------------------------------------------------------- builders

    @classmethod
    def from_tf_config(cls, tf_config: Union[str, Mapping, None] = None) -> "ClusterSpec":
        """Builds a spec from a TF_CONFIG value (JSON string or dict).

        Args:
            tf_config: str | dict | None. The TF_CONFIG value. None reads the `TF_CONFIG`
                environment variable.

        Raises:
            ClusterConfigError: TF_CONFIG is not valid JSON, or describes an invalid cluster.
        """
        if tf_config is None:
            import os

            tf_config = os.environ.get("TF_CONFIG")
            if tf_config is None:
                raise ClusterConfigError(
                    "TF_CONFIG is not set. HINT: export TF_CONFIG (see `tfdist tf-config`), or "
                    "use tfdist.detect_cluster() to fall back to other environments."
                )
        if isinstance(tf_config, (str, bytes)):
            text = tf_config.decode() if isinstance(tf_config, bytes) else tf_config
            try:
                tf_config = json.loads(text)
            except json.JSONDecodeError as err:
                raise ClusterConfigError(
                    f"TF_CONFIG is not valid JSON ({err.msg} at position {err.pos}). Received: "
                    f"{_shorten(text)!r}. HINT: it must look like "
                    '{"cluster": {"worker": ["host:port", ...]}, '
                    '"task": {"type": "worker", "index": 0}}; `tfdist tf-config` writes one.'
                ) from None
        if not isinstance(tf_config, Mapping):
            raise ClusterConfigError(
                "TF_CONFIG must be a JSON object with 'cluster' and 'task'. Received: "
                f"{_shorten(repr(tf_config))} (of type {type(tf_config).__name__}). HINT: "
                'TF_CONFIG=\'{"cluster": {"worker": ["host:port"]}, "task": {"type": "worker", '
                '"index": 0}}\'.'
            )
        unknown_keys = sorted(set(tf_config) - {"cluster", "task", "environment", "rpc_layer"})
        if unknown_keys:
            raise ClusterConfigError(
                f"TF_CONFIG has unknown key(s) {unknown_keys!r}. Expected 'cluster' and 'task' "
                "(and optionally 'environment', 'rpc_layer')."
            )
        cluster = tf_config.get("cluster", {})
        if not cluster:
            raise ClusterConfigError(
                f"TF_CONFIG has no 'cluster' jobs. Received: {_shorten(json.dumps(tf_config))}. "
                "HINT: unset TF_CONFIG for single-process training."
            )
        task = tf_config.get("task")
        if task is None:
            jobs = _normalize_cluster(cluster)
            if sum(len(a) for a in jobs.values()) > 1:
                raise ClusterConfigError(
                    "TF_CONFIG has no 'task', but its cluster has several tasks. Every process "
                    'needs its own task. HINT: add "task": {"type": "worker", "index": 0} (its '
                    "own type and index in each process)."
                )
            return cls(jobs)
        if not isinstance(task, Mapping) or "type" not in task:
            raise ClusterConfigError(
                f'TF_CONFIG \'task\' must look like {{"type": "worker", "index": 0}}. '
                f"Received: {task!r}."
            )
        if task["type"] not in JOB_NAMES:
            raise ClusterConfigError(
                f"TF_CONFIG task type {task['type']!r} is not a known job. Choose from: "
                f"{', '.join(JOB_NAMES)}. HINT: 'master' is the old name of 'chief'."
            )
        return cls(cluster, task["type"], _parse_index(task.get("index", 0), "TF_CONFIG task"))

    @classmethod
    def from_hosts(
        cls,
        workers: Union[str, Sequence[str], None] = None,
        ps: Union[str, Sequence[str], None] = None,
        chief: Optional[str] = None,
        evaluator: Optional[str] = None,
        task_type: str = "worker",
        task_index: int = 0,
    ) -> "ClusterSpec":
        """Builds a spec from explicit addresses.

        Args:
            workers: list of "host:port" (or one comma-separated string). The worker job.
            ps: list of "host:port" (or one comma-separated string). The ps job. Defaults to none.
            chief: str. The chief's "host:port". Defaults to no chief (worker 0 leads).
            evaluator: str. The evaluator's "host:port". Defaults to none.
            task_type: str. This process's job. Defaults to "worker".
            task_index: int. This process's index in its job. Defaults to 0.
        """
        cluster = {}
        for job, value in (
            ("chief", chief),
            ("worker", workers),
            ("ps", ps),
            ("evaluator", evaluator),
        ):
            hosts = _split_hosts(value)
            if hosts:
                cluster[job] = hosts
        if not cluster:
            raise ClusterConfigError(
                "from_hosts() needs at least one address. HINT: "
                "ClusterSpec.from_hosts(workers=['node1:2222', 'node2:2222'])."
            )
        return cls(cluster, task_type, task_index)

    @classmethod
    def local(
        cls,
        workers: int = 1,
        ps: int = 0,
        chief: bool = False,
        evaluator: bool = False,
        task_type: Optional[str] = None,
        task_index: int = 0,
        host: str = "127.0.0.1",
    ) -> "ClusterSpec":
        """Builds a cluster on this machine, on free loopback ports.

        Ports are distinct from those of any other local cluster built by this process.

        Args:
            workers: int. Number of worker tasks (>= 1). Defaults to 1.
            ps: int. Number of parameter-server tasks. Defaults to 0.
            chief: bool. Whether to add a chief task. Defaults to False; a cluster with ps
                tasks always gets one (its coordinator).
            evaluator: bool. Whether to add an evaluator task. Defaults to False.
            task_type / task_index: the current task. Defaults to the chief, else worker 0.
            host: str. The loopback address. Defaults to "127.0.0.1".
        """
        for name, value in (("workers", workers), ("ps", ps)):
            if not is_count(value):
                raise ClusterConfigError(
                    f"local() needs a non-negative integer for {name}. Received: {name}={value!r}. "
                    "HINT: e.g. ClusterSpec.local(workers=2, ps=1)."
                )
        if workers < 1:
            raise ClusterConfigError(
                f"local() needs at least one worker. Received: workers={workers}. HINT: "
                "workers=1 or more."
            )
        counts = {
            "chief": int(bool(chief) or ps > 0),
            "worker": workers,
            "ps": ps,
            "evaluator": int(bool(evaluator)),
        }
        ports = iter(free_ports(sum(counts.values())))
        cluster = {
            job: [f"{host}:{next(ports)}" for _ in range(n)] for job, n in counts.items() if n
        }
        return cls(cluster, task_type, task_index)

    @classmethod
    def from_slurm(
        cls,
        env: Optional[Mapping[str, str]] = None,
        num_ps: Optional[int] = None,
        port: Optional[int] = None,
    ) -> "ClusterSpec":
        """Builds a spec from the variables of a SLURM `srun` step.

        See `tfdist.cluster.slurm.SlurmEnvironment` for the variables read and the task layout.
        """
        # tfdist.cluster.slurm (imported with the tfdist.cluster package, before this module is
        # usable) registers its reader here, so the spec does not import the environments.
        return _ENVIRONMENT_READERS["slurm"](env, num_ps=num_ps, port=port)

    def replace_task(self, task_type: str, task_index: int = 0) -> "ClusterSpec":
        """Returns the same cluster seen from another task."""
        return ClusterSpec(self._jobs, task_type, task_index)

    # ------------------------------------------------------------------------------ queries

    @property
    def cluster(self) -> dict:
        """dict[str, list[str]]: job name -> addresses (a copy)."""
        return _plain(self._jobs)

    @property
    def task_type(self) -> Optional[str]:
        return self._task_type

    @property
    def task_index(self) -> Optional[int]:
        return self._task_index

    @property
    def task_id(self) -> Optional[int]:
        """Alias of `task_index`, in TensorFlow's ClusterResolver vocabulary."""
        return self._task_index

    @property
    def task(self) -> Optional[str]:
        """This task as "type:index" (e.g. "worker:1"), or None for a single process."""
        return None if self._task_type is None else f"{self._task_type}:{self._task_index}"

    @property
    def tasks(self) -> list:
        """Every task of the cluster as (type, index), in TF_CONFIG order."""
        return [(job, i) for job, addresses in self._jobs.items() for i in range(len(addresses))]

    @property
    def is_single_process(self) -> bool:
        """True for a spec with no cluster (plain local training)."""
        return not self._jobs

    @property
    def num_workers(self) -> int:
        """Number of tasks that compute gradients.

        With a ps job these are the workers (the chief coordinates); without one, the chief
        and the workers (as MultiWorkerMirroredStrategy counts them). 1 for a single process.
        """
        if not self._jobs:
            return 1
        if "ps" in self._jobs:
            return len(self._jobs["worker"])
        return len(self._jobs.get("chief", ())) + len(self._jobs.get("worker", ()))

    @property
    def num_ps(self) -> int:
        return len(self._jobs.get("ps", ()))

    @property
    def has_chief(self) -> bool:
        return "chief" in self._jobs

    @property
    def is_chief(self) -> bool:
        """True for the chief, or for worker 0 when there is no chief (or a single process)."""
        if not self._jobs:
            return True
        if self.has_chief:
            return self._task_type == "chief"
        return self._task_type == "worker" and self._task_index == 0

    @property
    def address(self) -> Optional[str]:
        """This task's "host:port", or None for a single process."""
        if not self._jobs:
            return None
        return self._jobs[self._task_type][self._task_index]

    # ------------------------------------------------------------------------------ outputs

    def to_tf_config(
        self, task_type: Optional[str] = None, task_index: Optional[int] = None
    ) -> dict:
        """Returns the TF_CONFIG dict of a task of this cluster (this task by default)."""
        if not self._jobs:
            raise ClusterConfigError(
                "A single-process spec has no TF_CONFIG. HINT: build a cluster with "
                "ClusterSpec.local(workers=2) or ClusterSpec.from_hosts(...)."
            )
        if task_type is None and task_index is None:
            spec = self
        else:
            spec = self.replace_task(
                task_type or self._task_type, 0 if task_index is None else task_index
            )
        return {
            "cluster": spec.cluster,
            "task": {"type": spec._task_type, "index": spec._task_index},
        }

    def to_json(self, task_type: Optional[str] = None, task_index: Optional[int] = None) -> str:
        """Returns `to_tf_config(...)` as a compact JSON string, ready for TF_CONFIG."""
        return json.dumps(self.to_tf_config(task_type, task_index), separators=(",", ":"))

    def to_tf(self):
        """Returns the cluster as a `tf.train.ClusterSpec`."""
        import tensorflow as tf

        return tf.train.ClusterSpec(self.cluster)

    def resolver(self, rpc_layer: str = "grpc"):
        """Returns a `SimpleClusterResolver` for this cluster and task."""
        import tensorflow as tf

        return tf.distribute.cluster_resolver.SimpleClusterResolver(
            self.to_tf(), task_type=self._task_type, task_id=self._task_index, rpc_layer=rpc_layer
        )

    # ------------------------------------------------------------------------- value object

    def _key(self):
        return (tuple(self._jobs.items()), self._task_type, self._task_index)

    def __eq__(self, other):
        if not isinstance(other, ClusterSpec):
            return NotImplemented
        return self._key() == other._key()

    def __hash__(self):
        return hash(self._key())

    def __repr__(self):
        jobs = ", ".join(f"{job}={len(a)}" for job, a in self._jobs.items()) or "single process"
        task = f", task={self.task}" if self._jobs else ""
        return f"<ClusterSpec {jobs}{task}>"


def _split_hosts(value: Union[str, Iterable[str], None]) -> list:
    if value is None:
        return []
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    return list(value)


def _shorten(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else text[:limit] + "..."
