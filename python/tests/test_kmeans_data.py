"""cf.kmeans and the cf.data readers, datasets and loader."""
import os
import struct

import pytest

import cf


def planted(n_per, centers, seed):
    g = cf.Generator(seed)
    parts = [cf.randn([n_per, len(c)], generator=g, std=0.05) + cf.tensor(c) for c in centers]
    labels = cf.cat([cf.full([n_per], i, dtype=cf.int64) for i in range(len(centers))])
    return cf.cat(parts), labels


def test_kmeans_recovers_planted_clusters():
    x, labels = planted(50, [[0.0, 0.0], [3.0, 0.0], [0.0, 3.0], [3.0, 3.0]], seed=7)
    seen = []
    res = cf.kmeans(x, 4, seed=1, on_iteration=lambda it, inertia: seen.append((it, inertia)))
    centroids, assignments, inertia = res
    assert centroids.shape == (4, 2) and assignments.shape == (200,) and assignments.dtype == cf.int64
    assert cf.adjusted_rand_index(assignments, labels) == 1.0
    assert inertia == res.inertia and res.converged and seen and seen[0][0] == 1
    assert all(b <= a + 1e-9 for a, b in zip(res.inertia_history, res.inertia_history[1:]))
    # same seed, same result; elkan gives the same clustering
    again = cf.kmeans(x, 4, seed=1, algorithm="elkan")
    assert again.assignments.tolist() == assignments.tolist()
    assert cf.kmeans_assign(x, centroids).tolist() == assignments.tolist()
    assert cf.kmeans_init(x, 4, seed=1).shape == (4, 2)
    with pytest.raises(cf.ValueError, match="metric"):
        cf.kmeans(x, 4, metric="l1")


def test_npy_round_trip(tmp_path):
    t = cf.arange(6, dtype=cf.float64).reshape([2, 3])
    path = str(tmp_path / "t.npy")
    cf.data.save_npy(path, t)
    assert cf.data.read_npy(path).tolist() == t.tolist()
    np = pytest.importorskip("numpy")
    assert np.load(path).tolist() == t.tolist()


def test_tokenizer_reads_lone_surrogates_as_replacement_characters():
    # "a\udcff" is what surrogateescape makes of the byte 0xFF (file names, argv): it was refused
    # with nanobind's "incompatible function arguments"; it is invalid UTF-8, so U+FFFD.
    tok = cf.data.Tokenizer.build_char(["ab\ud800", "a\udcffb"])
    assert "\ufffd" in tok.tokens
    assert tok.encode("a\ud800b") == tok.encode("a\ufffdb")
    assert tok.split("x\udcff") == ["x", "\ufffd"]
    assert tok.id("\ud800") == tok.id("\ufffd")
    with pytest.raises(TypeError, match=r"^\[Tokenizer\] text must be str, got int"):
        tok.encode(3)
    with pytest.raises(TypeError, match="every corpus entry must be str, got bytes"):
        cf.data.Tokenizer.build_char(["ok", b"raw"])


def test_tokenizer_dataset_loader(tmp_path):
    texts = ["hello world", "hi", "hello there world"]
    tok = cf.data.Tokenizer.build_word(texts)
    ids = [tok.encode(s) for s in texts]
    assert tok.decode(ids[0]) == "hello world" and tok.vocab_size == 6 + 4
    path = str(tmp_path / "tok.json")
    tok.save(path)
    assert cf.data.Tokenizer.load(path).tokens == tok.tokens
    ds = cf.data.SequenceDataset(ids, [0, 1, 0])
    assert len(ds) == 3
    loader = cf.data.DataLoader(ds, batch_size=2, shuffle=True, seed=3)
    batches = list(loader)
    assert len(batches) == len(loader) == 2
    b = batches[0]
    assert b.input.dtype == cf.int64 and b.key_padding_mask.dtype == cf.bool and b.size == 2
    assert b.input.shape == b.key_padding_mask.shape and b.target.shape == (2,)
    assert sorted(i for bb in batches for i in bb.indices) == [0, 1, 2]
    assert [bb.indices for bb in cf.data.DataLoader(ds, batch_size=2, shuffle=True, seed=3)] == [bb.indices for bb in batches]
    td = cf.data.TensorDataset(cf.randn([5, 2]), cf.arange(5))
    x, y = td[4]
    assert x.shape == (2,) and y.item() == 4
    assert td[-1][1].item() == 4  # negative indices count from the end
    with pytest.raises(cf.IndexError, match=r"\[Dataset\] index -6 out of range for 5"):
        td[-6]
    assert cf.data.SequenceDataset([[1, 2]])[0][1] is None  # no targets: None, as Batch.target
    with pytest.raises(cf.DTypeError, match=r"^\[Tokenizer\] the corpus is a list of texts, got one str"):
        cf.data.Tokenizer.build_word("hello world")  # was a vocabulary of its letters
    assert cf.data.Tokenizer.build_char("hello").tokens == cf.data.Tokenizer.build_char(["hello"]).tokens


