"""A fault-injection campaign: real jobs under `tfdist launch`, faults at random steps, every
trial judged.

    python tests/chaos/campaign.py --trials 100 --seed 1 [--out DIR] [--faults a,b] [--quick]

Each trial runs tests/chaos/chaos_job.py under `tfdist launch --max-restarts 3 --grace 10`:
multi_worker_mirrored with 2 workers, or parameter_server with a chief, 2 workers and 1 ps;
Keras 3 or tf_keras. It injects one or two faults (FAULTS), each once the leading task's
optimizer step reached a step drawn at random:

    kill_worker     SIGKILL to worker 1
    kill_leader     SIGKILL to worker 0 (multi_worker_mirrored) or the chief
    kill_ps         SIGKILL to the ps
    preempt         SIGTERM to the leader or worker 1 (they save and exit 143)
    freeze          SIGSTOP to worker 1 for FROZEN seconds, longer than the collective
                    timeout (TFDIST_COLLECTIVE_TIMEOUT=8), then SIGCONT
    network_cut     the job's network cut for FROZEN seconds, then restored: the loopback
                    device of the job's private network namespace down (every task's links
                    at once: one task alone cannot be cut off in a namespace they share)
    disk_full       RLIMIT_FSIZE of 4 KiB on the task that writes the checkpoint data (the
                    leader, or the ps): its next save fails
    corrupt_backup  SIGKILL to the launcher, half the newest checkpoint's data truncated or
                    overwritten, the same command again
    kill_launcher   SIGKILL to the launcher, the same command again

and then judges the trial (`judge`):

- the job ends with exit code 0 (after its restarts), having trained every step;
- multi_worker_mirrored: its final weights equal, exactly, those of an uninterrupted run of the
  same scenario (run once per scenario: `reference`); parameter_server: the optimizer step is
  EPOCHS * STEPS, each step the coordinator counted applied once;
- no process of the trial outlives it (any process whose environment has its CHAOS_TRIAL);
- nothing is left in its TMPDIR (the launcher's report folder, scratch checkpoints, ...);
- a corrupt newest backup was reported in one warning naming it, and training resumed from
  the previous one;
- each fault was recovered from within RECOVERY_BOUND seconds: a restart trained past the step
  training had reached (or, for a freeze or a network cut, which a job may ride out, training
  went on after it).

A trial whose whole job ended before one of its faults could be injected (on a host slow
enough that the campaign sees the step only after the job's last) tested nothing: it is run
again, the same faults at the same steps, at most MAX_LATE times, and counts as not survived
after that. `--only 57,80` runs chosen trials of the seeded plan again.

It writes chaos.md (a table: fault, trials, survived, median and worst recovery) and
chaos.json (every trial) to --out (default build/chaos-<time>), and exits 1 unless every trial
survived. The network cut is the whole job's (its tasks share one network namespace); it
needs nsenter, ip and the right to enter the namespace (root, or the launcher's user
namespace), and is recorded as not cut elsewhere.
"""

from __future__ import annotations

import argparse
import dataclasses
import glob
import json
import os
import random
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import time
from typing import Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
JOB = os.path.join(HERE, "chaos_job.py")
EPOCHS, STEPS = 3, 10
TOTAL = EPOCHS * STEPS
GRACE = 10
COLLECTIVE_TIMEOUT = 8  # seconds: a frozen peer is given up on after this
FROZEN = COLLECTIVE_TIMEOUT + 4  # seconds a frozen worker stays stopped
RECOVERY_BOUND = 150.0  # seconds from a fault to training past the step it had reached
TRIAL_TIMEOUT = 420.0
MAX_LATE = 2  # runs again of a trial whose job ended before a fault could be injected
SETTLE = 10.0  # seconds the processes of a job that ended get to be gone
AUTOGRAPH_FILES = "__autograph_generated_file"
FILE_LIMIT = 4096  # bytes: the leader's RLIMIT_FSIZE for the disk-full fault

SCENARIOS = [
    ("multi_worker_mirrored", "keras3"),
    ("multi_worker_mirrored", "tf_keras"),
    ("parameter_server", "keras3"),
    ("parameter_server", "tf_keras"),
]


def _leader(strategy):
    return "chief:0" if strategy == "parameter_server" else "worker:0"


