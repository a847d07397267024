"""A cluster with every job, for the ClusterSpec tests with and without TensorFlow."""

FULL = {
    "chief": ["c0:2222"],
    "worker": ["w0:2222", "w1:2222"],
    "ps": ["p0:2222"],
    "evaluator": ["e0:2222"],
}
FULL_TASKS = [("chief", 0), ("worker", 0), ("worker", 1), ("ps", 0), ("evaluator", 0)]