def test_loader_passes_nested_over_one_loader_stop_with_an_error():
    # The loader was its own iterator: a loop nested over it ran forever (each inner loop's end began the
    # next epoch under the outer one). Each iter() is now a pass over the rest of the current epoch, and a
    # newer pass ends the older one with an error.
    dl = cf.data.DataLoader(cf.data.TensorDataset(cf.randn([10, 2]), cf.arange(10)), batch_size=5)
    assert [b.indices for b in dl] == [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]] and dl.state == (1, 0)
    with pytest.raises(cf.ValueError, match=r"^\[DataLoader\] this loop's pass was ended by a newer iter\(\)"):
        for _ in dl:
            for _ in dl:
                pass
    assert dl.state == (2, 0)
    it = iter(dl)  # a pass resumes where the loader stands, as next(dl) does
    assert next(it).indices == [0, 1, 2, 3, 4] and next(dl).indices == [5, 6, 7, 8, 9]
    with pytest.raises(StopIteration):
        next(it)
    with pytest.raises(StopIteration):  # an ended pass stays ended (the next epoch is a new pass)
        next(it)
    assert dl.state == (3, 0)


def test_fortune_files_with_bytes_that_are_not_utf8(tmp_path):
    # bad bytes read as U+FFFD, as the char tokenizer reads them (before: a bare UnicodeDecodeError)
    f = tmp_path / "f"
    f.write_bytes(b"hello\n%\n\xff\xfe bad\n")
    assert cf.data.read_fortune_file(str(f)) == ["hello", "\ufffd\ufffd bad"]
    # one U+FFFD per bad byte, as the char tokenizer reads them (Python's own "replace" made one of a
    # truncated sequence, so Python saw other characters than the C++ apps train on)
    f.write_bytes(b"a\xe2\x82x\n%\nb\xf0\x9f\x98c\n")
    got = cf.data.read_fortune_file(str(f))
    assert got == ["a\ufffd\ufffdx", "b\ufffd\ufffd\ufffdc"]


@pytest.mark.skipif(not os.path.isdir(cf.data.FORTUNES_DIR), reason="Debian package fortunes not installed")
def test_read_fortunes():
    f = cf.data.read_fortunes()
    assert len(f) > 1000 and all(isinstance(c, str) and isinstance(t, str) for c, t in f[:10])


@pytest.mark.skipif(not cf.data.fashion_mnist_available(), reason="Debian package dataset-fashion-mnist not installed")
def test_read_idx_labels():
    labels = cf.data.read_idx(os.path.join(cf.data.FASHION_MNIST_DIR, "t10k-labels-idx1-ubyte.gz"), cf.int64)
    assert labels.shape == (10000,) and 0 <= cf.amin(labels).item() and cf.amax(labels).item() == 9
    assert cf.data.fashion_mnist_class_name(0) == "T-shirt/top"


def test_batches_unpack_as_input_and_target():
    x, y = cf.randn([6, 2]), cf.arange(6)
    seen = []
    for xb, yb in cf.data.DataLoader(cf.data.TensorDataset(x, y), batch_size=4):
        seen.append((xb.shape, yb.tolist()))
    assert seen == [((4, 2), [0, 1, 2, 3]), ((2, 2), [4, 5])]


