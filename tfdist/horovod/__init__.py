"""Horovod's API on tf.distribute's collectives: Horovod training scripts on TensorFlow 2.16+.

- `tfdist.horovod.tensorflow` is `horovod.tensorflow`: init, size, rank, local_* and cross_*,
  allreduce, grouped_allreduce, allgather, broadcast, broadcast_variables, broadcast_object,
  alltoall, join, DistributedGradientTape, DistributedOptimizer, Compression.
- `tfdist.horovod.tensorflow.keras` is `horovod.tensorflow.keras`, with its `callbacks`.
- `tfdist horovodrun -np N python train.py` starts the processes, like `horovodrun`; a script
  that imports `horovod` gets these modules there when Horovod itself is not installed
  (`tfdist.horovod.shim`).

The concepts, one module each: `process` (ranks from the environment), `runtime` (init and the
collective group), `collectives`, `compression`, `gradients` (the tape and the reduction),
`optimizer`, `callbacks`, `unsupported` (what Horovod has and tfdist does not), `shim`.
Importing this package imports nothing of TensorFlow.
"""