# fault -> (strategies it applies to, the tasks it may hit)
FAULTS: Dict[str, tuple] = {
    "kill_worker": (("multi_worker_mirrored", "parameter_server"), ("worker:1",)),
    "kill_leader": (("multi_worker_mirrored", "parameter_server"), ("leader",)),
    "kill_ps": (("parameter_server",), ("ps:0",)),
    "preempt": (("multi_worker_mirrored", "parameter_server"), ("leader", "worker:1")),
    "freeze": (("multi_worker_mirrored",), ("worker:1",)),
    "network_cut": (("multi_worker_mirrored", "parameter_server"), ("worker:1",)),
    "disk_full": (("multi_worker_mirrored", "parameter_server"), ("writer",)),
    "corrupt_backup": (("multi_worker_mirrored", "parameter_server"), ("launcher",)),
    "kill_launcher": (("multi_worker_mirrored", "parameter_server"), ("launcher",)),
}


# Faults a job may ride out without a restart (parameter_server waits for a worker that comes
# back); every other fault must restart the job from its backup.
RIDDEN_OUT = ("freeze", "network_cut")


@dataclasses.dataclass
class Fault:
    kind: str
    task: str
    at_step: int
    injected_at: Optional[float] = None
    step_then: Optional[int] = None
    starts_then: int = 0  # the leader's starts of training before the fault
    recovery: Optional[float] = None  # seconds until training went past the fault's step
    note: str = ""


@dataclasses.dataclass
class Trial:
    index: int
    strategy: str
    flavour: str
    faults: List[Fault]
    directory: str
    problems: List[str] = dataclasses.field(default_factory=list)
    seconds: float = 0.0
    exit_code: Optional[int] = None
    late: str = ""  # the fault the job ended before (the trial is run again: nothing was tested)
    reruns: List[str] = dataclasses.field(default_factory=list)  # each run voided so

    def reset(self) -> None:
        """For a run again: the faults as drawn, no outcome, an empty directory."""
        self.problems, self.late, self.exit_code = [], "", None
        self.faults = [Fault(f.kind, f.task, f.at_step) for f in self.faults]
        shutil.rmtree(self.directory, ignore_errors=True)

    @property
    def survived(self) -> bool:
        return not self.problems


# ------------------------------------------------------------------------- processes
def _environ(pid: int) -> Dict[str, str]:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            items = f.read().split(b"\0")
    except OSError:
        return {}
    out = {}
    for item in items:
        key, _, value = item.partition(b"=")
        out[key.decode(errors="replace")] = value.decode(errors="replace")
    return out


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _stat(pid: int):
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None, None
    fields = stat[stat.rfind(b")") + 2 :].split()
    return fields[0].decode(), int(fields[1])


def trial_processes(marker: str) -> List[int]:
    """The live (not zombie) processes whose environment holds CHAOS_TRIAL=marker."""
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit() and _environ(int(name)).get("CHAOS_TRIAL") == marker:
            state, _ = _stat(int(name))
            if state not in (None, "Z"):
                found.append(int(name))
    return found


def task_pid(marker: str, task: str) -> Optional[int]:
    """The pid of the trial's task `task` itself (the child of its keeper)."""
    for pid in trial_processes(marker):
        if _environ(pid).get("TFDIST_TASK") != task or "keeper.py" in _cmdline(pid):
            continue
        _, parent = _stat(pid)
        if parent is not None and "keeper.py" in _cmdline(parent):
            return pid
    return None