def test_loader_batches_a_python_dataset_and_a_model_learns_from_it():
    # a PyTorch-style map dataset (any object with __len__ and __getitem__), items (input, target)
    import numpy as np

    class Points:
        def __init__(self, n):
            self.x = np.random.RandomState(0).randn(n, 3).astype(np.float32)
            self.y = (self.x.sum(1) > 0).astype(np.int64)

        def __len__(self):
            return len(self.x)

        def __getitem__(self, i):
            return self.x[i], int(self.y[i])

    data = Points(64)
    loader = cf.data.DataLoader(data, batch_size=16, shuffle=True, seed=3)
    x, y = next(iter(loader))
    assert x.shape == (16, 3) and x.dtype == cf.float32 and y.shape == (16,) and y.dtype == cf.int64
    assert sorted(i for b in cf.data.DataLoader(data, batch_size=16, shuffle=True, seed=3) for i in b.indices) == \
        list(range(64))
    first = next(iter(cf.data.DataLoader(data, batch_size=16, shuffle=True, seed=3)))
    assert first.input.tolist() == [data.x[i].tolist() for i in first.indices]  # the rows the shuffle named
    model = cf.nn.Linear(3, 2)
    opt = cf.nn.SGD(model.parameters(), lr=0.5)
    losses = []
    for _ in range(8):
        for x, y in loader:
            loss = cf.nn.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
    assert sum(losses[-4:]) < 0.5 * sum(losses[:4])
    # a list of (tokens, label) pairs: sequences padded with a key padding mask, as a cf SequenceDataset's
    b = next(iter(cf.data.DataLoader([([1, 2, 3], 0), ([4, 5], 1), ([6], 0)], batch_size=3)))
    assert b.input.tolist() == [[1, 2, 3], [4, 5, 0], [6, 0, 0]] and b.target.tolist() == [0, 1, 0]
    assert b.key_padding_mask.tolist() == [[False, False, False], [False, False, True], [False, True, True]]
    assert next(iter(cf.data.DataLoader([(cf.ones(2),), (cf.zeros(2),)], batch_size=2))).target is None
    # an int label beside a float one: float labels, as torch's default_collate
    _, y = next(iter(cf.data.DataLoader([(cf.ones(2), 1), (cf.zeros(2), 2.5)], batch_size=2)))
    assert y.dtype == cf.float32 and y.tolist() == [1.0, 2.5]

    class Failing:
        def __len__(self):
            return 2

        def __getitem__(self, i):
            if i == 1:
                raise KeyError("no such row")
            return cf.ones(2), 0

    with pytest.raises(KeyError, match="no such row"):  # the dataset's own exception comes through
        list(cf.data.DataLoader(Failing(), batch_size=2))
    with pytest.raises(cf.ValueError, match=r"^\[DataLoader\] prefetch 2 needs a cf.data dataset"):
        cf.data.DataLoader(Failing(), prefetch=2)
    with pytest.raises(TypeError, match=r"^\[DataLoader\] dataset must be a cf.data.Dataset or an object with "
                                        r"__len__ and __getitem__ .*got int"):
        cf.data.DataLoader(3)
    with pytest.raises(cf.ValueError, match=r"^\[DataLoader\] the dataset's item 0 is a tuple of 3 values"):
        list(cf.data.DataLoader([(1, 2, 3)]))
    with pytest.raises(cf.ValueError, match=r"^\[DataLoader\] the dataset's item 0: its input \(dict\) is no tensor"):
        list(cf.data.DataLoader([({"a": 1}, 2)]))


def test_a_python_dataset_and_its_loader_in_a_cycle_are_collected():
    # (from a review) the loader's hold on its Python dataset was invisible to the garbage collector
    import gc
    import weakref

    class Rows:
        def __len__(self):
            return 4

        def __getitem__(self, i):
            return cf.ones(2) * i, i

    ds = Rows()
    ds.loader = cf.data.DataLoader(ds, batch_size=2)
    assert next(iter(ds.loader)).input.tolist() == [[0.0, 0.0], [1.0, 1.0]]
    ref = weakref.ref(ds)
    del ds
    gc.collect()
    assert ref() is None
    # the same cycle through a pass (iter(loader)) the dataset holds: the pass hid its loader from the collector
    ds = Rows()
    ds.loader = cf.data.DataLoader(ds, batch_size=2)
    ds.pass_ = iter(ds.loader)
    assert next(ds.pass_).input.tolist() == [[0.0, 0.0], [1.0, 1.0]]
    ref = weakref.ref(ds)
    del ds
    gc.collect()
    assert ref() is None


def test_a_subclass_of_cf_data_dataset_is_a_python_dataset():
    # torch.utils.data.Dataset's habit: subclass the base, define __len__ and __getitem__
    class Squares(cf.data.Dataset):
        def __len__(self):
            return 3

        def __getitem__(self, i):
            return cf.tensor([float(i * i)]), i

    b = next(iter(cf.data.DataLoader(Squares(), batch_size=3)))
    assert b.input.tolist() == [[0.0], [1.0], [4.0]] and b.target.tolist() == [0, 1, 2]

    class CallsBase(Squares):
        def __init__(self):
            super().__init__()
            self.scale = 2

        def __getitem__(self, i):
            return cf.tensor([float(i * self.scale)]), i

    assert next(iter(cf.data.DataLoader(CallsBase(), batch_size=3))).input.tolist() == [[0.0], [2.0], [4.0]]
    assert len(cf.data.TensorDataset(cf.zeros(4, 2))) == 4  # cf's own datasets as before


