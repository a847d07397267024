"""Clusters and device lists for the strategy tests with and without TensorFlow."""

from tfdist import ClusterSpec

SINGLE = ClusterSpec({})
TWO_WORKERS = ClusterSpec.from_hosts(workers=["a:1", "b:1"])
CHIEF_AND_WORKER = ClusterSpec.from_hosts(workers=["a:1"], chief="c:1", task_type="chief")
ONE_WORKER = ClusterSpec.from_hosts(workers=["a:1"])
PS_JOB = ClusterSpec.from_hosts(workers=["a:1", "b:1"], ps=["p:1"], chief="c:1", task_type="chief")
CPU1, CPU4, GPU2 = ["/cpu:0"], [f"/cpu:{i}" for i in range(4)], ["/gpu:0", "/gpu:1"]
