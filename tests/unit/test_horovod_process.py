"""Horovod's process model without TensorFlow: ranks from the environment, `tfdist horovodrun`'s
command line, the `import horovod` finder and the errors for what tfdist does not carry."""

import json
import sys

import pytest

from tfdist.cli import main
from tfdist.errors import ClusterConfigError
from tfdist.horovod import run, shim
from tfdist.horovod.process import ranks_from_environment
from tfdist.horovod.unsupported import Unsupported, refuse


def _tf_config(workers, index, chief=None, **jobs):
    cluster = {"worker": workers, **jobs}
    if chief:
        cluster["chief"] = [chief]
    task = {"type": "worker", "index": index} if index is not None else {"type": "chief"}
    return {"TF_CONFIG": json.dumps({"cluster": cluster, "task": task})}


def _ranks(env):
    r = ranks_from_environment(env)
    return (r.rank, r.size, r.local_rank, r.local_size, r.cross_rank, r.cross_size)


def test_one_process_without_a_launcher():
    ranks = ranks_from_environment({})
    assert _ranks({}) == (0, 1, 0, 1, 0, 1)
    assert ranks.cluster is None and ranks.source == "single process"


@pytest.mark.parametrize(
    "index, expected",
    [
        (0, (0, 3, 0, 2, 0, 2)),  # hosts a, a, b: local rank 0 on both hosts
        (1, (1, 3, 1, 2, 0, 1)),  # local rank 1 exists on host a only
        (2, (2, 3, 0, 1, 1, 2)),
    ],
)
def test_ranks_local_and_cross_from_tf_config(index, expected):
    env = _tf_config(["a:1000", "a:1001", "b:1000"], index)
    assert _ranks(env) == expected


def test_the_chief_is_rank_zero():
    env = _tf_config(["h:2", "h:3"], None, chief="h:1")
    assert _ranks(env)[:2] == (0, 3)
    assert _ranks(_tf_config(["h:2", "h:3"], 1, chief="h:1"))[:2] == (2, 3)


def test_ranks_from_a_slurm_step():
    env = {
        "SLURM_JOB_ID": "7",
        "SLURM_STEP_ID": "0",
        "SLURM_PROCID": "3",
        "SLURM_LOCALID": "1",
        "SLURM_STEP_NUM_TASKS": "4",
        "SLURM_STEP_NODELIST": "node[1-2]",
        "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
    }
    ranks = ranks_from_environment(env)
    assert _ranks(env) == (3, 4, 1, 2, 1, 2)
    assert ranks.source == "SLURM"


def test_horovods_variables_must_agree_with_the_cluster():
    env = dict(_tf_config(["h:1", "h:2"], 1), HOROVOD_RANK="0", HOROVOD_SIZE="2")
    with pytest.raises(ClusterConfigError, match=r"HOROVOD_RANK says rank 0 of 2.*rank 1 of 2"):
        ranks_from_environment(env)
    env = dict(_tf_config(["h:1", "h:2"], 1), OMPI_COMM_WORLD_RANK="1")
    env["OMPI_COMM_WORLD_SIZE"] = "2"
    assert _ranks(env)[:2] == (1, 2)


def test_a_rank_without_the_peers_addresses_is_an_error():
    with pytest.raises(ClusterConfigError, match=r"OMPI_COMM_WORLD_RANK=1 of size 2.*horovodrun"):
        ranks_from_environment({"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2"})
    with pytest.raises(ClusterConfigError, match=r"not whole numbers"):
        ranks_from_environment({"HOROVOD_RANK": "x", "HOROVOD_SIZE": "2"})


def test_parameter_servers_have_no_place_in_a_horovod_job():
    env = _tf_config(["h:1"], 0, chief="h:3", ps=["h:9"])
    with pytest.raises(ClusterConfigError, match=r"ps or evaluator.*parameter_server"):
        ranks_from_environment(env)


def test_horovods_environment_for_a_process():
    env = _tf_config(["a:1", "a:2"], 1)
    run.set_horovod_environment(env)
    assert (env["HOROVOD_RANK"], env["HOROVOD_SIZE"], env["HOROVOD_LOCAL_RANK"]) == ("1", "2", "1")
    assert ranks_from_environment(env).rank == 1  # and they agree


