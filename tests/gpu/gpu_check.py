"""The prepared GPU check: `make test-gpu` (or `python3 tests/gpu/gpu_check.py`) on a Linux
machine with an NVIDIA GPU and its driver, where nothing but Python and pip is installed.

    python3 tests/gpu/gpu_check.py                 # build the venv, run every step
    OUT=/tmp/gpu python3 tests/gpu/gpu_check.py    # the results into /tmp/gpu
    python3 tests/gpu/gpu_check.py --python .venv/bin/python --rehearse   # on CPUs, no build

It records the host (nvidia-smi, cores, Python), builds its own virtualenv (uv, bootstrapped
with `pip install --target`, which needs no root and works where the system Python is
"externally managed"; a Python of the tested range, which uv fetches if the system's is
outside it; then `tensorflow[and-cuda]`, Keras and tf_keras of the newest tested pair, and
this checkout), then runs each step of tests/gpu/gpu_steps.py in a process of its own, with
a time limit of its own, so that one failing or hanging step does not stop the others. The
whole check keeps to a budget (8 minutes by default): a step that would start after it is
recorded as not run. It writes `gpu-check.md` and `gpu-check.json` (and one log per step) to
$OUT when set, else to a folder it prints, and exits 0 when every step passed.

Only the standard library here: it runs before any venv exists.
"""

import argparse
import datetime
import importlib.util
import json
import os
import platform
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
STEPS_FILE = os.path.join(HERE, "gpu_steps.py")
MARK = "GPU_STEP "

# name -> (seconds it may take at most, what it checks). In the order they run: the most
# telling first, so that a short budget still says the most.
STEPS = {
    "devices": (90, "TensorFlow sees the GPU; the CUDA and cuDNN it was built with"),
    "one_device_fit": (90, "fit under make_strategy() on the GPU converges"),
    "mirrored_two_logical_gpus": (90, "mirrored over 2 logical GPUs: weights equal one device"),
    "mixed_bfloat16_fit": (75, "fit under mixed_bfloat16 converges"),
    "mixed_float16_fit": (75, "fit under mixed_float16 converges, with loss scaling"),
    "jit_compile_fit": (90, "fit with jit_compile=True converges"),
    "multi_worker_two_processes": (
        180,
        "tfdist launch --workers 2 --gpus-per-worker shared: 2 processes on the one GPU",
    ),
    "nccl_two_logical_gpus": (100, "an NCCL all-reduce between 2 logical GPUs: its outcome"),
    "fit_against_custom_loop": (120, "steps/s of fit against a custom loop (ratio)"),
    "one_device_fit_tf_keras": (120, "fit under tf_keras (TF_USE_LEGACY_KERAS=1) converges"),
    "slurm_gpu_share": (60, "a SLURM task of 2 on the one GPU keeps it and grows its memory"),
}
BUDGET_SECONDS = 480
BUILD_SECONDS = 300


