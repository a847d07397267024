"""The distributed input pipeline: global batches, sharding per input pipeline, prefetching.

    dist_ds = tfdist.distribute_dataset(dataset, strategy, global_batch_size=256)
    dataset_fn = tfdist.data.dataset_fn_for((x, y), global_batch_size=256, shuffle=True)

Global batch semantics: the batch size you give is the *global* batch, summed over every
replica of every worker. Each replica gets `global_batch_size / num_replicas_in_sync`
examples a step, so a global batch that the replica count does not divide is refused. A
`tf.data.Dataset` passed without `global_batch_size` is taken as already batched with the
global batch (the Keras convention for `model.fit(dataset)`).

Sharding: each input pipeline (one per worker) reads a disjoint part of the data, so one
epoch sees every example exactly once across the job. A dataset that reads files is sharded
by FILE (each worker opens only its files) when every worker gets at least one file;
otherwise by DATA (every worker reads everything and keeps its share), with a one-time
warning that says why.

- `inputs`: what kind of input the data are (arrays, a dataset, a dataset function),
  classified once into an `Input` that the other steps take.
- `batch_sizes`: the per-replica batch, the steps of one pass, splitting batched data.
- `features`: `features=`, parsing batches of tf.train.Example records, and its checks.
- `dataset_graph`: what a dataset's graph reads (files, and how many), for the shard decision.
- `sharding`: `shard_policy` (FILE, DATA or OFF, and why) and the DATA-sharding warning.
- `pipeline`: map, shuffle, repeat, batch and parse after sharding; small-host tuning.
- `dataset_functions`: `dataset_fn_for`, one input pipeline's dataset from a function.
- `distributing`: `distribute_dataset`, for mirrored and multi_worker_mirrored.

Nothing here imports TensorFlow at import time.
"""

from tfdist.data.batch_sizes import per_replica_batch_size, steps_per_pass
from tfdist.data.dataset_functions import dataset_fn_for
from tfdist.data.distributing import distribute_dataset
from tfdist.data.inputs import Input, classify
from tfdist.data.pipeline import DEFAULT_SHUFFLE_BUFFER, SMALL_HOST_CORES
from tfdist.data.sharding import SHARED_SEED, shard_policy

__all__ = [
    "DEFAULT_SHUFFLE_BUFFER",
    "SHARED_SEED",
    "SMALL_HOST_CORES",
    "Input",
    "classify",
    "dataset_fn_for",
    "distribute_dataset",
    "per_replica_batch_size",
    "shard_policy",
    "steps_per_pass",
]
