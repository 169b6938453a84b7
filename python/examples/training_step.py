"""The README's "training step written out by hand" in Python: an encoder
classifier built from a config, AdamW, an inverse-square-root schedule, gradient
clipping, on a small generated task (the class is the number of distinct tokens below 5, mod 5)."""
import cf

gen = cf.Generator(1)
model = cf.models.EncoderClassifier({"vocab_size": 1000, "d_model": 32, "n_heads": 4, "num_classes": 5,
                                     "n_layers": 1, "d_ff": 64, "dropout": 0.0, "attention": {"type": "full"}},
                                    generator=gen)
opt = cf.nn.AdamW(model, lr=3e-3)
schedule = cf.nn.InverseSqrtLR(3e-3, warmup=10)

# A dataset of token sequences of varying length; the label is the number of
# distinct tokens below 5 in the sequence (0..4).
seqs, labels = [], []
for i in range(256):
    n = 8 + i % 9
    ids = cf.randint(1, 12, [n], generator=gen).tolist()
    seqs.append(ids)
    labels.append(len({t for t in ids if t < 5}) % 5)
loader = cf.data.DataLoader(cf.data.SequenceDataset(seqs, labels), batch_size=32, shuffle=True, seed=1)

for epoch in range(8):
    total = 0.0
    for b in loader:  # a cf.data.DataLoader: padded batches with key padding masks
        schedule.apply(opt)
        loss = cf.cross_entropy(model(b.input, b.key_padding_mask), b.target)
        opt.zero_grad()
        loss.backward()
        cf.nn.clip_grad_norm(model, 1.0)
        opt.step()
        total += loss.item()
    print("epoch %d  loss %.3f  lr %.2e" % (epoch, total / len(loader), opt.lr))
