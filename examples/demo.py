"""The README demo: what tfdist sees on this machine, then a real 2-process job on loopback.

    make demo        (or: python examples/demo.py)
"""

import os
import sys

import tfdist
from tfdist.cli import environment_report


def main() -> int:
    print("== This machine, as tfdist sees it (tfdist env)")
    report = environment_report()
    for key in ("tensorflow", "keras", "keras_flavour"):
        print(f"  {key:14} {report[key]}")
    print(f"  {'replicas':14} {', '.join(report['replica_devices'])}")
    print(f"  {'auto strategy':14} {report['auto_strategy']}")

    print("\n== A local 2-worker cluster on free loopback ports (tfdist tf-config)")
    spec = tfdist.ClusterSpec.local(workers=2)
    for job, index in spec.tasks:
        print(f"  {job}:{index}  TF_CONFIG={spec.to_json(job, index)}")

    print("\n== tfdist launch --workers 2 examples/allreduce.py")
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "allreduce.py")
    codes = tfdist.launch(script, workers=2, timeout=300,
                          extra_env={"TF_CPP_MIN_LOG_LEVEL": "2"})
    ok = all(code == 0 for code in codes.values())
    print(f"\n== exit codes: {codes} -> {'OK' if ok else 'FAILED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
