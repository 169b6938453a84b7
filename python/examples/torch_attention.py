"""cf's neural clustering attention as a layer of a PyTorch model (needs torch).
A PyTorch classifier (embedding, cf attention, LayerNorm, linear head) learns
whether token 1 comes before token 2 in a sequence."""
import torch

import cf.torch


class Classifier(torch.nn.Module):
    def __init__(self, vocab=10, d=32, length=16):
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, d)
        self.pos = torch.nn.Parameter(0.5 * torch.randn(length, d))
        self.attn = cf.torch.Attention("neural-clustering", d_model=d, n_heads=4, clusters=4, seed=0)
        self.norm = torch.nn.LayerNorm(d)
        self.head = torch.nn.Linear(d, 2)

    def forward(self, ids):
        h = self.emb(ids) + self.pos
        return self.head(self.norm(h + self.attn(h)).mean(1))


torch.manual_seed(0)
n, length = 512, 16
ids = torch.randint(3, 10, (n, length))
labels = torch.randint(0, 2, (n,))
for i in range(n):
    a, b = torch.randperm(length)[:2].sort().values.tolist()
    ids[i, a], ids[i, b] = (1, 2) if labels[i] == 1 else (2, 1)
model = Classifier(length=length)
print(model)
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
for step in range(101):
    task = torch.nn.functional.cross_entropy(model(ids), labels)
    # ClusterFormer's eq. 17: the task loss plus the clustering losses (left out, the backward adds them at
    # weight 1; in the loss they scale with it, as under a GradScaler)
    loss = task + model.attn.aux_loss
    opt.zero_grad()
    loss.backward()
    opt.step()
    if step % 20 == 0:
        acc = (model(ids).argmax(1) == labels).float().mean().item()
        print("step %3d  loss %.3f  accuracy %.2f  clustering losses %.4f" % (step, task.item(), acc,
                                                                            model.attn.last_aux_loss))