def _releases():
    """tfdist/releases.py, loaded from its file (it imports nothing of tfdist's)."""
    spec = importlib.util.spec_from_file_location(
        "tfdist_releases", os.path.join(REPO, "tfdist", "releases.py")
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _run(command, timeout, env=None, cwd=None):
    """(exit code or "timeout", output) of `command`, bounded; never raises for the command."""
    try:
        done = subprocess.run(
            command,
            env=env,
            cwd=cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=timeout,
            check=False,
        )
        return done.returncode, done.stdout
    except subprocess.TimeoutExpired as err:
        output = err.output.decode() if isinstance(err.output, bytes) else (err.output or "")
        return "timeout", output
    except OSError as err:
        return "error", str(err)


def host_facts():
    """What the machine is: nvidia-smi's GPUs and driver, cores, Python, OS."""
    facts = {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
    }
    smi = shutil.which("nvidia-smi")
    if smi is None:
        facts["nvidia_smi"] = "not found"
        return facts
    code, output = _run(
        [smi, "--query-gpu=index,name,memory.total,driver_version,compute_cap",
         "--format=csv,noheader"],
        timeout=30,
    )  # fmt: skip
    facts["nvidia_smi"] = output.strip() if code == 0 else f"exit {code}: {output.strip()[-500:]}"
    return facts


def _python_in_range(text_range):
    low, high = (tuple(int(p) for p in end.split(".")) for end in text_range.split("-"))
    return low <= sys.version_info[:2] <= high


def build_venv(directory, log, cuda=True):
    """Builds the venv in `directory` (`cuda`: TensorFlow's CUDA libraries, else TensorFlow
    alone, for a rehearsal); returns (python path or None, what happened)."""
    newest = _releases().NEWEST
    packages = [
        f"tensorflow{'[and-cuda]' if cuda else ''}=={newest.tensorflow}",
        f"keras=={newest.keras}",
        f"tf_keras=={newest.tf_keras}",
    ]
    record = {"packages": packages, "steps": []}
    deadline = time.monotonic() + BUILD_SECONDS

    def step(what, command, env=None):
        left = deadline - time.monotonic()
        if left <= 0:
            record["steps"].append({"what": what, "outcome": "not run: build time ran out"})
            return False
        started = time.monotonic()
        code, output = _run(command, timeout=left, env=env)
        log.write(f"$ {' '.join(command)}\n{output}\n")
        log.flush()
        outcome = "ok" if code == 0 else f"failed (exit {code})"
        record["steps"].append(
            {"what": what, "outcome": outcome, "seconds": round(time.monotonic() - started, 1)}
        )
        return code == 0

    venv = os.path.join(directory, "venv")
    python = os.path.join(venv, "bin", "python")
    tools = os.path.join(directory, "uv")
    shutil.rmtree(venv, ignore_errors=True)  # a fresh venv each run: nothing left from before
    uv = os.path.join(tools, "bin", "uv")
    bootstrap = [sys.executable, "-m", "pip", "install", "-q", "--upgrade", "--target", tools, "uv"]
    if step("uv, into a folder", bootstrap):
        wanted = sys.executable if _python_in_range(newest.python) else "3.12"
        record["python"] = wanted
        ok = step("the venv (uv)", [uv, "venv", "-q", "--python", wanted, venv]) and step(
            "TensorFlow with CUDA, Keras, tf_keras, tfdist (uv)",
            [uv, "pip", "install", "-q", "--python", python, *packages, "-e", REPO],
        )
    else:  # no uv: the standard library's venv and pip (slower)
        record["python"] = sys.executable
        ok = step("the venv (python -m venv)", [sys.executable, "-m", "venv", venv]) and step(
            "TensorFlow with CUDA, Keras, tf_keras, tfdist (pip)",
            [python, "-m", "pip", "install", "-q", *packages, "-e", REPO],
        )
    record["outcome"] = "ok" if ok else "failed"
    return (python if ok else None), record


def parse(output):
    for line in reversed(output.splitlines()):
        if line.startswith(MARK):
            try:
                return json.loads(line[len(MARK) :])
            except ValueError:
                return None
    return None


def run_step(name, python, logs, timeout, env=None):
    """Runs one step in a process of its own for at most `timeout` s; returns its result."""
    environ = dict(os.environ if env is None else env)
    environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    started = time.monotonic()
    code, output = _run([python, STEPS_FILE, name], timeout=timeout, env=environ, cwd=HERE)
    with open(os.path.join(logs, f"{name}.log"), "w") as log:
        log.write(output)
    result = parse(output) or {}
    if code == "timeout":
        result = {"outcome": "timeout", "error": f"no result in {timeout:g} s"}
    elif not result:
        tail = " | ".join(output.strip().splitlines()[-5:])
        result = {"outcome": "failed", "error": f"exit {code}, no result line: {tail}"}
    result["seconds"] = round(time.monotonic() - started, 1)
    return result


def _summary(name, result):
    if result.get("outcome") != "ok":
        return result.get("error", "")[:300].replace("\n", " ").replace("|", "/")
    keys = {
        "devices": lambda r: (
            ", ".join(f"{g['name']} ({g['compute_capability']})" for g in r.get("gpus", []))
            + f"; CUDA {r.get('cuda')}, cuDNN {r.get('cudnn')}"
        ),
        "mirrored_two_logical_gpus": lambda r: (
            f"{r['cross_device_ops']}, max weight difference {r['max_weight_difference']:.3g}"
        ),
        "nccl_two_logical_gpus": lambda r: (
            f"NCCL: {r['nccl_outcome']} "
            + (r["nccl"].get("error", "") or f"{r['nccl'].get('bus_gb_per_s')} GB/s")
        ),
        "fit_against_custom_loop": lambda r: (
            f"fit {r['fit_steps_per_s']} steps/s, loop {r['custom_loop_steps_per_s']}: "
            f"{r['ratio_fit_to_loop']}x"
        ),
        "multi_worker_two_processes": lambda r: "; ".join(
            f"loss {w['loss_first']} -> {w['loss_last']}, peak {w.get('peak_memory_mib')} MiB"
            for w in r["workers"]
        ),
    }
    if name in keys:
        try:
            return keys[name](result).replace("|", "/")
        except (KeyError, TypeError):
            pass
    if "loss_last" in result:
        return f"loss {result['loss_first']} -> {result['loss_last']}"
    return ""


def markdown(report):
    lines = [
        "# tfdist GPU check",
        "",
        f"- started: {report['started']}; took {report['seconds']} s "
        f"(budget {report['budget_seconds']} s)"
        + (" - REHEARSAL on CPUs" if report["rehearse"] else ""),
        f"- host: {report['host']['platform']}, {report['host']['cpu_count']} cores, "
        f"Python {report['host']['python']}",
        f"- nvidia-smi: {report['host'].get('nvidia_smi')}",
        f"- venv: {report['build'].get('outcome')} ({report['build'].get('packages', 'given')})",
        "",
        "| step | outcome | seconds | result |",
        "| --- | --- | --- | --- |",
    ]
    for name, result in report["steps"].items():
        lines.append(
            f"| {name} | {result['outcome']} | {result.get('seconds', '')} | "
            f"{_summary(name, result)} |"
        )
    lines += ["", f"passed: {report['passed']} of {len(report['steps'])} steps"]
    return "\n".join(lines) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="tests/gpu/gpu_check.py", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--python", help="a Python with TensorFlow and tfdist: no venv is built")
    parser.add_argument(
        "--rehearse", action="store_true", help="run the steps on CPUs (TensorFlow without CUDA)"
    )
    parser.add_argument(
        "--venv", default=os.path.join(REPO, "build", "gpu-venv"), help="where to build the venv"
    )
    parser.add_argument("--only", help="comma-separated steps (default: all)")
    parser.add_argument("--budget", type=float, default=BUDGET_SECONDS, help="seconds, all told")
    args = parser.parse_args(argv)
    started = time.monotonic()
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    out = os.environ.get("OUT") or os.path.join(REPO, "build", f"gpu-check-{stamp}")
    logs = os.path.join(out, "logs")
    os.makedirs(logs, exist_ok=True)
    print(f"tfdist GPU check: results in {out}", flush=True)
    names = list(STEPS) if not args.only else args.only.split(",")
    unknown = [n for n in names if n not in STEPS]
    if unknown:
        parser.error(f"unknown steps {unknown}; the steps are: {', '.join(STEPS)}")
    report = {
        "started": datetime.datetime.now().isoformat(timespec="seconds"),
        "budget_seconds": args.budget,
        "rehearse": args.rehearse,
        "host": host_facts(),
        "steps": {},
    }
    print(f"host: {report['host']}", flush=True)
    env = dict(os.environ)
    env.pop("TF_CONFIG", None)  # a shell's cluster would make every step wait for it
    if args.rehearse:
        env["TFDIST_GPU_CHECK_REHEARSE"] = "1"
    elif "CUDA_VISIBLE_DEVICES" not in env:
        env["CUDA_VISIBLE_DEVICES"] = "0"  # the steps are for one GPU: the first
    if args.python:
        python = os.path.abspath(args.python)  # not resolved: a venv's python is a link
        if not os.access(python, os.X_OK):
            parser.error(f"--python {args.python!r} is not an executable file")
        report["build"] = {"outcome": "given", "python": python}
    else:
        what = "TensorFlow without CUDA" if args.rehearse else "TensorFlow with CUDA: a few GB"
        print(f"building the venv in {args.venv} ({what}) ...", flush=True)
        with open(os.path.join(logs, "build.log"), "w") as log:
            try:
                python, report["build"] = build_venv(args.venv, log, cuda=not args.rehearse)
            except Exception as err:  # noqa: BLE001 - the report says so; the steps are not run
                python, report["build"] = None, {"outcome": f"failed: {err!r}"}
        print(f"venv: {report['build']}", flush=True)
    for name in names:
        left = args.budget - (time.monotonic() - started)
        if python is None:
            result = {"outcome": "not run", "error": "the venv could not be built (build.log)"}
        elif left < 20:
            result = {"outcome": "not run", "error": f"the {args.budget:g} s budget ran out"}
        else:
            result = run_step(name, python, logs, min(STEPS[name][0], left), env)
        report["steps"][name] = result
        print(f"{name:28} {result['outcome']:8} {result.get('seconds', '')} s  "
              f"{_summary(name, result)}", flush=True)  # fmt: skip
    report["seconds"] = round(time.monotonic() - started, 1)
    report["passed"] = sum(r["outcome"] == "ok" for r in report["steps"].values())
    with open(os.path.join(out, "gpu-check.json"), "w") as f:
        json.dump(report, f, indent=1, default=str)
    with open(os.path.join(out, "gpu-check.md"), "w") as f:
        f.write(markdown(report))
    print(f"\n{report['passed']} of {len(names)} steps passed in {report['seconds']} s; "
          f"{os.path.join(out, 'gpu-check.md')}")  # fmt: skip
    return 0 if report["passed"] == len(names) else 1


if __name__ == "__main__":
    sys.exit(main())
