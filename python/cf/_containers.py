"""cf.nn.ModuleDict, written in Python on cf.nn.Module (its entries are registered submodules)."""
from . import _cf


class ModuleDict(_cf.nn.Module):
    """Submodules by name, in insertion order, as torch.nn.ModuleDict: `d["enc"] = cf.nn.Linear(4, 4)` registers
    the module under that name (its parameters are d's, "enc.weight" in state_dict), `d["enc"]`, `"enc" in d`,
    len, iteration over the names, keys/values/items, update. Built from a dict or (name, module) pairs. Like
    every registered submodule, an entry can be replaced but not removed (del and pop are refused). It has no
    forward: a model picks its entries."""

    def __init__(self, modules=None):
        """An empty ModuleDict, or one holding the entries of a dict or of (name, module) pairs."""
        super().__init__()
        if modules is not None:
            self.update(modules)

    def _entries(self):
        return dict(self.named_children())

    def __getitem__(self, key):
        entries = self._entries()
        if key not in entries:
            raise KeyError("[ModuleDict] no module named %r (names: %s)" % (key, ", ".join(entries) or "none"))
        return entries[key]

    def __setitem__(self, key, module):
        if not isinstance(key, str):
            raise TypeError("[ModuleDict] names are strings, got %s" % type(key).__name__)
        if key == "forward" or hasattr(type(self), key):  # "keys", "train": the entry would shadow the method
            raise KeyError("[ModuleDict] %r names an attribute of %s; choose another name" % (key, type(self).__name__))
        self.register_module(key, module)

    def __delitem__(self, key):
        raise TypeError("[ModuleDict] an entry cannot be removed (%r): a registered cf submodule stays for the "
                        "module's life; replace it instead (d[name] = cf.nn.Identity())" % (key,))

    def pop(self, key):
        """Refused: entries cannot be removed (see the class)."""
        self.__delitem__(key)

    def __len__(self):
        return len(self._entries())

    def __iter__(self):
        return iter(list(self._entries()))

    def __contains__(self, key):
        return key in self._entries()

    def keys(self):
        """The names, in insertion order."""
        return list(self._entries().keys())

    def values(self):
        """The modules, in insertion order."""
        return list(self._entries().values())

    def items(self):
        """(name, module) pairs, in insertion order."""
        return list(self._entries().items())

    def update(self, modules):
        """Adds (or replaces) every entry of a dict, a ModuleDict or an iterable of (name, module) pairs."""
        pairs = modules.items() if hasattr(modules, "items") else modules
        for i, pair in enumerate(pairs):
            if not isinstance(pair, (tuple, list)) or len(pair) != 2:
                raise TypeError("[ModuleDict] update takes a dict or (name, module) pairs; item %d is %r" % (i, pair))
            self[pair[0]] = pair[1]


ModuleDict.__module__ = "cf.nn"