def test_an_empty_text_batches_as_a_row_of_padding():
    # [] from a dataset is an empty int64 sequence (as a tensor it would be float32, as torch.tensor([]) is:
    # it was stacked against the others' lengths, and the error named two valid examples)
    tok = cf.data.Tokenizer.build_char(["hello world", "héllo"])
    data = [(tok.encode("hello"), 0), (tok.encode("hé"), 1), (tok.encode(""), 0)]
    b = next(iter(cf.data.DataLoader(data, batch_size=3)))
    assert tuple(b.input.shape) == (3, 5)
    assert b.key_padding_mask.tolist()[2] == [True] * 5
    assert b.key_padding_mask.tolist()[1] == [False, False, True, True, True]
    # a batch holding only the empty text is an int64 row of padding too (not a float32 (1, 0) without a mask)
    last = list(cf.data.DataLoader(data, batch_size=1))[2]
    assert last.input.dtype == cf.int64 and tuple(last.input.shape) == (1, 0)
    assert last.key_padding_mask is not None
    with pytest.raises(cf.ShapeError, match=r"^\[collate\] example 2 has input float32 \(2,2\).*example 0 has a token sequence"):
        next(iter(cf.data.DataLoader([(tok.encode("hello"), 0), (tok.encode("hé"), 1),
                                      (cf.zeros([2, 2]), 0)], batch_size=3)))


def test_every_path_argument_takes_a_pathlib_path(tmp_path):
    # str or any os.PathLike, as open() takes (pathlib.Path was refused by every path argument before)
    t = cf.randn([2, 3])
    cf.data.save_npy(tmp_path / "a.npy", t)
    assert cf.data.read_npy(tmp_path / "a.npy").tolist() == t.tolist()
    (tmp_path / "a.raw").write_bytes(struct.pack("<6f", *range(6)))
    assert cf.data.read_raw_float32(tmp_path / "a.raw", [2, 3]).tolist() == [[0, 1, 2], [3, 4, 5]]
    # an IDX file of 3 uint8 labels: magic 0 0 8 1, then the count
    (tmp_path / "l.idx").write_bytes(bytes([0, 0, 8, 1, 0, 0, 0, 3, 7, 8, 9]))
    assert cf.data.read_idx(tmp_path / "l.idx", cf.int64).tolist() == [7, 8, 9]
    assert cf.data.fashion_mnist_available(tmp_path) is False
    (tmp_path / "f").write_text("one\n%\ntwo\n")
    assert cf.data.read_fortune_file(tmp_path / "f") == ["one", "two"]
    (tmp_path / "dir").mkdir()
    (tmp_path / "dir" / "cat").write_text("x\n%\ny\n")
    assert cf.data.read_fortunes(tmp_path / "dir") == [("cat", "x"), ("cat", "y")]
    tok = cf.data.Tokenizer.build_char(["abc"])
    tok.save(tmp_path / "tok.json")
    assert cf.data.Tokenizer.load(tmp_path / "tok.json").tokens == tok.tokens
    cf.save_safetensors(tmp_path / "a.safetensors", {"t": t})
    assert cf.load_safetensors(tmp_path / "a.safetensors")[0]["t"].tolist() == t.tolist()
    m = cf.nn.Linear(2, 2)
    cf.nn.save_checkpoint(tmp_path / "c.safetensors", model=m, step=4)
    assert cf.nn.load_checkpoint(tmp_path / "c.safetensors").step == 4
    (tmp_path / "c.json").write_text('{"k": 3}')
    assert cf.nn.load_json_file(tmp_path / "c.json") == {"k": 3}
    assert cf.nn.Config.from_file(tmp_path / "c.json").get("k", 0) == 3
    # anything else is named in the TypeError
    with pytest.raises(TypeError, match=r"read_npy\(path: str \| os.PathLike\)"):
        cf.data.read_npy(3)


def test_a_loader_without_a_seed_shuffles_by_the_default_generator():
    # a fixed seed 0 gave every cf.manual_seed of an experiment the same batch order (PyTorch's follows its seed)
    def order(seed):
        cf.manual_seed(seed)
        return [b.indices for b in cf.data.DataLoader(list(range(16)), batch_size=4, shuffle=True)]

    assert order(0) == order(0) and order(0) != order(1)
    given = [b.indices for b in cf.data.DataLoader(list(range(16)), batch_size=4, shuffle=True, seed=5)]
    cf.manual_seed(3)
    assert [b.indices for b in cf.data.DataLoader(list(range(16)), batch_size=4, shuffle=True, seed=5)] == given
