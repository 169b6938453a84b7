"""cf.dist and cf.nn.DistributedDataParallel from Python: dist_script.py trains a Python module alone and under
`mpirun -np 2`, and both end with the same parameters (as cf's C++ DDP tests require of the C++ API)."""
import json
import os
import shutil
import subprocess
import sys

import pytest

import cf

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "dist_script.py")


def run(out_dir, *launcher):
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMP_NUM_THREADS="1",
               OMP_WAIT_POLICY="PASSIVE", CF_DIST_OUT=str(out_dir))
    env["PYTHONPATH"] = os.pathsep.join([os.path.dirname(os.path.dirname(cf.__file__))] +
                                        [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    out = subprocess.run(list(launcher) + [sys.executable, SCRIPT], capture_output=True, text=True, env=env,
                         timeout=240)
    assert out.returncode == 0, out.stdout + out.stderr
    ranks = []
    for name in sorted(os.listdir(out_dir)):
        with open(os.path.join(out_dir, name)) as f:
            ranks.append(json.load(f))
    return ranks


@pytest.mark.skipif(not cf.dist.built_with("mpi") or shutil.which("mpirun") is None,
                    reason="this build has no MPI, or mpirun is missing")
def test_two_processes_train_a_python_module_as_one_does(tmp_path):
    (tmp_path / "one").mkdir()
    (tmp_path / "two").mkdir()
    alone = run(tmp_path / "one")
    assert len(alone) == 1 and alone[0]["world"] == 1
    two = run(tmp_path / "two", "mpirun", "--oversubscribe", "--bind-to", "none", "-np", "2")
    assert [r["world"] for r in two] == [2, 2] and [r["rank"] for r in two] == [0, 1]
    # each rank took its half of the global batch, together all of it
    assert sorted(two[0]["indices"] + two[1]["indices"]) == sorted(alone[0]["indices"])
    assert two[0]["gathered"] == [0.0, 1.0] and two[0]["buckets"] >= 1
    for r in two:
        assert r["params"] == two[0]["params"]  # the replicas agree bit for bit
        for got, want in zip(r["params"], alone[0]["params"]):  # and equal one process on the whole batch
            flat_got, flat_want = cf.tensor(got, dtype=cf.float64), cf.tensor(want, dtype=cf.float64)
            assert (flat_got - flat_want).abs().max().item() < 1e-12
    # the loss fell (summed over ranks by all_reduce: every rank has the same sums)
    assert two[0]["first_loss"] == two[1]["first_loss"] and two[0]["last_loss"] < 0.7 * two[0]["first_loss"]


def test_collectives_need_a_process_group_and_name_their_op():
    if cf.dist.is_initialized():
        pytest.skip("a process group is up in this process")
    assert cf.dist.rank() == 0 and cf.dist.world_size() == 1
    with pytest.raises(cf.DistError, match=r"^\[all_reduce\] the process group is not initialised"):
        cf.dist.all_reduce(cf.ones([2]))
    with pytest.raises(cf.ValueError, match=r'^\[all_reduce\] op must be "sum", "mean" or "max", got "min"'):
        cf.dist.all_reduce(cf.ones([2]), "min")
    with pytest.raises(cf.DistError, match=r"^\[DistributedDataParallel\] the process group is not initialised"):
        cf.nn.DistributedDataParallel(cf.nn.Linear(2, 2))
    assert issubclass(cf.DistError, cf.Error)
