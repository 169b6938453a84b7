"""The type stubs (.pyi) the build writes beside the package (python/tools/fix_stubs.py): what a type
checker or an editor reads of cf."""
import ast
import builtins
import os

import pytest

import cf

PKG = os.path.dirname(cf.__file__)
ROOT_STUB = os.path.join(PKG, "_cf", "__init__.pyi")
pytestmark = pytest.mark.skipif(not os.path.exists(ROOT_STUB), reason="this cf package has no stubs")


def parse(path):
    with open(path, encoding="utf-8") as f:
        return ast.parse(f.read())


def stub_files():
    for root, _, files in os.walk(PKG):
        for f in files:
            if f.endswith(".pyi"):
                yield os.path.join(root, f)


def annotation_names(node):
    """Bare names used as types in the annotations of a function or an annotated assignment."""
    anns = []
    if isinstance(node, ast.FunctionDef):
        a = node.args
        anns = [x.annotation for x in a.posonlyargs + a.args + a.kwonlyargs + [a.vararg, a.kwarg] if x is not None]
        anns.append(node.returns)
    elif isinstance(node, ast.AnnAssign):
        anns = [node.annotation]
    out = []
    for ann in anns:
        stack = [ann]
        while stack:
            e = stack.pop()
            if isinstance(e, ast.Name):
                out.append(e.id)
            elif e is not None and not isinstance(e, ast.Attribute):
                stack.extend(ast.iter_child_nodes(e))
    return out


def test_no_annotation_names_a_type_its_scope_hides():
    # cf.bool (the dtype constant) made every `-> bool` of the module mean cf.bool, and Tensor's methods
    # float and dtype the same inside Tensor's signatures
    for path in stub_files():
        tree = parse(path)
        module_values = {t.id for n in tree.body if isinstance(n, (ast.Assign, ast.AnnAssign))
                         for t in (n.targets if isinstance(n, ast.Assign) else [n.target]) if isinstance(t, ast.Name)}

        def check(body, hidden, where):
            for node in body:
                if isinstance(node, ast.ClassDef):
                    own = {n.name for n in node.body if isinstance(n, ast.FunctionDef)}
                    own |= {t.id for n in node.body if isinstance(n, (ast.Assign, ast.AnnAssign))
                            for t in (n.targets if isinstance(n, ast.Assign) else [n.target])
                            if isinstance(t, ast.Name)}
                    check(node.body, own, where + node.name + ".")
                    continue
                for name in annotation_names(node):
                    assert name not in hidden, "%s: %s%s annotates with %r, which its class binds" % (
                        path, where, getattr(node, "name", "?"), name)
                    assert not (name in module_values and hasattr(builtins, name)), \
                        "%s: %s%s annotates with %r, a value of the module" % (path, where, getattr(node, "name", "?"), name)

        check(tree.body, set(), "")


def test_inplace_ops_init_and_exceptions_are_in_the_stubs():
    tree = parse(ROOT_STUB)
    top = {n.name: n for n in tree.body if isinstance(n, (ast.ClassDef, ast.FunctionDef))}
    tensor = {n.name for n in top["Tensor"].body if isinstance(n, ast.FunctionDef)}
    # a trailing "_" reads as private to stubgen: every in-place op was missing
    assert {"add_", "mul_", "zero_", "requires_grad_", "copy_", "clamp_"} <= tensor
    assert {"add_", "copy_", "fill_"} <= set(top)
    init = parse(os.path.join(PKG, "_cf", "nn", "init.pyi"))
    assert {"xavier_uniform_", "normal_", "uniform_"} <= {n.name for n in init.body if isinstance(n, ast.FunctionDef)}
    # the exceptions as classes with their runtime bases (they came as a cyclic `from cf import ...`)
    assert not any(isinstance(n, ast.ImportFrom) and n.module == "cf" for n in tree.body)
    for name in ("Error", "ValueError", "IndexError", "IOError", "ShapeError", "DTypeError", "KMeansTooFewPointsError"):
        bases = [ast.unparse(b) for b in top[name].bases]
        runtime = [("builtins." if b.__module__ == "builtins" else "") + b.__name__ for b in getattr(cf, name).__bases__]
        assert bases == runtime, name


def test_submodules_have_stubs_under_their_package_names():
    # `from cf.nn import Linear` works at run time through sys.modules; type checkers need a file
    # (cf.nn a package of stubs, so that `import cf.nn.init` resolves too)
    for name, rel in (("nn", "nn/__init__.pyi"), ("nn.init", "nn/init.pyi"), ("models", "models.pyi"),
                      ("data", "data.pyi"), ("cuda", "cuda.pyi"), ("autograd", "autograd.pyi"),
                      ("dist", "dist.pyi")):
        tree = parse(os.path.join(PKG, rel))
        assert any(isinstance(n, ast.ImportFrom) and n.module == "cf._cf." + name for n in tree.body), name
    # an attribute the runtime sets on the exception's instances
    top = {n.name: n for n in parse(ROOT_STUB).body if isinstance(n, ast.ClassDef)}
    assert any(isinstance(n, ast.AnnAssign) and n.target.id == "at_most" for n in top["KMeansTooFewPointsError"].body)


