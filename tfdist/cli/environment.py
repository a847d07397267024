"""`tfdist env`: versions, devices, NCCL, the cluster, the "auto" strategy and precision.

`environment_report()` gathers it as a dict (`tfdist env --json` prints it as is, `tfdist
doctor` starts with it); `release_report()` is its part about the tested releases and the state
of each fix.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from typing import Mapping

from tfdist import settings
from tfdist.cluster import ClusterConfigError, detect_environment


def add_commands(sub) -> None:
    """Adds `env` to the subparsers `sub`."""
    env = sub.add_parser("env", help="report versions, devices, cluster and the auto strategy")
    env.add_argument("--json", action="store_true", help="print JSON for machines")


def environment_report() -> dict:
    """What `tfdist env` prints: versions, devices, NCCL, cluster, the "auto" strategy."""
    import tensorflow as tf

    from tfdist import flavour
    from tfdist.strategy import local_devices

    report = dict(flavour.versions())
    report["python"] = sys.version.split()[0]
    report["releases"] = release_report(report)
    report["physical_devices"] = [d.name for d in tf.config.list_physical_devices()]
    devices = local_devices()
    report["replica_devices"] = devices
    gpus = tf.config.list_physical_devices("GPU")
    report["gpus"] = gpu_report(tf, gpus)
    report["nccl"] = {
        "usable": bool(gpus) and tf.test.is_built_with_cuda(),
        "reason": (
            "every replica is a GPU and TensorFlow is built with CUDA (its NCCL is inside); "
            "`tfdist doctor` all-reduces through it where there are 2 GPUs or more"
            if gpus and tf.test.is_built_with_cuda()
            else "no GPU found: collectives use ring (gRPC) / reduce-to-one-device"
        ),
    }
    report["environment_variables"] = {
        k: v
        for k, v in sorted(os.environ.items())
        if k in ("TF_CONFIG", "TF_USE_LEGACY_KERAS", "CUDA_VISIBLE_DEVICES")
        or k.startswith(settings.PREFIX)
    }
    report.update(_cluster_report(devices))
    return report


def gpu_report(tf, seen) -> dict:
    """The GPUs: what the driver lists (nvidia-smi), what TensorFlow sees (`seen`, its physical
    GPUs) with their compute capability, and the CUDA / cuDNN TensorFlow was built with."""
    from tfdist import gpus as gpu_lib

    build = tf.sysconfig.get_build_info()
    tensorflow_sees = []
    for gpu in seen:
        details = tf.config.experimental.get_device_details(gpu)
        capability = details.get("compute_capability")
        tensorflow_sees.append(
            {
                "device": gpu.name,
                "name": details.get("device_name"),
                "compute_capability": ".".join(map(str, capability)) if capability else None,
            }
        )
    listed = gpu_lib.describe()
    report = {
        "driver_lists": listed,
        "tensorflow_sees": tensorflow_sees,
        "cuda_build": bool(build.get("is_cuda_build")),
        "cuda_version": build.get("cuda_version"),
        "cudnn_version": build.get("cudnn_version"),
    }
    if listed and not seen:
        report["problem"] = (
            f"TensorFlow sees none of the {len(listed)} GPU(s) the driver lists"
            + (
                f" (CUDA_VISIBLE_DEVICES={os.environ['CUDA_VISIBLE_DEVICES']!r} hides them)"
                if "CUDA_VISIBLE_DEVICES" in os.environ
                else ""
            )
            + (
                '. HINT: pip install "tensorflow[and-cuda]" (this TensorFlow is built without CUDA)'
                if not report["cuda_build"]
                else f". HINT: a driver for CUDA {report['cuda_version']} or newer, and the CUDA "
                "libraries that tensorflow[and-cuda] installs"
            )
        )
    return report


def _print_gpus(report: dict) -> None:
    gpus = report["gpus"]
    listed = [
        f"{g['index']} {g['name']} (compute capability {g['compute_capability'] or '?'}, "
        f"{g['memory_mib'] if g['memory_mib'] is not None else '?'} MiB)"
        for g in gpus["driver_lists"]
    ]
    print(f"{'gpus':16} {'; '.join(listed) if listed else 'none (nvidia-smi lists none)'}")
    seen = [
        f"{g['device']} {g['name']} ({g['compute_capability']})" for g in gpus["tensorflow_sees"]
    ]
    print(f"{'tensorflow gpus':16} {'; '.join(seen) if seen else 'none'}")
    if gpus["cuda_build"]:
        built = f"CUDA {gpus['cuda_version']}, cuDNN {gpus['cudnn_version']}"
    else:
        built = "without CUDA (a CPU build)"
    print(f"{'built with':16} {built}")
    if "problem" in gpus:
        print(f"{'gpu problem':16} {gpus['problem']}")


def _cluster_report(devices) -> dict:
    """The report's "cluster" and "auto_strategy" (and "precision", for a valid cluster)."""
    from tfdist.strategy import resolve_strategy_name

    try:
        environment = detect_environment()
        spec = environment.cluster_spec()
        report = {
            "cluster": {
                "detected_from": environment.name,
                "jobs": spec.cluster,
                "task": spec.task,
                "num_workers": spec.num_workers,
                "num_ps": spec.num_ps,
                "is_chief": spec.is_chief,
            }
        }
        report["auto_strategy"] = resolve_strategy_name("auto", spec, devices)
        from tfdist.precision import auto_precision

        report["precision"] = auto_precision(devices)
    except ClusterConfigError as err:
        report = {"cluster": {"error": str(err)}, "auto_strategy": None}
    return report


