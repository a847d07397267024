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
a time limit of its own, so that one failing or hanging step does not stop the others. Each
step runs in a process group (a session) of its own: at its limit the whole group gets SIGTERM
(a `tfdist launch` passes it on to its tasks), then SIGKILL, so that nothing it started goes on
holding GPU memory; whatever a step starts is bounded within the step's limit
(`TFDIST_GPU_STEP_SECONDS`, gpu_steps.py). The whole check keeps to a budget (8 minutes by
default), the build, the steps and the stopping of a step that timed out included. The limits
are each step's worst case: with the build's they add up to more than the budget, so a slow
host does not run the last steps. A step that would start with less than `MIN_STEP_SECONDS`
left is recorded as not run, one that starts with less than its limit gets what is left (both
said in the report: `not_run_for_lack_of_time`, `limit_cut_by_budget`). It writes
`gpu-check.md` and `gpu-check.json` (and one log per step) to $OUT when set, else to a folder it
prints, and exits 0 when every step passed or was skipped (a step that does not apply to this
GPU says why, e.g. bfloat16 below compute capability 8.0).

Only the standard library here: it runs before any venv exists.
"""

import argparse
import datetime
import importlib.util
import json
import os
import platform
import shutil
import signal
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
    "mirrored_two_logical_gpus": (
        90,
        "mirrored over 2 logical GPUs: weights equal one device; iterators dropped at once",
    ),
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
    "slurm_gpu_share": (
        60,
        "a SLURM task of 2 on the one GPU keeps it, grows its memory, all-reduces on the ring",
    ),
}
BUDGET_SECONDS = 480
BUILD_SECONDS = 300  # at most; less where the budget leaves less
STOP_SECONDS = 10  # a step's process group, from SIGTERM at its limit to SIGKILL
DRAIN_SECONDS = 5  # then, at most, to read the last of its output
MIN_STEP_SECONDS = 20  # a step is not started with less of the budget left (past stopping it)
LIMIT_VARIABLE = "TFDIST_GPU_STEP_SECONDS"  # a step's limit, for what it starts (gpu_steps.py)


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
    """(exit code or "timeout", output) of `command`, bounded; never raises for the command.

    The command runs in a session (a process group) of its own. After `timeout` s the whole
    group gets SIGTERM, then SIGKILL `STOP_SECONDS` later: what the command started in its
    group ends with it. The call takes at most `timeout + STOP_SECONDS + DRAIN_SECONDS` s.
    """
    try:
        proc = subprocess.Popen(
            command,
            env=env,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            start_new_session=True,
        )
    except OSError as err:
        return "error", str(err)
    try:
        output, _ = proc.communicate(timeout=timeout)
        return proc.returncode, output
    except subprocess.TimeoutExpired:
        _stop_group(proc)
    try:
        output, _ = proc.communicate(timeout=DRAIN_SECONDS)
    except subprocess.TimeoutExpired as err:  # a process outside the group holds the pipe
        output = err.output.decode(errors="replace") if isinstance(err.output, bytes) else ""
        proc.stdout.close()
    return "timeout", output or ""


def _signal_group(pgid, signum):
    try:
        os.killpg(pgid, signum)
        return True
    except ProcessLookupError:
        return False  # the group is gone


def _stop_group(proc):
    """SIGTERM to the process group `proc` leads, SIGKILL to what is left of it after
    `STOP_SECONDS` (or at once, once the group is empty, nothing)."""
    if not _signal_group(proc.pid, signal.SIGTERM):
        return
    deadline = time.monotonic() + STOP_SECONDS
    while time.monotonic() < deadline:
        proc.poll()  # reaps the leader: a zombie would count as a member still
        if not _signal_group(proc.pid, 0):
            return
        time.sleep(0.1)
    _signal_group(proc.pid, signal.SIGKILL)
    proc.wait()


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


def build_venv(directory, log, cuda=True, seconds=BUILD_SECONDS):
    """Builds the venv in `directory` (`cuda`: TensorFlow's CUDA libraries, else TensorFlow
    alone, for a rehearsal) in at most `seconds` (its commands stopped included); returns
    (python path or None, what happened)."""
    newest = _releases().NEWEST
    packages = [
        f"tensorflow{'[and-cuda]' if cuda else ''}=={newest.tensorflow}",
        f"keras=={newest.keras}",
        f"tf_keras=={newest.tf_keras}",
    ]
    record = {"packages": packages, "steps": [], "limit_seconds": round(seconds)}
    deadline = time.monotonic() + seconds - STOP_SECONDS - DRAIN_SECONDS

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
    """Runs one step in a process group of its own for at most `timeout` s (then stops the
    group: `_run`); returns its result. The step learns its limit from `LIMIT_VARIABLE`."""
    environ = dict(os.environ if env is None else env)
    environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    environ[LIMIT_VARIABLE] = f"{timeout:g}"
    started = time.monotonic()
    code, output = _run([python, STEPS_FILE, name], timeout=timeout, env=environ, cwd=HERE)
    with open(os.path.join(logs, f"{name}.log"), "w") as log:
        log.write(output)
    result = parse(output) or {}
    if code == "timeout":
        result = {
            "outcome": "timeout",
            "error": f"no result in {timeout:g} s; its process group was stopped",
        }
    elif not result:
        tail = " | ".join(output.strip().splitlines()[-5:])
        result = {"outcome": "failed", "error": f"exit {code}, no result line: {tail}"}
    result["seconds"] = round(time.monotonic() - started, 1)
    return result


def _summary(name, result):
    if result.get("outcome") == "skipped":
        return result.get("reason", "").replace("|", "/")
    if result.get("outcome") != "ok":
        return result.get("error", "")[:300].replace("\n", " ").replace("|", "/")
    keys = {
        "devices": lambda r: (
            ", ".join(f"{g['name']} ({g['compute_capability']})" for g in r.get("gpus", []))
            + f"; CUDA {r.get('cuda')}, cuDNN {r.get('cudnn')}"
        ),
        "mirrored_two_logical_gpus": lambda r: (
            f"{r['cross_device_ops']}, max weight difference {r['max_weight_difference']:.3g}, "
            f"device iterators dropped in {r['device_iterators_dropped_in_seconds']} s"
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
    if report.get("skipped"):
        lines.append(f"skipped (not for this GPU): {', '.join(report['skipped'])}")
    lines += _budget_lines(report)
    return "\n".join(lines) + "\n"


def _budget_lines(report):
    """What the budget left out or cut short, said plainly (empty when nothing)."""
    lines = []
    if report.get("not_run_for_lack_of_time"):
        lines.append(
            f"not run for lack of time (the {report['budget_seconds']:g} s budget ran out): "
            + ", ".join(report["not_run_for_lack_of_time"])
        )
    if report.get("limit_cut_by_budget"):
        lines.append(
            "run with less than their own limit (what was left of the budget): "
            + ", ".join(f"{n} ({s:g} s)" for n, s in report["limit_cut_by_budget"].items())
        )
    return lines


def step_limit(name, left):
    """The seconds step `name` may run when `left` s of the budget are left: its own limit,
    or what the budget leaves once stopping it is paid for; None: too few to start it."""
    usable = left - STOP_SECONDS - DRAIN_SECONDS
    if usable < MIN_STEP_SECONDS:
        return None
    return min(STEPS[name][0], usable)


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
    env = step_environment(os.environ, args.rehearse)
    if args.python:
        python = os.path.abspath(args.python)  # not resolved: a venv's python is a link
        if not os.access(python, os.X_OK):
            parser.error(f"--python {args.python!r} is not an executable file")
        report["build"] = {"outcome": "given", "python": python}
    else:
        what = "TensorFlow without CUDA" if args.rehearse else "TensorFlow with CUDA: a few GB"
        print(f"building the venv in {args.venv} ({what}) ...", flush=True)
        seconds = min(BUILD_SECONDS, args.budget - (time.monotonic() - started))
        with open(os.path.join(logs, "build.log"), "w") as log:
            try:
                python, report["build"] = build_venv(
                    args.venv, log, cuda=not args.rehearse, seconds=seconds
                )
            except Exception as err:  # noqa: BLE001 - the report says so; the steps are not run
                python, report["build"] = None, {"outcome": f"failed: {err!r}"}
        print(f"venv: {report['build']}", flush=True)
    report["not_run_for_lack_of_time"], report["limit_cut_by_budget"] = [], {}
    for name in names:
        limit = step_limit(name, args.budget - (time.monotonic() - started))
        if python is None:
            result = {"outcome": "not run", "error": "the venv could not be built (build.log)"}
        elif limit is None:
            result = {"outcome": "not run", "error": f"the {args.budget:g} s budget ran out"}
            report["not_run_for_lack_of_time"].append(name)
        else:
            result = run_step(name, python, logs, limit, env)
            if limit < STEPS[name][0]:
                result["limit_seconds"] = round(limit, 1)
                report["limit_cut_by_budget"][name] = round(limit, 1)
        report["steps"][name] = result
        print(f"{name:28} {result['outcome']:8} {result.get('seconds', '')} s  "
              f"{_summary(name, result)}", flush=True)  # fmt: skip
    report["seconds"] = round(time.monotonic() - started, 1)
    report["passed"] = sum(r["outcome"] == "ok" for r in report["steps"].values())
    report["skipped"] = [n for n, r in report["steps"].items() if r["outcome"] == "skipped"]
    with open(os.path.join(out, "gpu-check.json"), "w") as f:
        json.dump(report, f, indent=1, default=str)
    with open(os.path.join(out, "gpu-check.md"), "w") as f:
        f.write(markdown(report))
    print(f"\n{report['passed']} of {len(names)} steps passed in {report['seconds']} s; "
          f"{os.path.join(out, 'gpu-check.md')}")  # fmt: skip
    for line in _budget_lines(report):
        print(line)
    return 0 if report["passed"] + len(report["skipped"]) == len(names) else 1


def step_environment(environ, rehearse=False):
    """The steps' environment: no TF_CONFIG; on a GPU host the first GPU unless
    CUDA_VISIBLE_DEVICES names one, numbered as nvidia-smi numbers them (CUDA_DEVICE_ORDER=
    PCI_BUS_ID unless set), so that the GPU the steps run on is the one nvidia-smi describes."""
    env = dict(environ)
    env.pop("TF_CONFIG", None)  # a shell's cluster would make every step wait for it
    if rehearse:
        env["TFDIST_GPU_CHECK_REHEARSE"] = "1"
        return env
    env.setdefault("CUDA_VISIBLE_DEVICES", "0")  # the steps are for one GPU: the first
    env.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    return env


if __name__ == "__main__":
    sys.exit(main())
