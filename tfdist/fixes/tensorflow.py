"""TensorFlow internals tfdist reads, at the path each release family keeps them.

Nothing here imports TensorFlow at import time. May import: tfdist.fixes.record.
"""

from tfdist.fixes.record import Internal

# The coordination service's protobufs moved with TensorFlow's TSL: tensorflow.tsl (2.16),
# tensorflow.compiler.xla.tsl (2.17-2.19, then partly), ... The eager context imports the module
# it uses itself, so its own reference is right on every release; the others are fallbacks.
COORDINATION_CONFIG = Internal(
    name="coordination_config_pb2",
    used_for="a bounded wait for the peers of a multi-worker job",
    paths=(
        "tensorflow.python.eager.context:coordination_config_pb2",
        "tsl.protobuf.coordination_config_pb2",
        "tensorflow.compiler.xla.tsl.protobuf.coordination_config_pb2",
        "tensorflow.tsl.protobuf.coordination_config_pb2",
    ),
)

INTERNALS = (COORDINATION_CONFIG,)