def release_report(versions: Mapping[str, str]) -> dict:
    """Where these releases stand against the tested matrix, and each fix's state."""
    from tfdist import fixes, releases

    here = releases.support(versions["tensorflow"], versions["keras"], versions["keras_flavour"])
    return {
        "support": here.status,
        "message": here.message,
        "matrix": [dataclasses.asdict(r) for r in releases.MATRIX],
        "fixes": [status.as_dict() for status in fixes.report()],
    }


def _print_releases(report: dict) -> None:
    releases = report["releases"]
    print(f"{'releases':16} {releases['support']}: {releases['message']}")
    pairs = ", ".join(f"{r['tensorflow']}+{r['keras']}" for r in releases["matrix"])
    print(f"{'tested pairs':16} TensorFlow+Keras {pairs} (each with its tf_keras)")
    for status in releases["fixes"]:
        print(f"{'fix':16} {status['name']}: {status['state']} ({status['reason']})")


def _print_cluster(report: dict) -> None:
    cluster = report["cluster"]
    if "error" in cluster:
        print(f"{'cluster':16} INVALID: {cluster['error']}")
        return
    print(f"{'cluster':16} {cluster['jobs'] or 'single process'} (from {cluster['detected_from']})")
    print(f"{'task':16} {cluster['task'] or '-'}{' (chief)' if cluster['is_chief'] else ''}")


def print_report(report: dict) -> None:
    """Prints `report` (an `environment_report()`) as `tfdist env` does: one line a fact."""
    for key in ("tensorflow", "keras", "keras_flavour", "python"):
        print(f"{key:16} {report[key]}")
    _print_releases(report)
    print(f"{'devices':16} {', '.join(report['physical_devices'])}")
    print(f"{'replicas':16} {', '.join(report['replica_devices'])}")
    _print_gpus(report)
    print(f"{'nccl':16} {'yes' if report['nccl']['usable'] else 'no'} ({report['nccl']['reason']})")
    _print_cluster(report)
    print(f"{'auto strategy':16} {report['auto_strategy']}")
    if "precision" in report:
        print(
            f"{'auto precision':16} {report['precision']['policy']} "
            f"({report['precision']['reason']})"
        )
    for key, value in report["environment_variables"].items():
        print(f"{key:16} {value}")


def env_command(args) -> int:
    """Prints the report (JSON with `--json`); returns 1 when the detected cluster is invalid."""
    report = environment_report()
    if args.json:
        print(json.dumps(report, indent=2, sort_keys=True))
    else:
        print_report(report)
    return 1 if "error" in report["cluster"] else 0