def test_operators_and_values_are_typed():
    tree = parse(ROOT_STUB)
    tensor = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Tensor")
    returns = {}
    for n in tensor.body:
        if isinstance(n, ast.FunctionDef):
            returns.setdefault(n.name, set()).add(ast.unparse(n.returns).replace("builtins.", ""))
    # `x + 1`, `2 * x`, `x == 0` were typed object (the NumPy-operand overloads)
    for op in ("__add__", "__radd__", "__mul__", "__rmul__", "__eq__", "__lt__", "__and__", "__rand__"):
        assert returns[op] == {"Tensor"}, (op, returns[op])
    assert returns["item"] == {"float | int | bool"}
    assert returns["__int__"] == {"int"}


def test_members_every_module_holds_are_typed_tensor():
    # Linear.weight was `Tensor | None`: `lin.weight.shape` failed a type check though no Linear lacks it
    tree = parse(os.path.join(PKG, "_cf", "nn", "__init__.pyi"))
    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}

    def getter(cls, name):
        for n in classes[cls].body:
            if isinstance(n, ast.FunctionDef) and n.name == name and any(
                    isinstance(d, ast.Name) and d.id == "property" for d in n.decorator_list):
                return ast.unparse(n.returns).replace("cf._cf.", "")
        raise AssertionError(f"{cls}.{name} has no property getter")

    for cls, name in (("Linear", "weight"), ("Embedding", "weight"), ("MemoryBank", "centroids"),
                      ("NeuralClusteringAttention", "w_c")):
        assert getter(cls, name) == "Tensor", (cls, name)
    for cls, name in (("Linear", "bias"), ("LayerNorm", "weight"), ("NeuralClusteringAttention", "centroids")):
        assert getter(cls, name) == "Tensor | None", (cls, name)


def test_methods_the_package_sets_in_python_are_in_their_classes():
    # Module.parameters and Embedding.from_pretrained are Python functions (cf/_nn_extras.py) set on the C++
    # classes; stubgen left them as module-level imports, so a type checker saw no Module.parameters
    tree = parse(os.path.join(PKG, "_cf", "nn", "__init__.pyi"))
    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
    methods = {c: {n.name: n for n in node.body if isinstance(n, ast.FunctionDef)} for c, node in classes.items()}
    params = methods["Module"]["parameters"]
    assert [a.arg for a in params.args.args] == ["self", "recurse"]
    assert ast.unparse(params.returns) == "cf._nn_extras._Parameters"
    pretrained = methods["Embedding"]["from_pretrained"]
    assert any(isinstance(d, ast.Name) and d.id == "staticmethod" for d in pretrained.decorator_list)
    assert ast.unparse(pretrained.returns) == "cf._cf.nn.Embedding"
    module_level = {a.asname or a.name for n in tree.body if isinstance(n, ast.ImportFrom) for a in n.names}
    assert not {"parameters", "from_pretrained"} & module_level
    # what the stub promises holds at run time: an iterator that is a list
    from cf._nn_extras import _Parameters
    p = cf.nn.Linear(2, 3).parameters()
    assert isinstance(p, _Parameters) and isinstance(p, list) and next(p).shape == (3, 2)


def test_python_classes_of_cf_nn_resolve_and_overloads_type_calls():
    # cf._cf.nn's stub imported CrossEntropyLoss & co. `from cf.nn`, whose stub is `from cf._cf.nn import *`: a cycle
    # (type checkers made them Any); they come from the private modules that define them
    tree = parse(os.path.join(PKG, "_cf", "nn", "__init__.pyi"))
    sources = {a.asname or a.name: n.module for n in tree.body if isinstance(n, ast.ImportFrom) for a in n.names}
    assert not [name for name, module in sources.items() if module == "cf.nn"]
    assert sources["MultiheadAttention"] == "cf._nn_extras" and sources["ModuleDict"] == "cf._containers"
    # stride() and stride(dim), nonzero() and nonzero(as_tuple=True): one overload each, so that
    # `s: int = x.stride(0)` and `x.nonzero()[:, 0]` type-check
    tensor = next(n for n in parse(ROOT_STUB).body if isinstance(n, ast.ClassDef) and n.name == "Tensor")
    for name, returns in (("stride", {"builtins.tuple[builtins.int, ...]", "builtins.int"}),
                          ("nonzero", {"cf._cf.Tensor", "builtins.tuple[cf._cf.Tensor, ...]"})):
        defs = [n for n in tensor.body if isinstance(n, ast.FunctionDef) and n.name == name]
        assert {ast.unparse(d.returns) for d in defs} == returns
        assert all(any(ast.unparse(dec) == "typing.overload" for dec in d.decorator_list) for d in defs)