# ------------------------------------------------------------------------- one trial
class Run:
    """One trial's job: its launcher (started again after a fault that killed it)."""

    def __init__(self, trial: Trial, marker: str):
        self.trial, self.marker = trial, marker
        d = trial.directory
        self.out, self.backup, self.tmp = (os.path.join(d, n) for n in ("out", "backup", "tmp"))
        for folder in (self.out, self.tmp):
            os.makedirs(folder, exist_ok=True)
        self.env = dict(
            os.environ,
            CHAOS_TRIAL=marker,
            TMPDIR=self.tmp,
            TFDIST_COLLECTIVE_TIMEOUT=str(COLLECTIVE_TIMEOUT),
            CHAOS_EPOCHS=str(EPOCHS),
            CHAOS_STEPS=str(STEPS),
            TF_CPP_MIN_LOG_LEVEL="2",
        )
        self.env.pop("TF_CONFIG", None)
        if trial.flavour == "tf_keras":
            self.env["TF_USE_LEGACY_KERAS"] = "1"
        else:
            self.env.pop("TF_USE_LEGACY_KERAS", None)
        self.argv = [sys.executable, "-m", "tfdist", "launch", "--workers", "2"]
        if trial.strategy == "parameter_server":
            self.argv += ["--ps", "1"]
        self.argv += ["--max-restarts", "3", "--grace", str(GRACE), JOB, self.out, self.backup]
        self.log = open(os.path.join(d, "launcher.log"), "ab")
        self.proc = None
        self.launches = 0

    def start(self) -> None:
        self.launches += 1
        self.log.write(f"=== launch {self.launches}: {' '.join(self.argv)}\n".encode())
        self.log.flush()
        self.proc = subprocess.Popen(
            self.argv,
            env=self.env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )

    def starts(self) -> int:
        """How many times the leader started training (a line each in OUT/starts.log)."""
        try:
            with open(os.path.join(self.out, "starts.log")) as f:
                return len(f.read().splitlines())
        except OSError:
            return 0

    def progress(self) -> int:
        try:
            with open(os.path.join(self.out, "progress")) as f:
                return int(f.read().strip() or -1)
        except (OSError, ValueError):
            return -1

    def wait_for(self, condition, until: float) -> bool:
        while time.monotonic() < until:
            if condition():
                return True
            if self.proc.poll() is not None:
                return condition()
            time.sleep(0.05)
        return False


def _newest_checkpoint_file(backup: str) -> Optional[str]:
    files = [
        p
        for p in glob.glob(os.path.join(backup, "**", "*"), recursive=True)
        if ".data-" in os.path.basename(p) and os.path.isfile(p)
    ]
    return max(files, key=os.path.getmtime) if files else None


