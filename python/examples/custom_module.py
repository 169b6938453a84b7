"""A model written in Python, as a torch.nn.Module subclass is: cf's neural clustering attention
(the ClusterFormer paper's layer) inside a small classifier whose blocks, learned scale and
running counter the class registers by assigning them. The task: is the sequence's first token
among its last three (the attention has to compare positions)."""
import cf
import cf.nn as nn


class FeedForward(nn.UnaryModule):  # one tensor in, one out: also usable inside cf.nn.Sequential
    def __init__(self, d, generator):
        super().__init__()
        self.fc1 = nn.Linear(d, 2 * d, generator=generator)
        self.fc2 = nn.Linear(2 * d, d, generator=generator)
        self.norm = nn.LayerNorm(d)

    def forward(self, x):
        return self.norm(x + self.fc2(cf.gelu(self.fc1(x))))


class Classifier(nn.Module):
    def __init__(self, vocab, d, classes, layers, generator):
        super().__init__()
        self.embed = nn.Embedding(vocab, d, generator=generator)
        self.pos = nn.Parameter(cf.randn([16, d], generator=generator) * 0.1)  # learned positions
        self.attn = nn.ModuleList([nn.MultiHeadAttention("neural-clustering", d_model=d, n_heads=2, clusters=2,
                                                         generator=generator) for _ in range(layers)])
        self.ff = nn.ModuleList([FeedForward(d, generator) for _ in range(layers)])
        self.head = nn.Linear(d, classes, generator=generator)
        self.register_buffer("steps", cf.zeros([1]))

    def forward(self, ids):
        n = ids.shape[1]
        h = self.embed(ids) + self.pos[:n]
        for attn, ff in zip(self.attn, self.ff):
            h = ff(h + attn(h))
        if self.training:
            self.steps = self.steps + 1
        return self.head(h[:, 0])


gen = cf.Generator(3)
model = Classifier(vocab=8, d=32, classes=2, layers=2, generator=gen)
print("parameters:", ", ".join(name for name, _ in model.named_parameters()[:6]), "...",
      model.num_parameters(), "in all")
opt = nn.Adam(model, lr=3e-3)

ids = cf.randint(0, 8, [256, 12], generator=gen)
labels = cf.tensor([int(row[0] in row[-3:]) for row in ids.tolist()], dtype=cf.int64)
for epoch in range(30):
    total = 0.0
    for start in range(0, 256, 32):
        loss = nn.cross_entropy(model(ids[start:start + 32]), labels[start:start + 32])
        opt.zero_grad()
        loss.backward()
        opt.step()
        total += loss.item()
    if epoch % 5 == 0 or epoch == 29:
        print("epoch %d  loss %.3f" % (epoch, total / 8))

model.eval()
with cf.no_grad():
    accuracy = (model(ids).argmax(axis=1) == labels).to(cf.float32).mean().item()
print("training accuracy %.2f after %d steps" % (accuracy, int(model.steps.item())))
