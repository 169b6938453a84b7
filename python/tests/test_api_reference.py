"""docs/python-api.md lists every bound name; every registry op is a function of cf."""
import os
import sys

import cf

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "python", "tools"))
import api_reference  # noqa: E402


def test_every_registry_op_is_a_function():
    missing = [op.name for op in cf.op_registry() if not callable(getattr(cf, op.name, None))]
    assert not missing, "ops of the registry without a Python binding: %s" % missing


def test_reference_lists_every_bound_name():
    with open(os.path.join(ROOT, "docs", "python-api.md")) as f:
        text = f.read()
    missing = [n for n in api_reference.qualified_names() if "`%s`" % n not in text]
    assert not missing, ("bound names missing from docs/python-api.md (regenerate it: PYTHONPATH=build/python "
                         ".venv/bin/python python/tools/api_reference.py): %s" % missing[:20])


def test_public_functions_have_docstrings_beyond_their_signature():
    # nanobind writes the signature into every __doc__; the description is ours
    bare = []
    for qual, mod in api_reference.modules():
        for n, obj in api_reference.public_names(qual, mod):
            if callable(obj) and not isinstance(obj, type):
                sig, text = api_reference.first_doc_line(obj)
                if not text:
                    bare.append(qual + "." + n)
    assert not bare, bare
