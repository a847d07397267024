"""The README demo: train a digit classifier as two real local jobs, then report.

    make demo        (or: python examples/demo.py)

1. what tfdist sees on this machine (`tfdist env`);
2. `tfdist launch --workers 2 examples/train.py`: multi_worker_mirrored, 2 processes;
3. `tfdist launch --workers 2 --ps 1 examples/train.py --embedding_shards 1`: parameter-server
   training, the chief coordinating, 2 workers and 1 ps serving;
each prints the held-out accuracy of scikit-learn's digits (chance: 0.10) and where the
trained weights are.
"""

import io
import json
import os
import re
import subprocess
import sys
import tempfile

import tfdist

HERE = os.path.dirname(os.path.abspath(__file__))


def train(title, out_dir, **job):
    print(f"\n== {title}", flush=True)
    log = io.StringIO()

    class Tee:
        def write(self, text):
            log.write(text)
            sys.stdout.write(text)

        def flush(self):
            sys.stdout.flush()

    args = ["--epochs", "6", "--model_dir", out_dir] + job.pop("args", [])
    # the launcher hides TensorFlow's start-up noise (`tfdist launch --verbose` shows it)
    codes = tfdist.launch(os.path.join(HERE, "train.py"), args, timeout=900, out=Tee(), **job)
    accuracy = re.search(r"held-out accuracy ([0-9.]+)", log.getvalue())
    return codes, float(accuracy.group(1)) if accuracy else None


def environment_report() -> dict:
    """`tfdist env --json`, in its own process: TensorFlow's start-up lines stay there (and are
    shown only if it fails)."""
    proc = subprocess.run(
        [sys.executable, "-m", "tfdist", "env", "--json"], capture_output=True, text=True
    )
    if proc.returncode not in (0, 1):  # 1: the detected cluster is invalid; still a report
        sys.stderr.write(proc.stderr)
        raise SystemExit(f"`tfdist env` failed with exit code {proc.returncode}")
    return json.loads(proc.stdout)


def main() -> int:
    print("== This machine, as tfdist sees it (tfdist env)")
    report = environment_report()
    for key in ("tensorflow", "keras", "keras_flavour"):
        print(f"  {key:14} {report[key]}")
    print(f"  {'replicas':14} {', '.join(report['replica_devices'])}")
    root = tempfile.mkdtemp(prefix="tfdist-demo-")
    results = {
        "multi_worker_mirrored (2 workers)": train(
            "tfdist launch --workers 2 examples/train.py",
            os.path.join(root, "multi_worker"),
            workers=2,
        ),
        "parameter_server (2 workers + 1 ps)": train(
            "tfdist launch --workers 2 --ps 1 examples/train.py --embedding_shards 1",
            os.path.join(root, "parameter_server"),
            workers=2,
            ps=1,
            args=["--embedding_shards", "1"],
        ),
    }
    print("\n== Summary (held-out digits, chance = 0.100)")
    ok = True
    for name, (codes, accuracy) in results.items():
        good = all(code == 0 for code in codes.values()) and accuracy is not None and accuracy > 0.8
        ok &= good
        shown = f"{accuracy:.3f}" if accuracy is not None else "n/a"
        print(f"  {name:38} accuracy {shown}  {'OK' if good else 'FAILED'}")
    print(f"  weights saved under {root}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
