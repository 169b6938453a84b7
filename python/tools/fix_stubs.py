"""Makes nanobind's generated stubs (.pyi) read right to type checkers and editors.

    python fix_stubs.py RAW_DIR OUT_DIR

RAW_DIR holds stubgen's output for cf._cf (RAW_DIR/_cf/__init__.pyi, ...); OUT_DIR is the
package folder (cf/), which receives OUT_DIR/_cf/... and one stub per public submodule.
The extension must be importable (the build puts it on PYTHONPATH), for the exceptions.

What stubgen leaves and this fixes (each found by running mypy over user code):
- Names the module or a class binds shadow builtin types in annotations: `bool: dtype`
  (the dtype constant cf.bool) made every `-> bool` of the module mean cf.bool, and
  Tensor's methods `float` and `dtype` the same for `x: float` and `dtype: dtype` in
  Tensor's signatures. Such annotations name `builtins.X` or `cf._cf.X`.
- The exceptions, whose __module__ is "cf", came as `from cf import Error, ...`, a cycle
  (cf re-exports them from cf._cf): a type checker resolved none. They are written out as
  classes with their runtime bases.
- Python functions cf's package sets on the extension's classes (Module.parameters,
  Embedding.from_pretrained: cf/_nn_extras.py) came as module-level imports, `from
  cf._nn_extras import _parameters as parameters`, and not in their class: a type checker saw
  no Module.parameters. Each is written into its class as a method stub with the function's
  own annotations (names of its module qualified: `cf._nn_extras._Parameters`).
- The classes cf's package defines in Python for cf.nn (CrossEntropyLoss, ModuleDict, ...) came as
  `from cf.nn import ...` in cf._cf.nn's stub, a cycle with cf.nn's `from cf._cf.nn import *`:
  they are imported from the private modules that define them.
- `import cf.nn` / `from cf.nn import Linear` work at run time through sys.modules
  (cf/__init__.py); OUT_DIR/nn/__init__.pyi, nn/init.pyi, models.pyi, data.pyi, cuda.pyi,
  autograd.pyi and dist.pyi let type checkers resolve them too.
"""
import ast
import importlib
import os
import sys

BUILTIN_TYPES = {"bool", "int", "float", "complex", "str", "bytes", "bytearray", "object", "list", "dict",
                 "tuple", "set", "frozenset", "type", "slice", "memoryview"}
SUBMODULES = ("nn", "models", "data", "cuda", "autograd", "dist")
# Attributes the runtime sets on an exception's instances (python/src/module.cpp).
EXCEPTION_ATTRIBUTES = {"KMeansTooFewPointsError": (("at_most", "builtins.int"),)}


def bindings(body):
    """name -> the binding statement kind ("class", "def", "value", "import") of a body's names."""
    out = {}
    for node in body:
        if isinstance(node, ast.ClassDef):
            out[node.name] = "class"
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out[node.name] = "def"
        elif isinstance(node, ast.Assign):
            for t in node.targets:
                if isinstance(t, ast.Name):
                    out[t.id] = "value"
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            out[node.target.id] = "value"
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for a in node.names:
                out[(a.asname or a.name).split(".")[0]] = "import"
    return out


def annotation_names(expr):
    """The Name nodes of an annotation that name a type by themselves (not the root of a.b.c)."""
    if expr is None:
        return
    if isinstance(expr, ast.Name):
        yield expr
    elif isinstance(expr, ast.Attribute):
        return
    else:
        for child in ast.iter_child_nodes(expr):
            yield from annotation_names(child)


def annotations_of(node):
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        a = node.args
        for arg in a.posonlyargs + a.args + a.kwonlyargs + [a.vararg, a.kwarg]:
            if arg is not None:
                yield arg.annotation
        yield node.returns
    elif isinstance(node, ast.AnnAssign):
        yield node.annotation


def fix_shadowing(text, module):
    """Rewrites annotation names that a binding of the module or of the enclosing class shadows."""
    tree = ast.parse(text)
    module_names = bindings(tree.body)
    edits = []  # (line, col, end_col, replacement)

    def visit(body, class_names):
        for node in body:
            if isinstance(node, ast.ClassDef):
                visit(node.body, bindings(node.body))
                continue
            for ann in annotations_of(node):
                for name in annotation_names(ann):
                    n = name.id
                    new = None
                    if class_names is not None and class_names.get(n) in ("def", "value"):
                        # a method or attribute of the class (Tensor.float, Tensor.dtype) hides the type
                        if n in BUILTIN_TYPES:
                            new = "builtins." + n
                        elif module_names.get(n) == "class":
                            new = module + "." + n
                    elif module_names.get(n) in ("def", "value") and n in BUILTIN_TYPES:
                        new = "builtins." + n  # the module's own constant (cf.bool)
                    if new:
                        edits.append((name.lineno, name.col_offset, name.end_col_offset, new))

    visit(tree.body, None)
    lines = text.split("\n")
    for line, col, end, new in sorted(edits, reverse=True):
        b = lines[line - 1].encode("utf-8")  # ast's columns count UTF-8 bytes
        lines[line - 1] = (b[:col] + new.encode("utf-8") + b[end:]).decode("utf-8")
    return "\n".join(lines)


