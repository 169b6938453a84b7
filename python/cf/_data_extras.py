"""torch.utils.data's Subset and random_split under cf.data (= cf.utils.data; set by cf/__init__.py). cf's
DataLoader takes any object with __len__ and __getitem__, so both are plain Python sequences of examples."""
import numbers as _numbers

from . import _cf

__all__ = ["Subset", "random_split"]


class Subset:
    """The examples of dataset at the given indices, in that order (torch.utils.data.Subset)."""

    def __init__(self, dataset, indices):
        self.dataset = dataset
        self.indices = [int(i) for i in (indices.tolist() if isinstance(indices, _cf.Tensor) else indices)]

    def __len__(self):
        return len(self.indices)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self.dataset[j] for j in self.indices[i]]
        return self.dataset[self.indices[i]]


def random_split(dataset, lengths, generator=None):
    """Disjoint random Subsets of the given lengths (torch.utils.data.random_split): integers summing to
    len(dataset), or fractions summing to 1 (floor of each, the remainder handed out one by one from the first,
    as torch's). The permutation is cf.randperm's with generator (None: the default generator, cf.manual_seed)."""
    n = len(dataset)
    lengths = list(lengths)
    if not lengths or not all(isinstance(x, _numbers.Real) and not isinstance(x, bool) and x >= 0 for x in lengths):
        raise _cf.ValueError("[random_split] lengths must be non-negative numbers, got %r" % (lengths,))
    if all(isinstance(x, _numbers.Integral) for x in lengths):
        if sum(lengths) != n:
            raise _cf.ValueError("[random_split] the lengths add up to %d, the dataset has %d examples"
                                 % (sum(lengths), n))
    else:
        if abs(sum(lengths) - 1) > 1e-9:
            raise _cf.ValueError("[random_split] fractions must add up to 1, got %r (sum %r)" % (lengths, sum(lengths)))
        counts = [int(x * n) for x in lengths]
        for i in range(n - sum(counts)):
            counts[i % len(counts)] += 1
        lengths = counts
    order = _cf.randperm(n, generator=generator).tolist() if n else []
    out, at = [], 0
    for length in lengths:
        out.append(Subset(dataset, order[at:at + length]))
        at += length
    return out


for _name in __all__:
    setattr(_cf.data, _name, globals()[_name])
