"""Run by test_dist.py, under `mpirun -np W` or alone (a world of one): data-parallel training of a Python
module with cf.nn.DistributedDataParallel, gradient accumulation under no_sync(), the distributed DataLoader
and the collectives. Each rank writes what it ends with to rank<r>.json in the folder CF_DIST_OUT names."""
import json
import os

import cf
import cf.nn as nn


class Net(nn.Module):
    def __init__(self, generator):
        super().__init__()
        self.fc1 = nn.Linear(6, 16, generator=generator)
        self.fc2 = nn.Linear(16, 3, generator=generator)
        self.scale = nn.Parameter(cf.ones([3]))

    def forward(self, x):
        return self.fc2(cf.tanh(self.fc1(x))) * self.scale


cf.dist.init()
rank, world = cf.dist.rank(), cf.dist.world_size()
model = Net(cf.Generator(1 + rank))  # every rank starts elsewhere: DDP broadcasts rank 0's values
model.to(cf.float64)
ddp = nn.DistributedDataParallel(model)
opt = nn.SGD(model, lr=0.2)
g = cf.Generator(7)
x = cf.randn([12, 6], dtype=cf.float64, generator=g)
y = cf.randint(0, 3, [12], generator=g)
loader = cf.data.DataLoader([(x[i], y[i]) for i in range(12)], batch_size=12 // world, num_replicas=world,
                            rank=rank)
losses, seen = [], []
for step in range(6):
    for batch in loader:  # one global batch of 12: this rank's share
        seen.append(batch.indices)
        opt.zero_grad()
        half = batch.size // 2
        with ddp.no_sync():  # the first half's gradient stays local...
            (nn.cross_entropy(ddp(batch.input[:half]), batch.target[:half], reduction="sum") / batch.size).backward()
        out = ddp(batch.input[half:])  # ...and is averaged with the second's
        loss = nn.cross_entropy(out, batch.target[half:], reduction="sum") / batch.size
        loss.backward()
        opt.step()
        losses.append(loss.item())
total = cf.tensor([losses[0], losses[-1]], dtype=cf.float64)
cf.dist.all_reduce(total, "sum")
gathered = cf.dist.all_gather(cf.full([1], float(rank)))
with open(os.path.join(os.environ["CF_DIST_OUT"], "rank%d.json" % rank), "w") as f:
    json.dump({"rank": rank, "world": world, "params": [p.tolist() for p in model.parameters()],
               "first_loss": total.tolist()[0], "last_loss": total.tolist()[1], "indices": seen[0],
               "gathered": gathered.tolist(), "buckets": ddp.num_buckets}, f)
cf.dist.finalize()