def exception_classes(module):
    """Class statements for the exceptions a stub imports from cf, with their runtime bases."""
    mod = importlib.import_module(module)
    out = []
    for name in sorted(dir(mod), key=lambda n: (len(getattr(mod, n).__mro__) if isinstance(getattr(mod, n), type)
                                                else 0, n)):
        cls = getattr(mod, name)
        if not (isinstance(cls, type) and issubclass(cls, BaseException) and cls.__module__ == "cf"):
            continue
        bases = ", ".join(("builtins." if b.__module__ == "builtins" else "") + b.__name__ for b in cls.__bases__)
        doc = (cls.__doc__ or "").strip().split("\n")[0]
        body = "    %s\n" % (repr(doc) if doc else "...")
        for attr, tp in EXCEPTION_ATTRIBUTES.get(name, ()):
            body += "    %s: %s\n" % (attr, tp)
        out.append("class %s(%s):\n%s" % (name, bases, body))
    return out


def fix_imports_from_cf(text, module):
    """Replaces `from cf import (...)` (the exceptions, and cf's __array_function__ helper) with classes."""
    tree = ast.parse(text)
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module == "cf" and node.level == 0:
            lines = text.split("\n")
            classes = "\n".join(exception_classes(module))
            return "\n".join(lines[:node.lineno - 1] + [classes] + lines[node.end_lineno:])
    return text


def method_stub(name, fn, kind, source):
    """The stub lines of fn set on a class as `name` (kind: "method" or "staticmethod"): its annotations (strings),
    the names its module (source) defines qualified by that module, builtin types as builtins.X."""
    import inspect
    src = importlib.import_module(source)

    def qualify(ann):
        if ann is inspect.Parameter.empty:
            return None
        tree = ast.parse(ann if isinstance(ann, str) else inspect.formatannotation(ann), mode="eval")
        for n in ast.walk(tree):
            if isinstance(n, ast.Name) and n.id in BUILTIN_TYPES:
                n.id = "builtins." + n.id
            elif isinstance(n, ast.Name) and n.id in vars(src):
                value = vars(src)[n.id]  # a module alias (_cf) by the module's own name
                n.id = value.__name__ if inspect.ismodule(value) else "%s.%s" % (source, n.id)
        return ast.unparse(tree)

    overloads = getattr(fn, "_stub_overloads", None)
    if overloads:  # [(parameters, return type)] in stub syntax, where one signature would type calls too loosely
        out = []
        for params, ret in overloads:
            out += ["    @typing.overload", "    def %s(%s) -> %s: ..." % (name, params, ret)]
        return out
    P = inspect.Parameter
    sig = inspect.signature(fn)
    params, star = [], False
    for i, p in enumerate(sig.parameters.values()):
        ann = None if kind == "method" and i == 0 else qualify(p.annotation)
        if ann is None and not (kind == "method" and i == 0):
            sys.exit("fix_stubs: %s.%s: parameter %s has no annotation" % (source, fn.__name__, p.name))
        if p.kind == P.KEYWORD_ONLY and not star:
            params.append("*")
        star = star or p.kind in (P.KEYWORD_ONLY, P.VAR_POSITIONAL)
        text = {P.VAR_POSITIONAL: "*", P.VAR_KEYWORD: "**"}.get(p.kind, "") + p.name + (": " + ann if ann else "")
        if p.default is not P.empty:
            text += " = " + repr(p.default)
        params.append(text)
        if p.kind == P.POSITIONAL_ONLY and all(q.kind != P.POSITIONAL_ONLY for q in list(sig.parameters.values())[i + 1:]):
            params.append("/")
    ret = qualify(sig.return_annotation)
    if ret is None:
        sys.exit("fix_stubs: %s.%s has no return annotation" % (source, fn.__name__))
    out = ["    @staticmethod"] if kind == "staticmethod" else []
    out.append("    def %s(%s) -> %s:" % (name, ", ".join(params), ret))
    doc = inspect.getdoc(fn)
    if doc:
        out += ['        """'] + ["        " + l if l else "" for l in doc.replace('"""', "'''").split("\n")] + \
               ['        """']
    else:
        out.append("        ...")
    return out


def fix_public_reexports(text, module):
    """`from cf.nn import (CrossEntropyLoss as CrossEntropyLoss, ...)` in cf._cf.nn's stub: the classes cf's
    package defines in Python and sets on the extension's module name cf.nn as their __module__, while cf.nn's stub
    is `from cf._cf.nn import *`: a cycle, so type checkers resolved none of them (Any). Each is imported from the
    private module that defines it (cf._nn_extras, cf._containers, ...)."""
    public = {"cf." + s for s in SUBMODULES}
    mod = importlib.import_module(module)
    tree = ast.parse(text)
    lines = text.split("\n")
    for node in reversed(tree.body):
        if not (isinstance(node, ast.ImportFrom) and node.module in public):
            continue
        by_source = {}
        for alias in node.names:
            name = alias.asname or alias.name
            obj = getattr(mod, name, None)
            source = next((m for m in sorted(sys.modules) if m.startswith("cf._") and not m.startswith("cf._cf")
                           and getattr(sys.modules[m], alias.name, None) is obj and obj is not None), node.module)
            by_source.setdefault(source, []).append(alias)
        new = []
        for source, aliases in sorted(by_source.items()):
            new += ["from %s import (" % source] + ["    %s as %s," % (a.name, a.asname or a.name) for a in aliases] + [")"]
        lines[node.lineno - 1:node.end_lineno] = new
    return "\n".join(lines)


