"""Strategies: one name -> one real `tf.distribute.Strategy`, and what it runs on.

- `registry`: one record per strategy, with every fact about it (names, options, communication
  choices, processes, ps job, all-reduce, when "auto" picks it, its test pool, its builder);
  every list, rule and message about strategies in tfdist derives from it.
- `factory`: `make_strategy` (its effects on the process in one step) and the pure
  `resolve_strategy_name` ("auto").
- `devices`: local GPUs or logical CPUs (`virtual_cpus`).
- `communication`: the `communication=` vocabulary and the TensorFlow options it becomes.
- `builders`: one builder per strategy (the one device, mirrored, default and
  parameter-server strategies; the multi-worker one from `multi_worker`).
- `multi_worker`: MultiWorkerMirroredStrategy, once per process, and its exit barrier (the
  coordination leader leaves last).
- `compression`: gradient compression (bf16, fp16) of the all-reduce.
- `gloo`: `communication="gloo"`, the all-reduce over torch.distributed's Gloo (CPU workers).
- `servers`: the worker and ps servers of a parameter-server job.
- `peers`: the wait for a job's peers: bounded, ended by SIGTERM / SIGINT, naming who is missing.

Nothing here imports TensorFlow at import time.
"""

from tfdist.strategy.communication import collective_options, mirrored_cross_device_ops
from tfdist.strategy.devices import local_devices, runtime_initialized, virtual_cpus
from tfdist.strategy.factory import make_strategy, resolve_strategy_name
from tfdist.strategy.multi_worker import exit_barrier
from tfdist.strategy.registry import COMMUNICATIONS, STRATEGIES, STRATEGY_NAMES
from tfdist.strategy.servers import serve, server_config, start_local_servers

__all__ = [
    "COMMUNICATIONS",
    "STRATEGIES",
    "STRATEGY_NAMES",
    "collective_options",
    "exit_barrier",
    "local_devices",
    "make_strategy",
    "mirrored_cross_device_ops",
    "resolve_strategy_name",
    "runtime_initialized",
    "serve",
    "server_config",
    "start_local_servers",
    "virtual_cpus",
]
