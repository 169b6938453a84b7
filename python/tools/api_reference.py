#!/usr/bin/env python3
"""Write docs/python-api.md: every public name the cf package binds, with its
signature and the first paragraph of its docstring, found by introspection of the
built module (the docstrings come from the C++ header comments, see
python/src/). python/tests/test_api_reference.py fails when a bound name is
missing from the file, so regenerate it after adding a binding:

    PYTHONPATH=build/python .venv/bin/python python/tools/api_reference.py
"""
import inspect
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Dunder methods worth listing (operators and protocols); the others are Python's.
DUNDERS = {"__init__", "__getitem__", "__setitem__", "__len__", "__iter__", "__call__", "__dlpack__",
           "__dlpack_device__", "__array__", "__add__", "__radd__", "__sub__", "__rsub__", "__mul__",
           "__rmul__", "__truediv__", "__rtruediv__", "__pow__", "__rpow__", "__matmul__", "__neg__", "__abs__",
           "__invert__", "__and__", "__or__", "__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__",
           "__iadd__", "__isub__", "__imul__", "__itruediv__", "__bool__", "__float__", "__int__", "__index__",
           "__enter__", "__exit__", "__next__"}


def modules():
    import cf
    import cf.optim
    out = [("cf", cf), ("cf.nn", cf.nn), ("cf.nn.init", cf.nn.init), ("cf.nn.functional", cf.nn.functional),
           ("cf.nn.utils", cf.nn.utils), ("cf.nn.utils.rnn", cf.nn.utils.rnn),
           ("cf.models", cf.models), ("cf.data", cf.data), ("cf.cuda", cf.cuda), ("cf.autograd", cf.autograd),
           ("cf.dist", cf.dist), ("cf.optim", cf.optim), ("cf.optim.lr_scheduler", cf.optim.lr_scheduler)]
    try:
        import cf.torch
        out.append(("cf.torch", cf.torch))
    except ImportError:
        pass
    return out


def public_names(qual, mod):
    import cf
    # (cf's __all__ leaves out its bool and float dtypes for `from cf import *`; the reference lists them)
    names = (getattr(mod, "__all__", None) if qual != "cf" else None) or [n for n in dir(mod) if not n.startswith("_")]
    skip_sub = {"nn", "models", "data", "cuda", "init", "torch", "autograd", "dist"}
    for n in sorted(names):
        obj = getattr(mod, n)
        if inspect.ismodule(obj) or n in skip_sub:
            continue
        if qual == "cf.torch" and getattr(obj, "__module__", "") != "cf.torch":
            continue
        yield n, obj


def members(cls):
    for n in sorted(vars(cls)):
        if n.startswith("_") and n not in DUNDERS:
            continue
        obj = vars(cls)[n]
        if n == "__init__" and (inspect.getdoc(obj) or "").startswith("Initialize self"):
            continue  # not constructible from Python (made by cf)
        yield n, obj


def first_doc_line(obj):
    # a function written in Python: its own docstring (getdoc would inherit a nanobind base's __init__ text)
    doc = (inspect.cleandoc(obj.__doc__ or "") if inspect.isfunction(obj) else inspect.getdoc(obj)) or ""
    lines = [l.strip() for l in doc.splitlines()]
    sigs = [l for l in lines if l and "(" in l and l.split("(")[0].replace(".", "").replace("_", "").isalnum()
            and " -> " in l and not l.endswith(".") or l.startswith(("def ",))]  # (a sentence is no signature)
    # nanobind's overloads: "Overloaded function." then "1. ``sig``" before each description
    # the first paragraph of description, joined (a Python class's docstring wraps its sentences over lines:
    # its first line alone stopped mid-sentence)
    para = []
    for l in lines:
        if not l or l in sigs or l == "Overloaded function." or (l[:1].isdigit() and ". ``" in l):
            if para:
                break
            continue
        para.append(l)
    return sigs, " ".join(para)


def python_signature(name, obj):
    """[name(params)] for a function or class written in Python (nanobind writes its own into __doc__)."""
    if not (inspect.isfunction(obj) or inspect.isclass(obj)) or "nb_" in type(obj).__name__:
        return []
    try:
        return [name + str(inspect.signature(obj))]
    except (TypeError, ValueError):
        return []


def shown(sigs):
    """': `sig`' for one signature; each overload's signature, joined by 'or', for several."""
    return (": " + " or ".join("`%s`" % s for s in sigs)) if sigs else ""


def qualified_names():
    """Every name the reference must list: modules' functions and classes, and each class's members."""
    out = []
    for qual, mod in modules():
        for n, obj in public_names(qual, mod):
            out.append(qual + "." + n)
            if inspect.isclass(obj) and not issubclass(obj, BaseException):
                for m, _ in members(obj):
                    out.append(qual + "." + n + "." + m)
    return out


def render():
    import cf
    lines = ["# Python API reference", "",
             "Every public name of the `cf` package (python/), generated from the built module by",
             "`python/tools/api_reference.py`; `python/tests/test_api_reference.py` fails when a bound name is",
             "missing here. Signatures are nanobind's (every overload's, joined by 'or'); the text is the first paragraph",
             "of each docstring, taken from the C++ header comments. The README's Python section shows them",
             "in use.", ""]
    for qual, mod in modules():
        lines += ["## " + qual, ""]
        doc = (inspect.getdoc(mod) or "").split("\n\n")[0].replace("\n", " ")
        if doc:
            lines += [doc, ""]
        for n, obj in public_names(qual, mod):
            sig, text = first_doc_line(obj)
            sig = sig or python_signature(n, obj)
            kind = "class" if inspect.isclass(obj) else ("function" if callable(obj) else "value")
            if kind == "value":
                text = text if not isinstance(obj, (str, int, float)) else "= %r" % (obj,)
                if type(obj).__name__ == "dtype":
                    text = "the dtype %s" % obj
            lines.append("- `%s.%s` (%s)%s%s" % (qual, n, kind, shown(sig),
                                                  (" " + text) if text else ""))
            if inspect.isclass(obj) and not issubclass(obj, BaseException):
                for m, mobj in members(obj):
                    msig, mtext = first_doc_line(mobj)
                    msig = msig or python_signature(m, mobj)
                    lines.append("  - `%s.%s.%s`%s%s" % (qual, n, m, shown(msig),
                                                          (" " + mtext) if mtext else ""))
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def main():
    path = os.path.join(ROOT, "docs", "python-api.md")
    text = render()
    with open(path, "w") as f:
        f.write(text)
    print("api_reference: wrote %s (%d names)" % (path, len(qualified_names())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
