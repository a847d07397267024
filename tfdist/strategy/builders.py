"""The builders: one function per strategy that makes it from checked arguments.

`tfdist.strategy.registry` names each strategy's builder here (`Strategy.build`);
`make_strategy` checks the arguments first, and does what the process needs around the build
(`tfdist.strategy.factory`). Each builder takes keyword arguments: cluster, devices (as given,
or None), found (the local devices), communication (already checked for the strategy),
compression (None, or a mode the strategy takes), and the strategy's own options. The
multi-worker builder lives with its once-per-process cache (`tfdist.strategy.multi_worker`).
TensorFlow is imported inside functions only.
"""

from __future__ import annotations

from typing import Callable, Dict

from tfdist import settings
from tfdist.strategy.communication import mirrored_cross_device_ops
from tfdist.strategy.compression import compressed_cross_device_ops
from tfdist.strategy.devices import gpus_share_a_device
from tfdist.strategy.multi_worker import build_multi_worker
from tfdist.strategy.peers import wait_for_peers

__all__ = [
    "build_default",
    "build_mirrored",
    "build_multi_worker",
    "build_one_device",
    "build_parameter_server",
]


def build_default(**_):
    import tensorflow as tf

    return tf.distribute.get_strategy()


def build_one_device(*, devices, found, **_):
    import tensorflow as tf

    if devices is not None and len(devices) != 1:
        raise ValueError(
            f"one_device takes exactly one device. Received: devices={devices!r}. HINT: use "
            "'mirrored' for several devices."
        )
    return tf.distribute.OneDeviceStrategy((devices or found)[0])


def build_mirrored(*, devices, found, communication, cross_device_ops=None, compression=None, **_):
    import tensorflow as tf

    if cross_device_ops is not None and communication != "auto":
        raise ValueError(
            f"Pass either communication={communication!r} or cross_device_ops=, not both."
        )
    if cross_device_ops is None:
        cross_device_ops = mirrored_cross_device_ops(
            communication, found, gpus_share_a_device(found)
        )
    if compression is not None:
        cross_device_ops = compressed_cross_device_ops(cross_device_ops, compression)
    return tf.distribute.MirroredStrategy(
        devices=devices or found, cross_device_ops=cross_device_ops
    )


def _partitioner(
    variable_partitioner, num_ps: int, min_shard_bytes=None, max_shard_bytes=None, max_shards=None
):
    import tensorflow as tf

    partitioners = tf.distribute.experimental.partitioners
    sizes = {
        "min_shard_bytes": min_shard_bytes,
        "max_shard_bytes": max_shard_bytes,
        "max_shards": max_shards,
    }
    if not isinstance(variable_partitioner, str):
        given = sorted(k for k, v in sizes.items() if v is not None)
        if given:
            raise ValueError(
                f"{', '.join(given)} go(es) with variable_partitioner='min_size', 'max_size' "
                "or 'fixed', not with a partitioner object."
            )
        return variable_partitioner
    shards = num_ps if max_shards is None else max_shards
    table: Dict[str, Callable] = {
        "min_size": lambda: partitioners.MinSizePartitioner(
            min_shard_bytes=256 << 10 if min_shard_bytes is None else min_shard_bytes,
            max_shards=shards,
        ),
        "max_size": lambda: partitioners.MaxSizePartitioner(
            max_shard_bytes=256 << 10 if max_shard_bytes is None else max_shard_bytes,
            max_shards=max_shards,
        ),
        "fixed": lambda: partitioners.FixedShardsPartitioner(num_shards=shards),
    }
    if variable_partitioner not in table:
        raise ValueError(
            f"variable_partitioner={variable_partitioner!r} is not known. Choose one of: "
            f"{', '.join(table)}, or pass a tf.distribute.experimental.partitioners object."
        )
    return table[variable_partitioner]()


def build_parameter_server(
    *,
    cluster,
    variable_partitioner=None,
    min_shard_bytes=None,
    max_shard_bytes=None,
    max_shards=None,
    startup_timeout=None,
    **_,
):
    """The chief's ParameterServerStrategy (the worker and ps tasks serve: `make_strategy`)."""
    import tensorflow as tf

    partitioner = _partitioner(
        variable_partitioner, cluster.num_ps, min_shard_bytes, max_shard_bytes, max_shards
    )
    # TensorFlow's coordinator waits for every worker and ps without a limit; wait first,
    # bounded and interruptibly, so that a task that never comes is an error naming it.
    wait_for_peers(
        cluster,
        [task for task in cluster.tasks if task[0] in ("worker", "ps")],
        settings.STARTUP_TIMEOUT.get() if startup_timeout is None else startup_timeout,
        purpose="connect to the parameter-server cluster",
        listen=False,
    )
    spec = cluster.to_tf()
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        spec,
        task_type="chief" if cluster.has_chief else None,
        task_id=0 if cluster.has_chief else None,
        rpc_layer="grpc",
    )
    return tf.distribute.ParameterServerStrategy(resolver, variable_partitioner=partitioner)