def _corrupt(path: str, rng: random.Random) -> str:
    size = os.path.getsize(path)
    if rng.random() < 0.5:
        with open(path, "r+b") as f:
            f.truncate(size // 2)
        return f"truncated {os.path.basename(path)} to {size // 2} of {size} bytes"
    with open(path, "r+b") as f:
        f.seek(size // 4)
        f.write(bytes(rng.randrange(256) for _ in range(max(size // 2, 1))))
    return f"overwrote half of {os.path.basename(path)} with random bytes"


def _set_loopback(pid: int, state: str) -> bool:
    """Sets the loopback device of process `pid`'s network namespace up or down; False where
    that namespace is this process's own (a job without a private one) or cannot be entered."""
    try:
        if os.stat(f"/proc/{pid}/ns/net").st_ino == os.stat("/proc/self/ns/net").st_ino:
            return False
    except OSError:
        return False
    done = subprocess.run(
        ["nsenter", "-t", str(pid), "-n", "ip", "link", "set", "lo", state],
        capture_output=True,
        timeout=10,
    )
    return done.returncode == 0


def _task_of(fault: Fault, strategy: str) -> str:
    if fault.task == "writer":  # the task that writes the checkpoint's data: a ps holds them
        return "ps:0" if strategy == "parameter_server" else _leader(strategy)
    return _leader(strategy) if fault.task == "leader" else fault.task


def inject(run: Run, fault: Fault, rng: random.Random) -> None:
    trial = run.trial
    task = _task_of(fault, trial.strategy)
    fault.injected_at, fault.step_then = time.monotonic(), run.progress()
    fault.starts_then = run.starts()
    if fault.kind in ("kill_launcher", "corrupt_backup"):
        os.kill(run.proc.pid, signal.SIGKILL)
        run.proc.wait()
        left = trial_processes(run.marker)
        deadline = time.monotonic() + GRACE + 10
        while left and time.monotonic() < deadline:
            time.sleep(0.1)
            left = trial_processes(run.marker)
        if left:
            trial.problems.append(
                f"{fault.kind}: {len(left)} process(es) outlived the launcher killed with "
                f"SIGKILL: {[_cmdline(p)[:120] for p in left]}"
            )
            for pid in left:
                os.kill(pid, signal.SIGKILL)
        if fault.kind == "corrupt_backup":
            path = _newest_checkpoint_file(run.backup)
            if path is None:
                fault.note = "no checkpoint file yet"
            else:
                fault.note = _corrupt(path, rng) + f" ({path})"
        run.start()
        return
    pid = task_pid(run.marker, task)
    if pid is None and run.proc.poll() is not None:
        trial.late = f"{fault.kind}@{fault.at_step}"  # the job ended while the campaign looked
        return
    if pid is None:
        fault.note = f"{task} not found"
        trial.problems.append(f"{fault.kind}: task {task} was not running at step {fault.at_step}")
        return
    _hit(pid, fault)
    fault.note = fault.note or f"{task} (pid {pid})"


def _hit(pid: int, fault: Fault) -> None:
    """The fault itself, on the task `pid`."""
    if fault.kind.startswith("kill_"):
        os.kill(pid, signal.SIGKILL)
    elif fault.kind == "preempt":
        os.kill(pid, signal.SIGTERM)
    elif fault.kind == "freeze":
        os.kill(pid, signal.SIGSTOP)
        time.sleep(FROZEN)
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass
    elif fault.kind == "network_cut":
        if not _set_loopback(pid, "down"):
            fault.note = "the job has no network namespace of its own: nothing cut"
            return
        time.sleep(FROZEN)
        _set_loopback(pid, "up")  # the namespace may be gone already (its tasks ended)
    elif fault.kind == "disk_full":
        resource.prlimit(pid, resource.RLIMIT_FSIZE, (FILE_LIMIT, FILE_LIMIT))


def run_trial(trial: Trial, rng: random.Random, references: Dict[str, list]) -> Trial:
    started = time.monotonic()
    marker = f"{os.getpid()}-{trial.index}-{rng.randrange(10**9)}"
    run = Run(trial, marker)
    until = started + TRIAL_TIMEOUT
    run.start()
    try:
        for fault in trial.faults:
            if not run.wait_for(lambda f=fault: run.progress() >= f.at_step, until):
                trial.problems.append(
                    f"{fault.kind}: training never reached step {fault.at_step} "
                    f"(at {run.progress()}; launcher exit {run.proc.poll()})"
                )
                break
            if run.proc.poll() is not None:  # the whole job ended before the fault could land
                trial.late = f"{fault.kind}@{fault.at_step}"
                break
            inject(run, fault, rng)
            if trial.late:
                break
            after = run.progress()  # where training stood once the fault was over

            def recovered(f=fault, after=after):
                if run.starts() > f.starts_then:  # restarted, and trained past the fault
                    return run.progress() > f.step_then
                return f.kind in RIDDEN_OUT and run.progress() > after

            passed = run.wait_for(recovered, until)
            if passed:
                fault.recovery = time.monotonic() - fault.injected_at
                if fault.recovery > RECOVERY_BOUND:
                    trial.problems.append(
                        f"{fault.kind}: recovered after {fault.recovery:.0f} s, more than "
                        f"{RECOVERY_BOUND:.0f} s"
                    )
            else:
                trial.problems.append(
                    f"{fault.kind}: no restart trained past step {fault.step_then} (launcher "
                    f"exit {run.proc.poll()})"
                )
        try:
            trial.exit_code = run.proc.wait(timeout=max(until - time.monotonic(), 1))
        except subprocess.TimeoutExpired:
            trial.problems.append(f"the job did not end within {TRIAL_TIMEOUT:.0f} s")
            os.killpg(run.proc.pid, signal.SIGKILL)
            trial.exit_code = run.proc.wait()
    finally:
        if run.proc.poll() is None:  # the campaign itself is stopping: so does its job
            os.killpg(run.proc.pid, signal.SIGTERM)
            try:
                run.proc.wait(timeout=GRACE + 10)
            except subprocess.TimeoutExpired:
                os.killpg(run.proc.pid, signal.SIGKILL)
                run.proc.wait()
        run.log.close()
        trial.seconds = time.monotonic() - started
    if not trial.late:
        judge(trial, run, references)
    return trial


def _final(out: str) -> Optional[dict]:
    try:
        with open(os.path.join(out, "final.json")) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def judge(trial: Trial, run: Run, references: Dict[str, list]) -> None:
    problems = trial.problems
    if trial.exit_code != 0:
        problems.append(f"the launcher exited with {trial.exit_code}")
    final = _final(run.out)
    if final is None:
        problems.append("the job wrote no final weights")
    else:
        if final["iterations"] != TOTAL:
            problems.append(f"the optimizer step is {final['iterations']}, not {TOTAL}")
        reference = references.get(f"{trial.strategy}-{trial.flavour}")
        if reference is not None and final["weights"] != reference:
            problems.append("the final weights differ from those of an uninterrupted run")
    deadline = time.monotonic() + SETTLE
    left = trial_processes(run.marker)
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = trial_processes(run.marker)
    if left:
        problems.append(
            f"{len(left)} process(es) outlived the job: {[_cmdline(p)[:120] for p in left]}"
        )
        for pid in left:
            os.kill(pid, signal.SIGKILL)
    # TensorFlow's autograph writes its generated code to temporary files that it removes at
    # exit: a task killed with SIGKILL cannot; they are TensorFlow's, not tfdist's.
    leftovers = sorted(n for n in os.listdir(run.tmp) if not n.startswith(AUTOGRAPH_FILES))
    if leftovers:
        problems.append(f"left in TMPDIR: {leftovers[:5]}")
    log = open(os.path.join(trial.directory, "launcher.log"), errors="replace").read()
    if "MultiDeviceSaver" in log:  # TensorFlow's warning at every save: tfdist hides it
        problems.append("the output has TensorFlow's retracing warnings of the checkpoint saver")
    for fault in trial.faults:
        if fault.kind == "corrupt_backup" and fault.note.startswith(("truncated", "overwrote")):
            name = os.path.basename(fault.note.rsplit("(", 1)[1].rstrip(")"))
            prefix = name.split(".data-")[0]
            leader = f"[{_leader(trial.strategy)}]"
            warned = [
                line
                for line in log.splitlines()
                if line.startswith(leader) and prefix in line and "Warning" in line
            ]
            if len(warned) != 1:
                problems.append(
                    f"corrupt_backup: the leader printed {len(warned)} warning(s) naming "
                    f"{prefix}, not one"
                )


# ------------------------------------------------------------------------- the campaign
def reference(strategy: str, flavour: str, root: str) -> Optional[list]:
    """The final weights of an uninterrupted run (multi_worker_mirrored only)."""
    if strategy != "multi_worker_mirrored":
        return None
    trial = Trial(-1, strategy, flavour, [], os.path.join(root, f"reference-{flavour}"))
    os.makedirs(trial.directory, exist_ok=True)
    run_trial(trial, random.Random(0), {})
    final = _final(os.path.join(trial.directory, "out"))
    if not trial.survived or final is None:
        raise SystemExit(f"the uninterrupted {strategy} {flavour} run failed: {trial.problems}")
    return final["weights"]


def plan_trials(n: int, seed: int, faults: List[str], root: str) -> List[Trial]:
    rng = random.Random(seed)
    trials = []
    for index in range(n):
        kind = faults[index % len(faults)]  # every fault as often as the others
        strategies = [s for s in SCENARIOS if s[0] in FAULTS[kind][0]]
        strategy, flavour = rng.choice(strategies)
        kinds = [kind]
        if rng.random() < 0.3:  # a second fault, later in the same trial
            kinds.append(rng.choice([k for k in faults if strategy in FAULTS[k][0]]))
        # A corrupt backup is judged on its fallback to the one before: from step 5 there are
        # two (saves at 2 and 4); a job whose only backup is unreadable stops with an error.
        low = 5 if "corrupt_backup" in kinds else 3
        steps = sorted(rng.sample(range(low, TOTAL - 8), len(kinds)))
        if len(steps) == 2 and steps[1] - steps[0] < 4:
            steps[1] = min(steps[0] + 4, TOTAL - 4)
        chosen = [Fault(k, rng.choice(FAULTS[k][1]), s) for k, s in zip(kinds, steps)]
        directory = os.path.join(root, f"trial-{index:03d}")
        trials.append(Trial(index, strategy, flavour, chosen, directory))
    return trials


def report(trials: List[Trial], root: str, seconds: float) -> str:
    rows = {}
    for trial in trials:
        for fault in trial.faults:
            row = rows.setdefault(fault.kind, {"trials": 0, "survived": 0, "recovery": []})
            row["trials"] += 1
            row["survived"] += trial.survived
            if fault.recovery is not None:
                row["recovery"].append(fault.recovery)
    lines = [
        f"# Fault-injection campaign: {sum(t.survived for t in trials)} of {len(trials)} trials "
        f"survived ({seconds / 60:.0f} min)",
        "",
        "| fault | trials | survived | median recovery | worst recovery |",
        "| --- | --- | --- | --- | --- |",
    ]
    for kind in FAULTS:
        if kind not in rows:
            continue
        row = rows[kind]
        rec = row["recovery"]
        median = f"{statistics.median(rec):.1f} s" if rec else "-"
        worst = f"{max(rec):.1f} s" if rec else "-"
        lines.append(f"| {kind} | {row['trials']} | {row['survived']} | {median} | {worst} |")
    failed = [t for t in trials if not t.survived]
    if failed:
        lines += ["", "## Trials that did not survive", ""]
        for t in failed:
            faults = ", ".join(f"{f.kind}@{f.at_step}" for f in t.faults)
            problems = "; ".join(t.problems)
            lines.append(f"- trial {t.index} ({t.strategy}, {t.flavour}; {faults}): {problems}")
    text = "\n".join(lines) + "\n"
    with open(os.path.join(root, "chaos.md"), "w") as f:
        f.write(text)
    with open(os.path.join(root, "chaos.json"), "w") as f:
        json.dump([dataclasses.asdict(t) | {"survived": t.survived} for t in trials], f, indent=1)
    return text


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=100)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--faults", default=",".join(FAULTS), help="comma-separated")
    parser.add_argument("--out", default=os.environ.get("OUT"))
    parser.add_argument("--keep", action="store_true", help="keep each trial's folder")
    parser.add_argument(
        "--only",
        default="",
        help="comma-separated trial indices of the seeded plan to run (the same faults at the "
        "same steps), e.g. to run a failed trial again",
    )
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    faults = [f for f in args.faults.split(",") if f]
    unknown = sorted(set(faults) - set(FAULTS))
    if unknown or args.trials < 1:
        known = ", ".join(FAULTS)
        parser.error(f"unknown faults {unknown}; known: {known}" if unknown else "--trials >= 1")
    root = args.out or os.path.join(ROOT, "build", time.strftime("chaos-%Y%m%d-%H%M%S"))
    os.makedirs(root, exist_ok=True)
    print(f"chaos: {args.trials} trials, seed {args.seed}, results in {root}", flush=True)
    started = time.monotonic()
    trials = plan_trials(args.trials, args.seed, faults, root)
    if args.only:
        chosen = {int(i) for i in args.only.split(",") if i.strip()}
        trials = [t for t in trials if t.index in chosen]
    references = {}
    for strategy, flavour in sorted({(t.strategy, t.flavour) for t in trials}):
        weights = reference(strategy, flavour, root)
        if weights is not None:
            references[f"{strategy}-{flavour}"] = weights
    rng = random.Random(args.seed + 1)
    for trial in trials:
        run_trial(trial, rng, references)
        while trial.late and len(trial.reruns) < MAX_LATE:
            print(
                f"chaos: trial {trial.index}: the job ended before {trial.late} could be "
                "injected (nothing was tested); running it again",
                flush=True,
            )
            trial.reruns.append(trial.late)
            trial.reset()
            run_trial(trial, rng, references)
        if trial.late:
            trial.problems.append(
                f"the job ended before {trial.late} could be injected, {MAX_LATE + 1} times: "
                "this host is too slow for the campaign's pace"
            )
        faults = ", ".join(f"{f.kind}@{f.at_step}({f.task})" for f in trial.faults)
        verdict = "survived" if trial.survived else "FAILED: " + "; ".join(trial.problems)
        print(
            f"chaos: trial {trial.index} {trial.strategy} {trial.flavour} [{faults}] "
            f"{trial.seconds:.0f} s: {verdict}",
            flush=True,
        )
        if trial.survived and not args.keep:
            shutil.rmtree(trial.directory, ignore_errors=True)
    print(report(trials, root, time.monotonic() - started), flush=True)
    return 0 if all(t.survived for t in trials) else 1


if __name__ == "__main__":
    sys.exit(main())
