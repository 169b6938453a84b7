"""pytest setup for the cf package tests (python/tests).

scripts/test.sh runs them with the package built into <build>/python on
PYTHONPATH; after `pip install ./python` they run against the installed one.
"""
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

try:
    import cf  # noqa: F401
except ImportError:  # a plain `pytest python/tests` from the repository: use build/python
    sys.path.insert(0, os.path.join(os.environ.get("CF_BUILD_DIR", os.path.join(ROOT, "build")), "python"))
    import cf  # noqa: F401


@pytest.fixture
def gen():
    import cf
    return cf.Generator(1234)


def cuda_available():
    import cf
    return cf.cuda.is_available()


requires_cuda = pytest.mark.skipif(not cuda_available(), reason="no CUDA device visible (cf.cuda.is_available() is False)")