def fix_patched_methods(text, module):
    """Moves the functions cf's package sets on this module's classes from the module's imports into their
    classes (module docstring)."""
    mod = importlib.import_module(module)
    tree = ast.parse(text)
    lines = text.split("\n")
    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
    inserts, imports = {}, set()  # a class's last line -> the stub lines to add after it; modules they name
    for node in tree.body:
        if not (isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("cf._")
                and not node.module.startswith("cf._cf")):
            continue
        src = importlib.import_module(node.module)
        kept = []
        for alias in node.names:
            fn, name = getattr(src, alias.name, None), alias.asname or alias.name
            owner = kind = None
            for cname in classes:
                attr = vars(getattr(mod, cname, object)).get(name)
                if fn is not None and attr is fn:
                    owner, kind = cname, "method"
                elif isinstance(attr, staticmethod) and attr.__func__ is fn:
                    owner, kind = cname, "staticmethod"
            if owner is None:
                kept.append(alias)
                continue
            inserts.setdefault(classes[owner].end_lineno, []).extend([""] + method_stub(name, fn, kind, node.module))
            imports.add(node.module)
        for i in range(node.lineno - 1, node.end_lineno):
            lines[i] = None
        if kept:
            lines[node.lineno - 1] = "\n".join(["from %s import (" % node.module] + [
                "    %s%s," % (a.name, " as " + a.asname if a.asname else "") for a in kept] + [")"])
    if not inserts:
        return text
    out = []
    for i, line in enumerate(lines, start=1):
        if line is not None:
            out.append(line)
        out.extend(inserts.get(i, []))
    first = tree.body[0]
    at = first.end_lineno if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) else 0
    body = "\n".join(out)
    used = [m for m in sorted(imports) if m + "." in body]  # (cf._cf's own names are imported already)
    return "\n".join(out[:at] + ["", "import builtins"] + ["import " + m for m in used] + out[at:])


def add_imports(text):
    """`import builtins` / `import typing` / `import cf._cf` where the text uses them, after the docstring."""
    tree = ast.parse(text)
    have = {a.name for n in tree.body if isinstance(n, ast.Import) for a in n.names}
    need = [m for m, used in (("builtins", "builtins."), ("typing", "typing."), ("cf._cf", "cf._cf."))
            if used in text and m not in have]
    if not need:
        return text
    first = tree.body[0]
    at = first.end_lineno if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) else 0
    lines = text.split("\n")
    return "\n".join(lines[:at] + [""] + ["import " + m for m in need] + lines[at:])


def module_of(rel):
    """'_cf/nn/__init__.pyi' -> 'cf._cf.nn'."""
    parts = rel[:-len(".pyi")].split(os.sep)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(["cf"] + parts)


def main(raw, out):
    written = []
    for root, _, files in os.walk(os.path.join(raw, "_cf")):
        for f in sorted(files):
            if not f.endswith(".pyi"):
                continue
            src = os.path.join(root, f)
            rel = os.path.relpath(src, raw)
            module = module_of(rel)
            with open(src, encoding="utf-8") as fh:
                text = fh.read()
            text = fix_imports_from_cf(text, module)
            text = fix_patched_methods(text, module)
            text = fix_public_reexports(text, module)
            text = fix_shadowing(text, module)
            text = add_imports(text)
            ast.parse(text)  # still a valid stub
            dst = os.path.join(out, rel)
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            tmp = dst + ".tmp"
            with open(tmp, "w", encoding="utf-8") as fh:
                fh.write(text)
            os.replace(tmp, dst)
            written.append(rel)
    # cf.nn is a package of stubs (cf/nn/__init__.pyi, cf/nn/init.pyi), so that `import cf.nn.init`
    # resolves too; the others are one file each.
    for name in SUBMODULES + ("nn.init",):
        parts = name.split(".")
        if name == "nn":
            rel = os.path.join("nn", "__init__.pyi")
        else:
            rel = os.path.join(*parts) + ".pyi"
        dst = os.path.join(out, rel)
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        text = ('"""cf.%s: the extension\'s cf._cf.%s under its package name (cf/__init__.py)."""\n\n'
                "from cf._cf.%s import *\n" % (name, name, name))
        if name == "nn":
            text += "from cf._cf.nn import init as init\n"
        with open(dst + ".tmp", "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(dst + ".tmp", dst)
    if not written:
        sys.exit("fix_stubs: no stubs under %s/_cf" % raw)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
