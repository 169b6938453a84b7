#!/usr/bin/env python3
"""Train cf-textcls's ClusterFormer text classifier from Python, with a tqdm
progress bar: topic classification of the Debian `fortunes` corpus by an
encoder classifier with neural clustering attention (ClusterFormer, Wang et al.
2022), trained on L_task + mu L1 + nu L2 (appendix C, eq. 17).

The data and model follow cf-textcls's defaults (apps/textcls): topics with at
least 500 texts of 64+ characters, at most 500 each, a 70/10/20 split per topic,
characters as tokens, texts cut at 256; 2 layers, d_model 64, 4 heads, d_ff 128,
dropout 0.1, mean pooling, k = round(sqrt(256)) = 16 clusters; AdamW (lr 3e-3,
weight decay 0.01), 30 warmup steps then cosine decay to 5%, gradient clipping
at 1, batches of 32, 300 steps. As the app, it drops texts the model would see
twice (equal in their first --max-len characters: a repeat kept once, a text under
two topics dropped from both), builds the vocabulary from what the model reads of
the training texts, and pads every evaluation batch to the longest text (neural
clustering sizes its clusters from the padded length: accuracy would otherwise
depend on which texts share a batch). The split is drawn with Python's random
module, so the texts in each part differ from the app's (its shuffle is a C++ one).

    .venv/bin/python python/examples/train_textcls.py            # about 2 minutes on 2 cores
    .venv/bin/python python/examples/train_textcls.py --steps 30 # a quick look
"""
import argparse
import math
import random
import time

from tqdm import tqdm

import cf


def load_topics(min_texts, max_per_class, min_chars, split_seed, max_len):
    by_topic = {}
    for topic, text in cf.data.read_fortunes():
        if len(text) >= min_chars:
            by_topic.setdefault(topic, []).append(text)
    # what the model reads of a text is its first max_len characters: texts equal there are one text
    topics_of = {}
    for topic, texts in by_topic.items():
        for t in texts:
            topics_of.setdefault(t[:max_len], set()).add(topic)
    for topic, texts in by_topic.items():
        seen, kept = set(), []
        for t in texts:
            key = t[:max_len]
            if len(topics_of[key]) == 1 and key not in seen:
                seen.add(key)
                kept.append(t)
        by_topic[topic] = kept
    topics = sorted(t for t, texts in by_topic.items() if len(texts) >= min_texts)
    if len(topics) < 2:
        raise SystemExit("train_textcls: fewer than 2 topics with %d texts in %s (apt-get install fortunes)"
                         % (min_texts, cf.data.FORTUNES_DIR))
    splits = {"train": [], "val": [], "test": []}
    for label, topic in enumerate(topics):
        texts = by_topic[topic]
        random.Random(split_seed * 1000003 + label).shuffle(texts)
        texts = texts[:max_per_class]
        n_test, n_val = max(1, round(0.2 * len(texts))), max(1, round(0.1 * len(texts)))
        splits["test"] += [(t, label) for t in texts[:n_test]]
        splits["val"] += [(t, label) for t in texts[n_test:n_test + n_val]]
        splits["train"] += [(t, label) for t in texts[n_test + n_val:]]
    return topics, splits


def encode(tok, pairs, max_len):
    return [tok.encode(t)[:max_len] for t, _ in pairs], [y for _, y in pairs]


def accuracy(model, loader):
    model.eval()
    right = total = 0
    with cf.no_grad():
        for b in loader:
            pred = cf.argmax(model(b.input, b.key_padding_mask), 1)
            right += int(cf.sum(cf.to(cf.eq(pred, b.target), cf.int64)).item())
            total += b.size
    model.train()
    return right / total


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--warmup", type=int, default=30)
    ap.add_argument("--max-len", type=int, default=256)
    ap.add_argument("--mu", type=float, default=1e-3, help="weight of the clustering loss L1 (eq. 6)")
    ap.add_argument("--nu", type=float, default=1e-3, help="weight of the centroid sorting loss L2 (eq. 11)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()

    topics, splits = load_topics(500, 500, 64, 0, args.max_len)
    tok = cf.data.Tokenizer.build_char([t[:args.max_len] for t, _ in splits["train"]])
    encoded = {name: encode(tok, pairs, args.max_len) for name, pairs in splits.items()}
    longest = max(len(i) for ids, _ in encoded.values() for i in ids)
    loaders = {}
    for name, (ids, labels) in encoded.items():
        train = name == "train"
        loaders[name] = cf.data.DataLoader(cf.data.SequenceDataset(ids, labels),
                                           batch_size=args.batch_size if train else 64,
                                           shuffle=train, seed=args.seed, prefetch=2 if train else 0,
                                           pad_to_multiple=1 if train else longest)
    print("topics: %s; %d / %d / %d texts; vocabulary %d" % (", ".join(topics), len(splits["train"]),
                                                             len(splits["val"]), len(splits["test"]), tok.vocab_size))

    k = max(1, round(math.sqrt(args.max_len)))
    config = {"vocab_size": tok.vocab_size, "max_len": args.max_len, "n_layers": 2, "d_model": 64, "n_heads": 4,
              "d_ff": 128, "dropout": 0.1, "num_classes": len(topics), "pooling": "mean",
              "attention": {"type": "neural-clustering", "clusters": k}}
    gen = cf.Generator(args.seed)
    model = cf.models.EncoderClassifier(config, generator=gen).to(cf.Device(args.device))
    print("ClusterFormer classifier: %d parameters, k = %d" % (model.num_parameters(), k))
    opt = cf.nn.AdamW(model, lr=args.lr, weight_decay=0.01)
    warmup = min(args.warmup, args.steps // 10)  # a short run keeps a tenth for warmup
    schedule = cf.nn.WarmupCosineLR(args.lr, warmup, args.steps, min_lr=0.05 * args.lr)
    weights = cf.models.ClusterFormerLossWeights(mu=args.mu, nu=args.nu)

    start = time.perf_counter()
    bar = tqdm(total=args.steps, unit="step")
    step = 0
    while step < args.steps:
        for b in loaders["train"]:
            if step == args.steps:
                break
            schedule.apply(opt)
            aux = cf.nn.AuxLosses()
            logits = model(b.input.to(cf.Device(args.device)), b.key_padding_mask.to(cf.Device(args.device)), aux=aux)
            task = cf.cross_entropy(logits, b.target.to(cf.Device(args.device)))
            loss = cf.models.clusterformer_loss(task, aux, weights)
            opt.zero_grad()
            loss.backward()
            cf.nn.clip_grad_norm(model, 1.0)
            opt.step()
            step += 1
            bar.set_postfix(loss="%.3f" % task.item(), lr="%.1e" % opt.lr)
            bar.update(1)
            if step % 100 == 0 or step == args.steps:
                bar.write("step %d  validation accuracy %.3f" % (step, accuracy(model, loaders["val"])))
    bar.close()
    print("trained %d steps in %.1f s; test accuracy %.3f" % (args.steps, time.perf_counter() - start,
                                                              accuracy(model, loaders["test"])))


if __name__ == "__main__":
    main()
