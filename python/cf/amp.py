"""cf.amp: torch.amp's names, so that `from cf.amp import autocast, GradScaler` serves a script written against
torch.amp. autocast is cf.autocast; GradScaler is cf.nn.GradScaler taking torch.amp.GradScaler's leading
device argument ("cuda" or "cpu": cf's scaler works on any device, so it is only checked)."""
from . import _cf
from . import autocast  # noqa: F401  (the package defines it before importing this module)

__all__ = ["autocast", "GradScaler"]


class GradScaler(_cf.nn.GradScaler):
    """Dynamic loss scaling (cf.nn.GradScaler) with torch.amp.GradScaler's signature: GradScaler("cuda",
    init_scale=2.0**16, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000, enabled=True)."""

    def __init__(self, device: str = "cuda", init_scale: float = 2.0 ** 16, growth_factor: float = 2.0,
                 backoff_factor: float = 0.5, growth_interval: int = 2000, enabled: bool = True) -> None:
        if not isinstance(device, str) or device.split(":")[0] not in ("cpu", "cuda"):
            raise _cf.ValueError("[GradScaler] device must be \"cuda\" or \"cpu\" (torch.amp's first argument), "
                                 "got %r; cf.nn.GradScaler takes init_scale first" % (device,))
        super().__init__(init_scale=init_scale, growth_factor=growth_factor, backoff_factor=backoff_factor,
                         growth_interval=growth_interval, enabled=enabled)
