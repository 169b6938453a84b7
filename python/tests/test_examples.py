"""The quick examples of python/examples/ run and print what they promise.
(train_textcls.py and torch_attention.py train for minutes: run by hand.)"""
import os
import subprocess
import sys

import pytest

import cf

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")


def run(name, *args):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([os.path.dirname(os.path.dirname(cf.__file__))] +
                                        [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    out = subprocess.run([sys.executable, os.path.join(EXAMPLES, name)] + list(args), capture_output=True, text=True,
                         env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_tensor_basics():
    assert "0.8553410237" in run("tensor_basics.py")


def test_gradcheck_softplus():
    assert run("gradcheck_softplus.py").startswith("ok (full-jacobian")


def test_cuda_snippet_runs_on_the_available_device():
    assert "row sums: [1.0" in run("cuda.py")


def test_kmeans():
    assert "adjusted Rand index vs the planted labels: 1.000" in run("kmeans.py")


def test_training_step_lowers_the_loss():
    lines = [l for l in run("training_step.py").splitlines() if l.startswith("epoch")]
    first, last = float(lines[0].split()[3]), float(lines[-1].split()[3])
    assert last < 0.8 * first, lines


def test_custom_module_trains_a_python_model():
    out = run("custom_module.py")
    lines = [l for l in out.splitlines() if l.startswith("epoch")]
    first, last = float(lines[0].split()[3]), float(lines[-1].split()[3])
    assert last < 0.3 * first, out
    assert "training accuracy 1.00" in out or "training accuracy 0.9" in out, out
