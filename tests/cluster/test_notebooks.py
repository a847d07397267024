"""tfdist.notebook_launch from a real Jupyter kernel.

Each notebook of examples/notebooks runs through a kernel (nbclient), under Keras 3 and under
tf_keras (TF_USE_LEGACY_KERAS=1 in the kernel's environment, which its tasks inherit): its
function, defined in a cell, trains as a real local job, each task's output streams into the cell
with its prefix, and the chief's return value comes back to the notebook, whose last cell checks
it. Then a kernel is interrupted, and another killed, while a job runs: no task may survive
either, and the interrupted kernel goes on working.
"""

import glob
import os
import queue
import re
import signal
import tempfile
import threading
import time

import jupyter_client
import nbclient
import nbformat
import pytest

import tfdist
from tfdist.launcher import JobFailed
from tfdist.testing import is_running

from helpers.paths import EXAMPLES

pytestmark = pytest.mark.slow

NOTEBOOKS = os.path.join(EXAMPLES, "notebooks")
# What each notebook's job prints, task by task, beside its own assertions.
EXPECTED = {
    "multi_worker_mirrored.ipynb": ["[worker:0] 2 replicas in sync", "[worker:1] 2 replicas"],
    "parameter_server.ipynb": ["[chief:0] Epoch 3/3", "ps:0       served until the job ended"],
}
FLAVOURS = {"keras3": ("0", "keras"), "tf_keras": ("1", "tf_keras")}  # the package tf.keras is
# TensorFlow's start-up noise, and warnings a task must not print
NOISE = ("oneDNN", "cuda", "I0000", "dataset_ops.py", "This TensorFlow binary")


def _text(cell):
    parts = []
    for out in cell.get("outputs", []):
        if out.get("output_type") == "stream":
            parts.append(out["text"])
        elif "data" in out:
            parts.append(out["data"].get("text/plain", ""))
    return "".join(parts)


@pytest.mark.parametrize("flavour", sorted(FLAVOURS))
@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_notebook_runs_its_job_through_a_kernel(name, flavour, monkeypatch, tmp_path):
    legacy, package = FLAVOURS[flavour]
    monkeypatch.setenv("TF_USE_LEGACY_KERAS", legacy)
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "0")  # tfdist must hide the noise itself
    before = set(glob.glob(os.path.join(tempfile.gettempdir(), "tfdist-notebook-*")))
    notebook = nbformat.read(os.path.join(NOTEBOOKS, name), as_version=4)
    client = nbclient.NotebookClient(
        notebook, timeout=300, kernel_name="python3", resources={"metadata": {"path": tmp_path}}
    )
    client.execute()  # raises CellExecutionError if a cell (the last one's checks) fails

    output = "\n".join(_text(cell) for cell in notebook.cells)
    for line in EXPECTED[name]:
        assert line in output, output
    assert f"on {package}\n" in output, output
    assert not [word for word in NOISE if word in output], output
    # the pickled call and the tasks' results are gone
    assert set(glob.glob(os.path.join(tempfile.gettempdir(), "tfdist-notebook-*"))) <= before


def _fails():
    raise ValueError("batch 5 is bad")


def _unpicklable():
    return threading.Lock()


def test_a_failing_task_raises_job_failed_with_its_traceback_in_the_output(capsys):
    with pytest.raises(JobFailed, match=r"worker:\d"):
        tfdist.notebook_launch(_fails, workers=2)
    # both tasks fail; the first to fail stops the other, perhaps before it printed its own
    assert re.search(r"\[worker:\d\] ValueError: batch 5 is bad", capsys.readouterr().out)

    with pytest.raises(JobFailed):
        tfdist.notebook_launch(_unpicklable, workers=1)
    assert "return value cannot be pickled" in capsys.readouterr().out


class _Kernel:
    """A Jupyter kernel and a blocking client, with what its cells print."""

    def __init__(self):
        self.manager = jupyter_client.KernelManager(kernel_name="python3")
        self.manager.start_kernel()
        self.client = self.manager.blocking_client()
        self.client.start_channels()
        self.client.wait_for_ready(timeout=120)

    def start(self, code):
        # stop_on_error=False: a cell that fails (here, the interrupted one) does not make the
        # kernel abort the requests that reach it next; ipykernel 7 marks the queue aborting
        # only after it sent the failed cell's reply, so the next cell, sent on that reply,
        # could be aborted (it then runs nothing and prints nothing)
        return self.client.execute(code, stop_on_error=False)

    def wait_for(self, pattern, seconds):
        """Reads the kernel's output until `pattern` has matched it; returns the output."""
        text, seen, deadline = "", [], time.monotonic() + seconds
        while time.monotonic() < deadline:
            try:
                msg = self.client.get_iopub_msg(timeout=1)
            except queue.Empty:
                continue
            content = msg["content"]
            seen.append(content.get("execution_state", msg["msg_type"]))
            if msg["msg_type"] == "stream":
                text += content["text"]
            elif msg["msg_type"] == "error":
                text += f"{content['ename']}: {content['evalue']}\n"
            if re.search(pattern, text):
                return text
        # what the kernel published: e.g. busy, idle and no execute_input for an aborted cell
        raise AssertionError(
            f"{pattern!r} not seen within {seconds} s; kernel messages {seen}; output:\n{text}"
        )

    def reply(self, msg_id, seconds=60):
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            msg = self.client.get_shell_msg(timeout=seconds)
            if msg["parent_header"].get("msg_id") == msg_id:
                return msg["content"]
        raise AssertionError(f"no reply to {msg_id} within {seconds} s")

    def close(self):
        self.client.stop_channels()
        if self.manager.is_alive():
            self.manager.shutdown_kernel(now=True)  # and its resources, as below
        else:  # its sockets and zmq context, which would block the exit of pytest at gc
            self.manager.cleanup_resources()


JOB = """
import tfdist

def wait_forever():
    import os, time
    print("pid", os.getpid(), flush=True)
    for step in range(100000):
        time.sleep(0.05)

tfdist.notebook_launch(wait_forever, workers=2)
"""


def _task_pids(text):
    pids = [int(p) for p in re.findall(r"\[worker:\d\] pid (\d+)", text)]
    assert len(pids) == 2, text
    return pids


def _all_gone(pids, seconds):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and any(is_running(p) for p in pids):
        time.sleep(0.2)
    return [p for p in pids if is_running(p)]


def test_an_interrupted_or_killed_kernel_leaves_no_task_running():
    kernel = _Kernel()
    try:
        cell = kernel.start(JOB)
        pids = _task_pids(kernel.wait_for(r"(\[worker:\d\] pid \d+[\s\S]*){2}", 120))
        kernel.manager.interrupt_kernel()  # the notebook's stop button
        text = kernel.wait_for(r"KeyboardInterrupt", 60)
        assert "every task was stopped" in text, text
        assert kernel.reply(cell)["status"] == "error"
        assert _all_gone(pids, 10) == []

        # the kernel goes on working, and its next job starts afresh
        cell = kernel.start(JOB)
        pids = _task_pids(kernel.wait_for(r"(\[worker:\d\] pid \d+[\s\S]*){2}", 120))
        os.kill(kernel.manager.provisioner.process.pid, signal.SIGKILL)  # the kernel dies
        assert _all_gone(pids, 15) == []
    finally:
        kernel.close()