def test_hosts_and_hostfiles(tmp_path):
    assert run.parse_hosts("localhost:2,127.0.0.1") == [("localhost", 2), ("127.0.0.1", 1)]
    with pytest.raises(run.HorovodrunError, match=r"'localhost:0' is not HOST or HOST:SLOTS"):
        run.parse_hosts("localhost:0")
    hostfile = tmp_path / "hosts"
    hostfile.write_text("# the machine\nlocalhost slots=2\n127.0.0.1\n")
    assert run.read_hostfile(str(hostfile)) == [("localhost", 2), ("127.0.0.1", 1)]
    hostfile.write_text("localhost cores=2\n")
    with pytest.raises(run.HorovodrunError, match=r"line 1.*HOST slots=N"):
        run.read_hostfile(str(hostfile))


def test_only_this_machines_hosts_with_enough_slots():
    run.check_local([("localhost", 2)], 2)
    with pytest.raises(run.HorovodrunError, match=r"node7 is another host.*srun.*TF_CONFIG"):
        run.check_local([("localhost", 1), ("node7", 1)], 2)
    with pytest.raises(run.HorovodrunError, match=r"-np 3 needs 3 slots.*localhost:3"):
        run.check_local([("localhost", 2)], 3)


def test_the_command_is_a_python_program(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("")
    assert run.python_command(["python", "-u", str(script), "--epochs", "2"]) == (
        sys.executable,
        str(script),
        ["--epochs", "2"],
        False,
    )
    assert run.python_command(["python3", "-m", "pkg.train", "x"])[1:] == ("pkg.train", ["x"], True)
    with pytest.raises(run.HorovodrunError, match=r"'bash' is not a Python interpreter"):
        run.python_command(["bash", "train.sh"])
    with pytest.raises(run.HorovodrunError, match=r"'nope.py' does not exist"):
        run.python_command(["python", "nope.py"])


def test_horovodrun_command_line_errors(capsys, tmp_path):
    script = tmp_path / "train.py"
    script.write_text("")
    assert main(["horovodrun", "-np", "2", "-H", "node7:2", "python", str(script)]) == 2
    assert "node7 is another host" in capsys.readouterr().err
    argv = ["horovodrun", "-np", "2", "--timeline-filename", "t.json", "python", str(script)]
    assert main(argv) == 2
    assert "no timeline" in capsys.readouterr().err
    assert main(["horovodrun", "-np", "0", "python", str(script)]) == 2
    assert "-np must be >= 1" in capsys.readouterr().err


def test_horovodrun_passes_the_scripts_own_flags(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("")
    parser_args = _parse(["-np", "2", "--gloo", "python", str(script), "--out", "x", "-np", "9"])
    settings = run.launch_settings(parser_args)
    assert settings["args"] == ["--out", "x", "-np", "9"]
    assert settings["workers"] == 2
    assert settings["extra_env"] == {"TFDIST_HOROVOD_SHIM": "1"}


def _parse(argv):
    from tfdist.cli import build_parser

    return build_parser().parse_args(["horovodrun", *argv])


@pytest.fixture
def finder():
    before = list(sys.meta_path)
    shim.install()
    shim.install()
    yield
    sys.meta_path[:] = before


def test_the_finder_serves_horovods_names_only_and_comes_last(finder):
    assert shim.installed()
    ours = [f for f in sys.meta_path if isinstance(f, shim._Finder)]
    assert len(ours) == 1 and sys.meta_path[-1] is ours[0]
    assert ours[0].find_spec("horovod.tensorflow.keras").name == "horovod.tensorflow.keras"
    assert ours[0].find_spec("horovod.torch") is None


def test_a_real_horovod_is_found_first(finder, tmp_path, monkeypatch):
    assert shim.real_horovod() is None
    (tmp_path / "horovod").mkdir()
    (tmp_path / "horovod" / "__init__.py").write_text("REAL = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "horovod", raising=False)
    assert shim.real_horovod().origin == str(tmp_path / "horovod" / "__init__.py")
    import horovod

    assert horovod.REAL
    monkeypatch.delitem(sys.modules, "horovod")


def test_unsupported_features_name_the_alternative():
    refused = refuse("process sets (ProcessSet)", "collectives over all the processes")
    with pytest.raises(Unsupported, match=r"does not support process sets.*HINT: use collect"):
        refused([0, 1])
    assert issubclass(Unsupported, NotImplementedError)
