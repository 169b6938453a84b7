"""cf.optim: torch.optim's names for cf's optimizers (the same classes as cf.nn.SGD, cf.nn.Adam,
cf.nn.AdamW, cf.nn.Optimizer) and cf.optim.lr_scheduler, schedulers bound to an optimizer, so that
`import cf.optim as optim` serves a script written against torch.optim."""
from ._cf.nn import Adam, AdamW, Optimizer, SGD  # noqa: F401
from . import _lr_scheduler as lr_scheduler  # noqa: F401

__all__ = ["Optimizer", "SGD", "Adam", "AdamW", "lr_scheduler"]
