"""cf.Tensor from Python: construction, metadata, values, indexing as views, operators."""
import pytest

import cf


def test_randn_prints():
    t = cf.randn([2, 3])
    assert t.shape == (2, 3) and t.dtype == cf.float32 and str(t.device) == "cpu"
    assert repr(t).startswith("tensor(")


def test_tensor_from_nested_lists_infers_dtype():
    assert cf.tensor([[1, 2], [3, 4]]).dtype == cf.int64
    assert cf.tensor([1.0, 2]).dtype == cf.float32
    assert cf.tensor([True, False]).dtype == cf.bool
    t = cf.tensor([[1, 2, 3], [4, 5, 6]], dtype=cf.float64)
    assert t.dtype == cf.float64 and t.shape == (2, 3) and t.strides == (3, 1)
    assert t.tolist() == [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]
    assert cf.tensor(2.5).shape == () and cf.tensor(2.5).item() == 2.5
    with pytest.raises(cf.ValueError, match=r"^\[tensor\] ragged"):
        cf.tensor([[1, 2], [3]])


def test_tensor_from_buffers_of_every_integer_width():
    # The buffer protocol (array.array, memoryview, NumPy): integers of 8 to 64 bits, signed or not, become
    # int64 by the buffer's itemsize. A native '@i' was read as 8-byte elements (wrong values, and a read
    # past the buffer's end), and uint64 values beyond int64 wrapped to negatives.
    import array
    mv = memoryview(array.array("i", [1, -2, 3, 4]).tobytes()).cast("@i")
    assert cf.tensor(mv).tolist() == [1, -2, 3, 4]
    assert cf.tensor(array.array("B", [1, 250])).tolist() == [1, 250]
    assert cf.tensor(array.array("h", [-3, 300])).tolist() == [-3, 300]
    assert cf.tensor(array.array("Q", [2**63 - 1])).tolist() == [2**63 - 1]
    with pytest.raises(cf.DTypeError, match=r"^\[tensor\] uint64 value 9223372036854775813 at element 1 is beyond int64"):
        cf.tensor(array.array("Q", [0, 2**63 + 5]))
    with pytest.raises(cf.DTypeError, match=r"^\[tensor\] bytes are not numbers"):
        cf.tensor(b"abc")
    np = pytest.importorskip("numpy")
    assert cf.tensor(np.array([[1, 2], [3, 4]], dtype=np.uint32)[:, ::-1]).tolist() == [[2, 1], [4, 3]]
    with pytest.raises(cf.DTypeError, match=r"^\[tensor\] buffer format 'T\{"):
        cf.tensor(np.array([(1, 2)], dtype="i4,i4"))


def test_tensor_from_big_endian_buffers():
    # Big-endian arrays (NumPy's '>f4') are swapped as read, as torch.tensor does (they were
    # refused), strided ones too; a one-byte element has no order to swap.
    np = pytest.importorskip("numpy")
    for dt in (">f2", ">f4", ">f8", ">i2", ">i4", ">i8", ">u2", ">u4", ">u8", ">u1", ">?"):
        a = (np.arange(12).reshape(3, 4) % 5 * 3 - 4 * (dt[1] not in "u?")).astype(dt)
        t = cf.tensor(a[:, ::-2])
        assert t.tolist() == a[:, ::-2].tolist(), dt
    assert cf.tensor(np.array([-1.5e-7, 3e38], dtype=">f4")).tolist() == np.array([-1.5e-7, 3e38], dtype="<f4").tolist()
    with pytest.raises(cf.DTypeError, match=r"^\[tensor\] uint64 value 9223372036854775813 at element 0"):
        cf.tensor(np.array([2**63 + 5], dtype=">u8"))


def test_factories():
    assert cf.zeros([2, 2]).tolist() == [[0, 0], [0, 0]]
    assert cf.ones(3, dtype=cf.int64).tolist() == [1, 1, 1]
    assert cf.full([2], 7.0, dtype=cf.float64).tolist() == [7.0, 7.0]
    assert cf.arange(4).tolist() == [0, 1, 2, 3]
    assert cf.scalar(3.0).item() == 3.0
    g1, g2 = cf.Generator(5), cf.Generator(5)
    assert cf.rand([4], generator=g1).tolist() == cf.rand([4], generator=g2).tolist()
    r = cf.randint(0, 3, [100], generator=g1)
    assert r.dtype == cf.int64 and 0 <= cf.amin(r).item() and cf.amax(r).item() < 3
    assert cf.bernoulli([10], 1.0).tolist() == [True] * 10
    z = cf.zeros([2], requires_grad=True)
    assert z.requires_grad and z.is_leaf


def test_metadata_and_values():
    t = cf.arange(6).reshape([2, 3])
    assert t.ndim == 2 and t.dim() == 2 and t.numel() == 6 and len(t) == 2
    assert t.size() == (2, 3) and t.size(1) == 3 and t.nbytes == 48
    assert t.is_contiguous() and not t.T.is_contiguous()
    assert int(cf.tensor(4)) == 4 and float(cf.tensor(0.5)) == 0.5
    assert bool(cf.tensor(True))
    with pytest.raises(cf.ValueError, match="ambiguous"):
        bool(cf.ones([2]))
    assert hash(t) == hash(t) and t in {t}


def test_indexing_gives_views_that_share_storage():
    t = cf.arange(12, dtype=cf.float32).reshape([3, 4])
    row = t[1]
    assert row.tolist() == [4, 5, 6, 7] and row.shares_storage(t)
    col = t[:, 2]
    assert col.tolist() == [2, 6, 10] and col.strides == (4,)
    assert t[0, -1].item() == 3
    assert t[::2, 1:3].tolist() == [[1, 2], [9, 10]]
    assert t[None].shape == (1, 3, 4) and t[..., None].shape == (3, 4, 1)
    assert t[..., 0].tolist() == [0, 4, 8]
    # writing through a view is seen by the base tensor, and the reverse
    row[...] = 0.0
    assert t[1].tolist() == [0, 0, 0, 0]
    t[2, 1:3] = cf.tensor([20.0, 30.0])
    assert col.tolist() == [2, 0, 30]
    t[0] = 1.5
    assert t[0].tolist() == [1.5] * 4


def test_index_tensors_select_copies():
    t = cf.arange(10).reshape([5, 2])
    sel = t[cf.tensor([4, 0])]
    assert sel.tolist() == [[8, 9], [0, 1]] and not sel.shares_storage(t)
    assert t[[1, 1], 0].tolist() == [2, 2]
    with pytest.raises(cf.IndexError, match=r"^\[setitem\] index 7 \(at flat position 0 of the index of shape \(1\)\) is out of range for axis 0 of size 5"):
        t[cf.tensor([7])] = 1
    with pytest.raises(cf.IndexError, match=r"^\[getitem\] index 5 is out of range for axis 0 of size 5"):
        t[5]
    with pytest.raises(cf.IndexError, match="too many indices"):
        t[0, 0, 0]
    with pytest.raises(IndexError, match=r"^\[getitem\] index -6 is out of range for axis 0 of size 5"):  # a built-in
        t[-6]  # IndexError too: iteration stops there
    assert [r.tolist() for r in t][:2] == [[0, 1], [2, 3]]
    # lists and NumPy arrays of positions; negative ones count from the end, as in NumPy
    import numpy as np
    assert t[[0, -1]].tolist() == [[0, 1], [8, 9]] and t[:, [-1]].tolist() == [[1], [3], [5], [7], [9]]
    assert t[np.array([4, 0])].tolist() == [[8, 9], [0, 1]] and t[[[0], [2]]].shape == (2, 1, 2)
    # ... and in an index tensor too (before, -1 was an out-of-range error there but the last row in a list)
    assert t[cf.tensor([0, -1, -5])].tolist() == [[0, 1], [8, 9], [0, 1]]
    assert t[:, cf.tensor([[-1], [0]])].tolist() == [[[1], [0]], [[3], [2]], [[5], [4]], [[7], [6]], [[9], [8]]]
    with pytest.raises(cf.IndexError, match=r"-6"):  # beyond -n: the range error names the value given
        t[cf.tensor([0, -6])]
    # a list of bools is a mask elsewhere: refused (before, read as positions 1, 0, 1: wrong rows, no error)
    with pytest.raises(cf.IndexError, match=r"\[getitem\] a list of bools is a mask"):
        t[[True, False, True, False, False]]
    with pytest.raises(cf.IndexError, match=r"\[getitem\] a list of bools is a mask"):
        t[np.array([True, False, True, False, False])]
    with pytest.raises(cf.IndexError, match=r"\[getitem\] a list index must be rectangular"):
        t[[[0], 1]]
    with pytest.raises(cf.IndexError, match=r"\[getitem\] a list index holds ints"):
        t[[0, "a"]]
    with pytest.raises(cf.IndexError, match=r"^\[setitem\] index tensors must be int64"):  # named setitem, not getitem
        t[cf.tensor([True, False, True, False, False]), 0] = 0
    t[cf.tensor([True, False, True, False, False])] = 0  # a bool tensor as the whole key: a mask of the rows
    assert t[:3].tolist() == [[0, 0], [2, 3], [0, 0]]


def test_operators_and_numbers():
    a = cf.tensor([1.0, 2.0, 3.0])
    b = cf.tensor([4.0, 5.0, 6.0])
    assert (a + b).tolist() == [5, 7, 9]
    assert (a - 1).tolist() == [0, 1, 2] and (1 - a).tolist() == [0, -1, -2]
    assert (2 * a).tolist() == [2, 4, 6] and (a / 2).tolist() == [0.5, 1, 1.5]
    assert (1 / cf.tensor([2.0])).tolist() == [0.5]
    assert (a ** 2).tolist() == [1, 4, 9] and (2 ** a).tolist() == [2, 4, 8]
    assert (-a).tolist() == [-1, -2, -3] and abs(-a).tolist() == [1, 2, 3]
    assert (a < 2).tolist() == [True, False, False] and (a == b).tolist() == [False] * 3
    assert ((a > 1) & (a < 3)).tolist() == [False, True, False] and (~(a > 1)).tolist() == [True, False, False]
    m = cf.tensor([[1.0, 2.0], [3.0, 4.0]])
    assert (m @ m).tolist() == [[7, 10], [15, 22]]
    # the int64 rule: a number takes the tensor's dtype
    assert (cf.arange(3) * 2).dtype == cf.int64
    with pytest.raises(cf.DTypeError, match=r"^\[add\]"):
        a + cf.arange(3)
    # & | ^ take bools and numbers either side, as PyTorch's (bool_t | True was a nanobind TypeError)
    t = cf.tensor([True, False, True])
    assert (t | True).tolist() == [True] * 3 and (True & t).tolist() == [True, False, True]
    assert (t ^ t).tolist() == [False] * 3 and (t ^ True).tolist() == [False, True, False]
    assert (False | t).tolist() == [True, False, True] and (1 ^ t).tolist() == [False, True, False]
    with pytest.raises(cf.DTypeError, match=r"^\[logical_or\] argument 'a' must be bool, got int64"):
        cf.arange(3) | True
    with pytest.raises(cf.DTypeError, match=r"^\[logical_xor\] argument 'a' must be bool, got int64"):
        cf.arange(3) ^ cf.arange(3)
    np = pytest.importorskip("numpy")
    r = t | np.True_  # NumPy's bool scalars too, either side: a cf tensor, not NumPy's array of t
    assert isinstance(r, cf.Tensor) and r.tolist() == [True] * 3
    assert (np.False_ ^ t).tolist() == [True, False, True]
    with pytest.raises(cf.IndexError, match=r"^\[getitem\] slice steps must be positive, got 0"):
        a[::0]  # was Python's own ValueError, without the op

    class Bad:
        def __index__(self):
            raise ValueError("mine")
    with pytest.raises(ValueError, match="^mine$"):  # another ValueError passes through
        a[Bad():]


def test_to_takes_dtype_and_device_names_and_devices_pickle():
    import copy
    import pickle
    t = cf.arange(3)
    assert t.to("float64").dtype == cf.float64 and t.to("cpu").device == "cpu" and t.to(cf.float32).dtype == cf.float32
    assert t.to(dtype="float64").dtype == cf.float64 and cf.to(t, "float64").dtype == cf.float64
    with pytest.raises(cf.ValueError, match=r"^\[to\] 'float128' names no dtype \(float32"):
        t.to("float128")  # was a bare TypeError, with a nanobind warning printed
    d = cf.Device("cpu")
    assert pickle.loads(pickle.dumps(d)) == d and copy.deepcopy(d) == d
    # a seed no uint64 holds and a bool for axes are named (nanobind's signature dump; mean(True) took axis 1)
    with pytest.raises(cf.ValueError, match=r"^\[Generator\] seed must be an int in \[0, 2\^64\), got -1"):
        cf.Generator(-1)
    with pytest.raises(cf.ValueError, match=r"^\[Generator.manual_seed\] seed must be an int in \[0, 2\^64\)"):
        cf.Generator(0).manual_seed(2**64)
    with pytest.raises(cf.ValueError, match=r"^\[manual_seed\] seed must be an int in \[0, 2\^64\), got -1"):
        cf.manual_seed(-1)
    with pytest.raises(TypeError, match=r"'str' object cannot be interpreted as an integer"):
        cf.manual_seed("1")
    g = cf.Generator(3)
    with pytest.raises(cf.ValueError, match=r"^\[Generator.set_state\] seed must be an int in \[0, 2\^64\), got -1"):
        g.set_state(-1, 0)
    with pytest.raises(cf.ValueError, match=r"^\[Generator.set_state\] offset must be an int in \[0, 2\^64\), got 18446744073709551616$"):
        g.set_state(5, 2**64)
    g.set_state(2**64 - 1, 7)
    assert (g.seed, g.offset) == (2**64 - 1, 7)
    with pytest.raises(cf.ValueError, match=r"^\[mean\] axes must be None, an int or a sequence of ints, got a bool"):
        cf.ones([2, 2]).mean(True)


def test_inplace_operators_bump_the_version():
    t = cf.zeros([3])
    v0 = t.version
    t += 1
    t *= 3
    t -= cf.ones([3])
    t /= 2
    assert t.tolist() == [1, 1, 1] and t.version > v0
    t.fill_(2.0).mul_(0.5)
    assert t.tolist() == [1, 1, 1]


def test_inplace_operators_with_another_float_dtype_and_setitem_with_leading_ones():
    # f32 += f64 and -= computed in float64 and stored in float32, as *= and /= (and PyTorch); they were refused
    a, d = cf.tensor([1.0, 2.0]), cf.tensor([0.1, 0.2], dtype=cf.float64)
    a += d
    assert a.dtype == cf.float32 and a.tolist() == cf.tensor([1.1, 2.2]).tolist()
    a -= d
    assert a.tolist() == cf.tensor([1.0, 2.0]).tolist()
    w = cf.ones(2, requires_grad=True)
    with pytest.raises(cf.AutogradError, match=r"^\[add_\]"):
        a += w.to(cf.float64)  # a source that requires grad would lose its gradient
    with pytest.raises(cf.ShapeError, match=r"^\[add_\] cannot broadcast \(3,2\) into \(2\)"):
        a += cf.ones(3, 2, dtype=cf.float64)
    # an integer or bool tensor operand beside a float one (or the reverse) is refused under the operator's own
    # name, as add_ / sub_ were (*= and **= said [mul] / [pow], the product's name)
    i, b = cf.tensor([2, 3]), cf.tensor([True, False])
    for statement, name in (("a += i", "add_"), ("a -= i", "sub_"), ("a *= i", "mul_"), ("a **= i", "pow_"),
                            ("i *= b", "mul_"), ("i **= a", "pow_")):
        with pytest.raises(cf.DTypeError, match=r"^\[" + name + r"\] .*tensor operands take one dtype"):
            exec(statement, {"a": a, "i": i, "b": b})
    assert a.tolist() == cf.tensor([1.0, 2.0]).tolist() and i.tolist() == [2, 3]  # nothing written
    for statement, name in (("b *= b", "mul_"), ("b //= b", "floor_divide_"), ("i //= b", "floor_divide_"),
                            ("i %= b", "remainder_")):  # (they said [mul], [floor_divide], [remainder])
        with pytest.raises(cf.DTypeError, match=r"^\[" + name + r"\] is not defined for bool tensors"):
            exec(statement, {"i": i, "b": b})
    # a value with leading size-1 dims beyond the selection's loses them (NumPy, PyTorch)
    x = cf.zeros(2, 3)
    x[0] = cf.ones(1, 3)
    x[1] = [[[2.0, 3.0, 4.0]]]
    assert x.tolist() == [[1, 1, 1], [2, 3, 4]]
    with pytest.raises(cf.ShapeError, match=r"^\[copy_\]"):
        x[0] = cf.ones(2, 3)


def test_torch_keywords_take_none():
    # dim=None and clamp's min=None as in PyTorch (the documented signatures; they were TypeErrors)
    x = cf.tensor([[1.0, -2.0], [3.0, 4.0]])
    assert x.sum(dim=None).item() == 6.0 and cf.sum(x, dim=None, keepdim=True).shape == (1, 1)
    assert x.mean(axis=None).item() == 1.5 and x.amax(dim=None, keepdim=True).shape == (1, 1)
    assert x.var(dim=None).item() == pytest.approx(7.0)  # (1, -2, 3, 4): unbiased
    assert x.clamp(min=None, max=0.5).tolist() == [[0.5, -2.0], [0.5, 0.5]]
    assert cf.clamp(x, min=0.0, max=None).tolist() == [[1.0, 0.0], [3.0, 4.0]]


def test_inplace_division_power_and_overlapping_views():
    # a /= b is a = a / b in a's dtype (before, a *= 1 / b: an int64 tensor became zeros)
    f = cf.tensor([3.0], dtype=cf.float64)
    f /= 10
    assert f.tolist() == [0.3]  # as 3.0 / 10, not 3.0 * (1 / 10)
    # an integer tensor cannot hold / 's exact quotient (PyTorch refuses it too); //= rounds down
    t = cf.tensor([10, 7, -7, 3])
    with pytest.raises(cf.DTypeError, match=r"^\[div_\] t /= u on int64 \(4\) on cpu: / divides exactly"):
        t /= 2
    t //= 2
    assert t.tolist() == [5, 3, -4, 1]
    with pytest.raises(cf.ValueError, match=r"^\[floor_divide\] integer division by zero"):
        t //= 0
    base = cf.arange(4, dtype=cf.float32)
    view = base[1:3]
    view **= 2  # in place through the view (before, no __ipow__: view was rebound, base unchanged)
    assert base.tolist() == [0, 1, 4, 3]
    # views of memory they also write read it as it was (NumPy's results)
    a = cf.arange(5, dtype=cf.float32)
    tail = a[1:]
    tail += a[:4]
    assert a.tolist() == [0, 1, 3, 5, 7]
    m = cf.arange(4, dtype=cf.float32).reshape([2, 2])
    m += m.T
    assert m.tolist() == [[0, 3], [3, 6]]
    s = cf.arange(5, dtype=cf.float32)
    s[1:] = s[:4]
    assert s.tolist() == [0, 0, 1, 2, 3]
    with pytest.raises(cf.ValueError, match=r"\[add_\].*share memory"):
        cf.zeros([3])[:1].expand([3]).add_(cf.ones([3]))


def test_numpy_scalars_in_cf_tensor_keep_their_kind():
    import numpy as np
    # before: np.bool_ made int64, np.float32 was refused ("cannot make a tensor from numpy.float32")
    assert cf.tensor([np.bool_(True), np.bool_(False)]).dtype == cf.bool
    assert cf.tensor([np.float32(1.5), 2]).tolist() == [1.5, 2.0]
    assert cf.tensor(np.float32(3.5)).item() == 3.5 and cf.tensor([np.int32(3)]).dtype == cf.int64


def test_numbers_against_integer_tensors_and_conversions():
    i = cf.tensor([0, 1, 2])
    # a number that is not one of the tensor's values compares exactly (before: it took int64 first)
    assert (i == 0.5).tolist() == [False] * 3 and (i < 1.5).tolist() == [True, True, False]
    assert (i >= 0.5).tolist() == [False, True, True] and (i != 1.0).tolist() == [True, False, True]
    assert (i < 1e30).tolist() == [True] * 3 and (i == float("nan")).tolist() == [False] * 3
    assert (cf.tensor([True, False]) == 2).tolist() == [False, False]
    assert (cf.tensor([True, False]) == 1).tolist() == [True, False]
    # int(): int64 exactly, floats as Python's int(float)
    assert int(cf.tensor([2 ** 60 + 1])[0]) == 2 ** 60 + 1 and int(cf.tensor(-2.7)) == -2
    with pytest.raises(OverflowError, match="^cannot convert float infinity to integer$"):  # Python's int(float)'s
        int(cf.tensor(float("inf")))
    with pytest.raises(ValueError, match="^cannot convert float NaN to integer$"):
        int(cf.tensor(float("nan")))
    # NumPy operands on either side give tensors, as with PyTorch's (before: an ndarray with the NumPy
    # value on the left, a TypeError with an array on the right)
    import numpy as np
    t = cf.tensor([1.0, 2.0, 3.0])
    assert isinstance(np.float64(1.5) + t, cf.Tensor) and (np.float32(2) * t).tolist() == [2, 4, 6]
    assert (np.ones(3) + t).tolist() == (t + np.ones(3)).tolist() == [2, 3, 4]
    assert (np.full(3, 6.0, np.float32) / t).tolist() == [6, 3, 2] and (t - np.ones(3, np.float32)).tolist() == [0, 1, 2]
    assert (np.array([1.0, 0, 3]) == t).tolist() == [True, False, True] and (np.float32(2) < t).tolist() == [False, False, True]
    assert (t == None) is False and (t != "x") is True  # not ours: Python's own answer
    # / divides exactly, as Python's, NumPy's and PyTorch's: integers become float32 (a silent 0 in an accuracy
    # `correct / total` before, with cf's truncating division); so does cf.div, as torch.div (its
    # rounding_mode="trunc" is C++'s cf::div)
    assert (i / np.float32(0.5)).tolist() == [0, 2, 4] and (i / 0.5).dtype == cf.float32
    assert (i / 2).tolist() == [0, 0.5, 1] and (3 / cf.tensor([2])).tolist() == [1.5]
    assert (i / cf.tensor([2.0, 2.0, 2.0], dtype=cf.float64)).dtype == cf.float64
    assert ((cf.tensor([1, 0, 1]) == cf.tensor([1, 1, 1])).sum() / 3).item() == pytest.approx(2 / 3)
    assert i.div(2).tolist() == [0, 0.5, 1] and cf.div(i, cf.tensor([2, 2, 2])).tolist() == [0, 0.5, 1]
    assert cf.div(i, cf.tensor([2, 2, 2]), rounding_mode="trunc").tolist() == [0, 0, 1]
    with pytest.raises(cf.DTypeError, match=r"^\[div_\]"):
        i /= 1.5
    # // and % round down and take the divisor's sign, as Python's ints (cf's division truncates toward zero)
    a, b = cf.tensor([7, -7, 6, -6]), cf.tensor([2, 2, -4, -4])
    assert (a // b).tolist() == [7 // 2, -7 // 2, 6 // -4, -6 // -4] and (a % b).tolist() == [1, 1, -2, -2]
    assert (a // 2).tolist() == [3, -4, 3, -3] and (10 % a).tolist() == [10 % 7, 10 % -7, 10 % 6, 10 % -6]
    with pytest.raises(cf.DTypeError, match=r"^\[floor_divide\] is not defined for bool tensors"):
        cf.tensor([True]) // cf.tensor([True])
    # A float number in arithmetic with an integer tensor computes in float32, as PyTorch's (i * 2.5 was refused
    # and i * 2.0 int64 until stop 75; before stop 57 i * 2.5 was i * 2); an int keeps int64
    for got, want in ((i * 2.5, [0, 2.5, 5]), (2.5 * i, [0, 2.5, 5]), (i + 0.5, [0.5, 1.5, 2.5]),
                      (1.5 - i, [1.5, 0.5, -0.5]), (2.0 ** i, [1, 2, 4]), (i ** 0.5, [0, 1, 2 ** 0.5]),
                      (i * 2.0, [0, 2, 4]), (cf.mul(i, 2.0), [0, 2, 4]), (i.add(0.5), [0.5, 1.5, 2.5])):
        assert got.dtype == cf.float32 and got.tolist() == pytest.approx(want)
    assert (i * 2).dtype == cf.int64 and cf.add(i, 2 ** 60 + 1).tolist() == [2 ** 60 + 1 + v for v in range(3)]
    # ... in place, the result must fit the tensor: refused, as PyTorch refuses it (before stop 57: i.mul_(2.5)
    # doubled, i.add_(j, alpha=0.5) added nothing)
    for f, op in ((lambda: i.mul_(2.5), "mul_"), (lambda: i.add_(i, alpha=0.5), "add_")):
        with pytest.raises(cf.DTypeError, match=r"^\[%s\] int64 \(3\) on cpu with the number" % op):
            f()
    # ... and the in-place operators refuse any float number, as PyTorch's (i = i + 2.0 is float32)
    for f, op, sym in ((lambda: i.__iadd__(0.5), "add_", "+"), (lambda: i.__isub__(2.0), "sub_", "-"),
                       (lambda: i.__imul__(np.float32(2)), "mul_", "*"), (lambda: i.__ifloordiv__(2.0), "floor_divide_", "//"),
                       (lambda: i.__imod__(np.float64(2.0)), "remainder_", "%")):
        with pytest.raises(cf.DTypeError, match=r"^\[%s\] t \%s= <a float number> on int64 \(3\) on cpu: a float number "
                                                 r"makes the result floating" % (op, sym)):
            f()
    assert i.tolist() == [0, 1, 2]


def test_copy_deepcopy_and_integers_beyond_int64():
    import copy
    t = cf.ones([3], requires_grad=True)
    c = copy.deepcopy(t)  # before: "cannot pickle 'Tensor' object"
    assert c.requires_grad and c.data_ptr() != t.data_ptr() and c.tolist() == t.tolist()
    assert copy.copy(cf.arange(3)).tolist() == [0, 1, 2]
    assert copy.deepcopy({"w": t})["w"].tolist() == [1, 1, 1]
    with pytest.raises(cf.AutogradError, match=r"\[deepcopy\] only leaf tensors"):
        copy.deepcopy(t * 2)
    cf.sum(t * 3.0).backward()
    assert copy.deepcopy(t).grad.tolist() == [3, 3, 3]  # .grad kept, as PyTorch's deepcopy does
    import pickle  # values, dtype, shape, device and requires_grad come back (a strided view as its values)
    for x in (cf.arange(6).reshape([2, 3]), cf.randn([3]).to(cf.bfloat16), cf.tensor([True, False]), t,
              cf.zeros([0, 3]), cf.tensor(2.5, dtype=cf.float64), cf.arange(6, dtype=cf.float32).reshape([2, 3]).T):
        y = pickle.loads(pickle.dumps(x))
        assert (y.dtype, y.shape, y.requires_grad, y.tolist()) == (x.dtype, x.shape, x.requires_grad, x.tolist())
    with pytest.raises(cf.AutogradError, match=r"\[pickle\] only leaf tensors"):
        pickle.dumps(t * 2)
    # before: "RuntimeError: std::bad_cast"
    with pytest.raises(cf.ValueError, match=r"\[tensor\] the integer 1180591620717411303424 does not fit in int64"):
        cf.tensor([2 ** 70])
    assert cf.tensor([float("inf"), 1.0]).tolist() == [float("inf"), 1.0]


def test_methods_mirror_functions():
    x = cf.tensor([[1.0, -2.0], [3.0, 0.5]])
    assert x.sum().item() == 2.5 and x.sum(0).tolist() == [4.0, -1.5]
    assert x.mean(axes=[0, 1]).item() == pytest.approx(0.625)
    assert x.relu().tolist() == [[1, 0], [3, 0.5]]
    values, idx = x.max(1)
    assert values.tolist() == [1, 3] and idx.tolist() == [0, 0]
    assert x.max().item() == 3
    assert x.transpose(0, 1).tolist() == [[1, 3], [-2, 0.5]]
    assert x.to(cf.float64).dtype == cf.float64 and x.double().dtype == cf.float64
    assert x.flatten().shape == (4,) and x.unsqueeze(0).squeeze(0).shape == (2, 2)
    v, i = cf.topk(cf.tensor([3.0, 1.0, 2.0]), 2)
    assert v.tolist() == [3, 2] and i.tolist() == [0, 2]
    parts = cf.arange(5).split(2)
    assert [p.tolist() for p in parts] == [[0, 1], [2, 3], [4]]


def test_cuda_tensor_pickles_and_deepcopies_on_its_device():
    if not cf.cuda.is_available():
        pytest.skip("no CUDA device visible (cf.cuda.is_available() is False)")
    import copy
    import pickle
    t = cf.arange(6, dtype=cf.float32, device="cuda").reshape([2, 3])
    for y in (pickle.loads(pickle.dumps(t)), copy.deepcopy(t)):
        assert y.device == t.device and y.tolist() == t.tolist() and y.data_ptr() != t.data_ptr()


def test_python_ints_beyond_2_53_are_exact_with_int64_tensors():
    # through a double, [2**53] == 2**53 + 1 was True and [0] - (2**60 + 1) was off by one
    t = cf.tensor([2**53])
    assert (t == 2**53 + 1).tolist() == [False]
    assert (t < 2**53 + 1).tolist() == [True]
    assert (cf.tensor([0]) - (2**60 + 1)).tolist() == [-(2**60 + 1)]
    assert ((2**62 + 3) + cf.tensor([1])).tolist() == [2**62 + 4]
    u = cf.tensor([0, 0])
    u[1] = 2**62 + 1
    assert u.tolist() == [0, 2**62 + 1]
    u += 2**53 + 1  # in-place operators too
    assert u.tolist() == [2**53 + 1, 2**62 + 2**53 + 2]
    u -= 2**53 + 1
    u *= 3
    assert u.tolist() == [0, 3 * (2**62 + 1) - 2**64]  # int64 wraps, as in PyTorch
    np = pytest.importorskip("numpy")
    assert (t == np.int64(2**53 + 1)).tolist() == [False]
    v = cf.tensor([2**54])
    v += np.int64(1)
    v *= np.int64(3)
    assert v.tolist() == [3 * (2**54 + 1)]
    f = cf.zeros([2])
    f += np.float32(2.5)
    f -= np.int64(1)
    f *= np.int64(2)
    assert f.tolist() == [3.0, 3.0]
    f += np.bool_(True)  # as t += True
    assert f.tolist() == [4.0, 4.0]
    f += np.ones(2)  # a NumPy array in place too (refused until stop 76), stored in f's dtype as NumPy does
    assert f.tolist() == [5.0, 5.0] and f.dtype == cf.float32
    with pytest.raises(cf.DTypeError, match=r"\[eq\] the integer 9223372036854775808 does not fit"):
        cf.tensor([2**63 - 1]) == 2**63
    with pytest.raises(cf.DTypeError, match=r"\[setitem\] the integer"):
        u[0] = -(2**63) - 1
    # fills too (they took a double: 2**62 + 1 became 2**62)
    big = 2**62 + 1
    assert cf.full([2], big, dtype=cf.int64).tolist() == [big, big]
    assert cf.scalar(-big, dtype=cf.int64).item() == -big
    assert cf.full_like(u, big).tolist() == [big, big]
    assert u.fill_(big).tolist() == [big, big]
    assert cf.zeros([2], dtype=cf.int64).masked_fill(cf.tensor([False, True]), big).tolist() == [0, big]
    top = 2**63 - 1  # its double rounds up past int64: the exact path must not meet it
    assert cf.zeros([2], dtype=cf.int64).masked_fill(cf.tensor([False, True]), top).tolist() == [0, top]
    assert cf.full([2], 2.5).tolist() == [2.5, 2.5] and cf.full([1], np.int64(7), dtype=cf.int64).tolist() == [7]


def test_indices_beyond_int64_are_index_errors():
    x = cf.zeros([3])
    for key in (2**63, -(2**63) - 1, [2**63], (0, 2**64)):
        with pytest.raises(cf.IndexError, match=r"\[getitem\] index -?\d+ is out of range \(beyond int64\)|\[getitem\]"):
            x[key]
    with pytest.raises(cf.IndexError, match=r"\[setitem\] index 9223372036854775808 is out of range"):
        x[2**63] = 1.0


def test_numbers_an_int64_tensor_cannot_hold_are_refused_by_writes():
    t = cf.tensor([1, 2, 3])
    with pytest.raises(cf.DTypeError, match=r"\[fill_\] value nan cannot be converted to int64"):
        t[0] = float("nan")
    with pytest.raises(cf.DTypeError, match=r"\[fill_\] value 1e\+30"):
        t.fill_(1e30)
    with pytest.raises(cf.DTypeError, match=r"\[full\] value inf"):
        cf.full([2], float("inf"), dtype=cf.int64)
    assert t.tolist() == [1, 2, 3]


def test_dtype_arguments_refuse_plain_ints():
    # nanobind's enum caster took an int as the dtype of that value: cf.zeros(2, 3) was a bool tensor of
    # shape (2,), cf.ones(2, 1) a float64 one
    for name, call in (("zeros", lambda: cf.zeros([2], 3)), ("to", lambda: cf.to(cf.zeros([2]), 1)),
                       ("tensor", lambda: cf.tensor([1, 2], dtype=0)), ("to", lambda: cf.zeros([2]).to(1))):
        with pytest.raises(TypeError, match=r"^%s\(\): incompatible function arguments" % name):
            call()
    assert cf.zeros([2], cf.float64).dtype == cf.float64  # a real dtype still goes positionally


def _same(a, b):
    assert a.shape == b.shape and a.dtype == b.dtype
    assert a.tolist() == b.tolist()


def test_pytorch_spellings_of_shapes():
    np = pytest.importorskip("numpy")
    for f in (cf.zeros, cf.ones, cf.empty):
        t = f(2, 3)
        assert t.shape == (2, 3) and t.dtype == cf.float32
        assert f(2, 1, 4, dtype=cf.float64, requires_grad=True).requires_grad
    g1, g2 = cf.Generator(5), cf.Generator(5)
    _same(cf.randn(2, 3, generator=g1, std=2.0), cf.randn([2, 3], generator=g2, std=2.0))
    _same(cf.rand(4, 1, generator=g1, low=2.0, high=3.0), cf.rand([4, 1], generator=g2, low=2.0, high=3.0))
    t = cf.arange(24, dtype=cf.float32)
    _same(t.reshape(4, 6), t.reshape([4, 6]))
    _same(t.view(2, -1, 3), t.view([2, 4, 3]))
    u = t.reshape(2, 3, 4)
    _same(u.permute(2, 0, 1), u.permute([2, 0, 1]))
    _same(u[:1].expand(5, 3, 4), u[:1].expand([5, 3, 4]))
    _same(t.reshape(np.int64(24)), t)  # one NumPy int too
    for name, bad in (("zeros", lambda: cf.zeros(2, 3.0)), ("zeros", lambda: cf.zeros(2, True)),
                      ("reshape", lambda: t.reshape(4, "6")), ("randn", lambda: cf.randn(2, 3, dtype=1)),
                      ("zeros", lambda: cf.zeros(cf.tensor(2.5), 3)), ("zeros", lambda: cf.zeros(2, 2**70)),
                      ("reshape", lambda: t.reshape(3, 2**70))):
        with pytest.raises(TypeError, match=r"^%s\(\): incompatible function arguments" % name):
            bad()
    with pytest.raises(cf.ShapeError, match=r"\[reshape\]"):  # cf's own errors, as in its spelling
        t.reshape(5, 5)


def test_pytorch_keywords_give_the_same_calls_as_cfs():
    np = pytest.importorskip("numpy")
    x = cf.randn([3, 4, 5], generator=cf.Generator(2))
    _same(x.sum(dim=1, keepdim=True), x.sum(1, keepdim=True))
    _same(cf.mean(x, dim=(0, 2)), cf.mean(x, (0, 2)))
    _same(x.sum(axis=0), x.sum(0))  # NumPy's axis= where cf says axes=
    _same(x.var(dim=2, correction=0), x.var(2, correction=0))
    _same(x.logsumexp(dim=-1), x.logsumexp(-1))
    _same(x.amax(dim=0), x.amax(0))
    values, indices = x.max(dim=1)
    _same(values, x.max(1)[0])
    _same(indices, x.max(1)[1])
    _same(x.argmin(dim=2), x.argmin(2))
    _same(x.softmax(dim=1), x.softmax(1))
    _same(cf.log_softmax(x, dim=0), cf.log_softmax(x, 0))
    _same(x.sort(dim=1, descending=True)[1], x.sort(1, True)[1])
    _same(x.topk(2, dim=0)[0], x.topk(2, 0)[0])
    _same(cf.cat([x, x], dim=2), cf.cat([x, x], 2))
    _same(cf.stack([x, x], dim=1), cf.stack([x, x], 1))
    _same(x.split(2, dim=2)[1], x.split(2, 2)[1])
    _same(x.unsqueeze(dim=1), x.unsqueeze(1))
    _same(x.transpose(dim0=0, dim1=2), x.transpose(0, 2))
    _same(x.flatten(start_dim=1), x.flatten(1))
    _same(x.permute(dims=[2, 1, 0]), x.permute([2, 1, 0]))
    index = cf.tensor([[[0], [2], [1], [0]]] * 3)
    _same(x.gather(dim=2, index=index), cf.gather(x, 2, index))
    _same(x.index_select(0, cf.tensor([2, 0])), cf.index_select(x, 0, cf.tensor([2, 0])))
    _same(x.add(1.0), x + 1.0)
    _same(x.lt(x.exp()), x < x.exp())
    # the operator methods follow the operators' rules: exact int64 numbers, NumPy operands
    big = cf.tensor([2**53 + 1])
    assert big.eq(2**53 + 1).tolist() == [True] and cf.tensor([2**53]).add(2**53 + 1).tolist() == [2**54 + 1]
    _same(cf.ones([3]).mul(np.full(3, 2.0)), cf.ones([3]) * np.full(3, 2.0))
    with pytest.raises(TypeError, match=r"\[add\] other must be"):
        x.add(None)
    _same(x.maximum(x * -1), cf.maximum(x, x * -1))
    # a call naming both spellings, or a keyword neither knows, gets the signature error
    for bad in (lambda: x.sum(dim=0, axes=1), lambda: x.sum(dims=0), lambda: cf.cat([x], dim=0, axis=0),
                lambda: cf.sum(x, dim=0, axis=0)):
        with pytest.raises(TypeError, match="incompatible function arguments"):
            bad()
    # and the signatures do not offer two spellings of one keyword together (sum(*args, dim, axis=...))
    assert "sum(*args, dim: int | collections.abc.Sequence[int] | None, **kwargs)" in cf.sum.__doc__
    assert "axis: int | collections.abc.Sequence[int] | None = ..." not in cf.sum.__doc__
    with pytest.raises(TypeError, match="incompatible function arguments") as e:
        x.sum(dim=0, keepdims=True)
    assert "{ dim: int, keepdims: bool }" in str(e.value)  # the call as written, not as renamed
    # cf's own error messages come through the renamed call
    with pytest.raises(cf.IndexError, match=r"\[sum\]"):
        x.sum(dim=7)
    # gradients flow through the renamed call
    w = cf.randn(3, 4, dtype=cf.float64, requires_grad=True)
    w.sum(dim=1).sum().backward()
    assert w.grad.tolist() == cf.ones(3, 4, dtype=cf.float64).tolist()


def test_parameters_keep_one_python_object():
    # each access made a new object before: `m.weight in set(m.parameters())` was False, a dict keyed by
    # parameters raised KeyError, id() sets matched by accident (a freed object's address reused)
    m = cf.nn.Linear(3, 2)
    assert m.weight is m.weight and m.bias is m.parameters()[1]
    assert m.weight in set(m.parameters())
    names = {p: n for n, p in m.named_parameters()}
    assert names[m.weight] == "weight" and names[m.bias] == "bias"
    ids = {id(p) for p in m.parameters()}
    assert [id(p) in ids for p in m.parameters()] == [True, True]
    m.weight.requires_grad_(False)  # frozen parameters too (held by the module)
    assert m.weight is m.weight and m.weight in set(m.parameters())
    x = cf.randn(4, 3)
    m(x).sum().backward()
    assert m.bias.grad is m.bias.grad  # as PyTorch's
    t = cf.randn(3)
    assert t.requires_grad_() is t and t.contiguous() is t
    assert t.detach() is not t and (t * 1) is not (t * 1)  # new tensors, new objects
    w = cf.randn(2, requires_grad=True)
    assert cf.tensor([1.0], requires_grad=True).requires_grad


def test_tensor_objects_live_as_long_as_cpp_holds_their_tensors():
    import gc
    import weakref
    m = cf.nn.Linear(2, 2)
    # as PyTorch's: a parameter's object survives while its module holds it, so an id() kept alone stays the
    # parameter's (the usual no-decay filter) and a weak reference lives as long as the module
    no_decay = {id(p) for n, p in m.named_parameters() if n == "bias"}
    junk = [cf.randn(2, requires_grad=True) for _ in range(20)]  # freed addresses get reused
    assert [id(p) in no_decay for p in m.parameters()] == [False, True]
    ref = weakref.ref(m.weight)
    gc.collect()
    assert ref() is m.weight
    # a tensor given to a module from Python keeps its object too
    w = cf.randn(2, 2, requires_grad=True)
    m.weight = w
    ref_w = weakref.ref(w)
    del w, junk
    gc.collect()
    assert ref_w() is m.weight
    # a gradient keeps one object while Python holds it, and is not kept for its slot (nor is any tensor
    # with only a brief second handle: a review's loops kept hundreds of batches alive that way)
    m(cf.randn(1, 2)).sum().backward()
    g = m.bias.grad
    assert g is m.bias.grad
    ref_g = weakref.ref(g)
    del g
    assert ref_g() is None
    batch = cf.randn(4, 2)
    for make in (lambda: batch.contiguous(), lambda: batch.to("cpu"), lambda: batch.clone().requires_grad_()):
        x = make()
        ref_x = weakref.ref(x)
        del x
        assert ref_x() is None
    # a deleted module's parameters are freed with the next collection (or cf.empty_cache)
    big = cf.nn.Linear(500, 500)
    params = list(big.parameters())
    live = cf.memory_stats().live_bytes
    del big, params
    cf.empty_cache()
    assert cf.memory_stats().live_bytes <= live - 500 * 500 * 4
    assert ref() is None and ref_w() is m.weight  # (the weight replaced by w has gone)
    del m
    gc.collect()
    assert ref_w() is None
    # a leaf that only Python holds is freed at once, and no loop grows the registry
    known = cf._cf._tensor_objects_known()
    m = cf.nn.Linear(2, 2)
    for _ in range(2000):
        p = cf.randn(8, requires_grad=True)
        ref_p = weakref.ref(p)
        del p
        assert ref_p() is None
        m(cf.randn(1, 2)).sum().backward()
        grads = [q.grad for q in m.parameters()]
        del grads
        m.zero_grad()
    del m
    gc.collect()
    assert cf._cf._tensor_objects_known() <= known  # entries leave with their objects
    m = cf.nn.Linear(2, 2)
    w1 = m.weight
    assert m.weight is w1


def test_pytorch_in_place_methods():
    t = cf.tensor([1.0, -2.0, 3.0])
    assert t.sub_(1) is t and t.tolist() == [0.0, -3.0, 2.0]
    assert t.div_(2).tolist() == [0.0, -1.5, 1.0]
    assert t.pow_(2).tolist() == [0.0, 2.25, 1.0]
    assert t.add_(1, alpha=2).tolist() == [2.0, 4.25, 3.0]  # a number, as PyTorch's add_
    assert t.mul_(cf.tensor([1.0, 0.0, 2.0])).tolist() == [2.0, 0.0, 6.0]  # a tensor, as PyTorch's mul_
    assert t.clamp_(max=2.0) is t and t.tolist() == [2.0, 0.0, 2.0]
    assert cf.tensor([2 ** 53]).add_(2 ** 53 + 1).tolist() == [2 ** 54 + 1]  # exact, as +=
    assert cf.tensor([0]).add_(2 ** 53 + 1, alpha=2).tolist() == [2 ** 54 + 2]
    with pytest.raises(cf.AutogradError, match=r"\[copy_\] in-place change of a tensor that requires grad"):
        cf.ones([2], requires_grad=True).clamp_(0.0, 0.5)
    with pytest.raises(cf.ValueError, match=r"\[clamp_\] give low \(min\), high \(max\) or both"):
        t.clamp_()


def test_identity_after_an_alias_and_bad_init():
    # (from a review) an op returning its input as is made a second object, after which in-place ops returned it
    x = cf.zeros(3)
    alias = x.contiguous()
    assert alias is not None and x.add_(cf.ones(3)) is x and x.mul_(2.0) is x and cf.nn.init.normal_(x) is x
    y = x
    x += 1
    assert x is y
    # requires_grad_ makes its object the one, over an alias returned before
    lin = cf.nn.Linear(3, 2)
    w = cf.randn(2, 3)
    w_alias = w.contiguous()
    w.requires_grad_()
    lin.weight = w
    assert lin.weight is w and w in set(lin.parameters()) and w_alias is not w
    # __init__ checks its object again (it wrote into any object, and re-initialised a parameter's)
    with pytest.raises(TypeError, match=r"^__init__\(\): incompatible function arguments"):
        cf.Tensor.__init__(12345678, [1.0])
    with pytest.raises(TypeError, match=r"^requires_grad_\(\): incompatible function arguments"):
        cf.Tensor.requires_grad_(5)
    assert hash(lin.weight) == hash(lin.weight)


def test_pytorch_conveniences_against_numpy():
    import math
    np = pytest.importorskip("numpy")
    x = cf.tensor([[1.0, -2.0, 3.0], [4.0, 0.0, -6.0]], dtype=cf.float64)
    a = np.array(x.tolist())
    assert x.t().tolist() == a.T.tolist() and x.mT.tolist() == a.T.tolist() and cf.tensor([1.0]).t().shape == (1,)
    assert [c.tolist() for c in x.chunk(2, dim=1)] == [a[:, :2].tolist(), a[:, 2:].tolist()]
    assert [c.shape for c in cf.chunk(cf.ones([5]), 3)] == [(2,), (2,), (1,)]
    assert [u.tolist() for u in x.unbind(1)] == [a[:, i].tolist() for i in range(3)] and len(cf.unbind(x)) == 2
    assert x.std().item() == pytest.approx(np.std(a, ddof=1)) and x.std(dim=1, correction=0).tolist() == \
        pytest.approx(np.std(a, axis=1).tolist())
    assert x.norm().item() == pytest.approx(np.linalg.norm(a)) and x.norm(1, dim=0).tolist() == [5.0, 2.0, 9.0]
    assert x.norm(float("inf")).item() == 6.0 and x.norm(3).item() == pytest.approx(np.sum(np.abs(a) ** 3) ** (1 / 3))
    assert x.all().item() is False and x.all(dim=0).tolist() == [True, False, True] and x.any().item() is True
    assert cf.tensor([False, False]).any().item() is False and cf.tensor([True]).all(keepdim=True).shape == (1,)
    s = cf.tensor([1.0, float("nan"), float("inf"), -float("inf")])
    assert s.isnan().tolist() == [False, True, False, False] and cf.isinf(s).tolist() == [False, False, True, True]
    assert cf.isfinite(s).tolist() == [True, False, False, False] and cf.isnan(cf.tensor([1, 2])).tolist() == [False] * 2
    m = cf.arange(12, dtype=cf.float32).reshape([3, 4])
    assert m.tril().tolist() == np.tril(np.arange(12.0).reshape(3, 4)).tolist()
    assert cf.triu(m, 1).tolist() == np.triu(np.arange(12.0).reshape(3, 4), 1).tolist()
    assert m.tril(-1).tolist() == np.tril(np.arange(12.0).reshape(3, 4), -1).tolist()
    assert cf.eye(3, 2).tolist() == np.eye(3, 2).tolist() and cf.eye(2, dtype=cf.int64).dtype == cf.int64
    assert cf.linspace(0, 1, 5).tolist() == [0, 0.25, 0.5, 0.75, 1] and cf.linspace(2, 3, 1).tolist() == [2]
    assert cf.allclose(x, x + 1e-9) and not cf.allclose(x, x + 1e-3)
    assert cf.allclose(s, s, equal_nan=True) and not cf.allclose(s, s)
    assert cf.equal(x, x.clone()) and not cf.equal(x, x[:1]) and not cf.equal(x, x * 2)
    p = cf.randperm(10, generator=cf.Generator(1))
    assert sorted(p.tolist()) == list(range(10)) and p.dtype == cf.int64 and cf.randperm(0).shape == (0,)
    assert p.tolist() == cf.randperm(10, generator=cf.Generator(1)).tolist()
    assert cf.bmm(cf.ones([2, 3, 4]), cf.ones([2, 4, 5])).tolist() == np.full((2, 3, 5), 4.0).tolist()
    with pytest.raises(cf.ShapeError, match=r"^\[bmm\] expects two 3-d tensors"):
        cf.bmm(cf.ones([3, 4]), cf.ones([4, 5]))
    assert x.new_zeros([2]).dtype == cf.float64 and x.new_full([1], 7).tolist() == [7.0] and x.new_ones(1).tolist() == [1]
    assert x.type_as(cf.ones([1])).dtype == cf.float32 and cf.ones([1, 3]).expand_as(x).shape == (2, 3)
    assert cf.ones([6]).reshape_as(x).shape == (2, 3) and cf.ones([6]).view_as(x).shape == (2, 3)
    assert x.bool().dtype == cf.bool and x.half().dtype == cf.float16 and x.bfloat16().dtype == cf.bfloat16
    # they are compositions of cf's differentiable ops: float64 gradients through each
    w = cf.randn([3, 4], dtype=cf.float64, generator=cf.Generator(1), requires_grad=True)
    for f in (lambda t: t[0].std(dim=0), lambda t: t[0].norm(), lambda t: t[0].norm(3, dim=1),
              lambda t: t[0].tril(), lambda t: t[0].t(), lambda t: cf.stack(t[0].chunk(2, dim=1), 0),
              lambda t: cf.stack(t[0].unbind(1), 0)):
        assert cf.gradcheck(f, [w]).ok
    with pytest.raises(cf.ShapeError, match=r"^\[t\] expects a tensor of at most 2 dimensions"):
        cf.ones([2, 2, 2]).t()
    with pytest.raises(cf.ShapeError, match=r"^\[tril\] expects a tensor of at least 2 dimensions"):
        cf.ones([3]).tril()
    with pytest.raises(cf.ValueError, match=r"^\[chunk\] chunks must be positive, got 0"):
        x.chunk(0)
    with pytest.raises(cf.IndexError, match=r"^\[unbind\] dim 2 out of range for a tensor of 2 dimensions"):
        x.unbind(2)
    with pytest.raises(cf.ValueError, match=r"^\[norm\] p must be positive \(or inf\), got -1"):
        x.norm(-1)
    assert math.isfinite(x.norm().item())


def test_several_index_tensors_index_together():
    # PyTorch's advanced indexing: the indices broadcast together; their shape takes the indexed axes' place when
    # those are adjacent, else it comes first. Ints are basic indexing, as in PyTorch (NumPy would count the int in
    # x[:, i, :, 0] as an index array and move the result's axes: the one key below where the two differ).
    import numpy as np
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 5, 6, 3))
    t = cf.from_numpy(x.copy())
    i, j, k = np.array([0, 3, -1]), np.array([[1], [4]]), np.array([2, 0, 5])
    keys = [(i, j), (slice(None), i, k), (i, slice(None), k), (i, 2, k), (Ellipsis, i, np.array([0, 1, 2])),
            (i, None, np.array([2, 0, 4])), ([0, 1], [2, 3]), (slice(1, 3), j, k), (i, j, k), (np.array(1), i),
            (np.array([[0], [1]]), np.array([], dtype=np.int64))]
    as_cf = lambda a: cf.from_numpy(a) if isinstance(a, np.ndarray) and a.ndim > 0 else a
    for key in keys:
        expected = x[key]
        got = t[tuple(as_cf(a) for a in key)]
        assert got.shape == expected.shape, key
        np.testing.assert_array_equal(got.numpy(), expected, err_msg=str(key))
        assert t[tuple(a.tolist() if isinstance(a, np.ndarray) else a for a in key)].shape == expected.shape  # lists
    # a 0-d index tensor is an int (PyTorch's rule; NumPy's 0-d arrays too): its axis goes, the others stay put
    assert t[cf.tensor(0), :, [1, 2]].shape == x[0][:, [1, 2]].shape == (5, 2, 3)
    np.testing.assert_array_equal(t[cf.tensor(-1), cf.tensor([[0], [1]]), :, cf.tensor(2)].numpy(), x[-1, [[0], [1]], :, 2])
    # range errors name the axis of t (ints and None do not shift it)
    with pytest.raises(cf.IndexError, match=r"out of range for axis 2 of size 6"):
        t[0, [0], [9]]
    with pytest.raises(cf.IndexError, match=r"out of range for axis 0 of size 4"):
        t[None, [7]]
    # where PyTorch and NumPy differ: an int is not an index array, so i keeps its place
    assert t[:, cf.from_numpy(i), :, 0].shape == (4, 3, 6) and x[:, i, :, 0].shape == (3, 4, 6)
    np.testing.assert_array_equal(t[:, cf.from_numpy(i), :, 0].numpy(), x[:, :, :, 0][:, i, :])
    # the gradient: index_select's, accumulated where positions repeat
    g = cf.from_numpy(x.copy())
    g.requires_grad = True
    w = rng.standard_normal((2, 3, 5, 3))
    rows, cols = np.array([[1], [3]]), np.array([2, 2, -1])
    (g[cf.from_numpy(rows), :, cf.from_numpy(cols)] * cf.from_numpy(w)).sum().backward()
    expected = np.zeros_like(x)
    np.add.at(expected, (rows, slice(None), cols), w)
    np.testing.assert_allclose(g.grad.numpy(), expected)
    # each index is range-checked against its own axis (flattened, [0, 9] would reach element (1, 4) silently)
    with pytest.raises(cf.IndexError, match=r"^\[getitem\] index 9 \(at flat position 1 of the index of shape \(2\)\) "
                       r"is out of range for axis 1 of size 5"):
        t[cf.tensor([0, 0]), cf.tensor([0, 9])]
    with pytest.raises(cf.IndexError, match=r"^\[getitem\] index -7 .* out of range for axis 2 of size 6"):
        t[[0, 1], :, [0, -7]]
    with pytest.raises(cf.ShapeError, match=r"\[getitem\]"):
        t[cf.tensor([0, 1]), cf.tensor([0, 1, 2])]


def test_setitem_with_index_tensors_writes_in_place():
    # PyTorch's index_put_ (NumPy's assignment): the key as for reading, x changed in place
    import numpy as np
    rng = np.random.default_rng(1)
    x = rng.standard_normal((4, 5, 3))
    t = cf.from_numpy(x.copy())
    view = t[1:]  # a view is written through too
    i, j = np.array([0, 2, -1]), np.array([[1], [4]])
    for key, value in [((i, j), 2.5), ((slice(None), i), rng.standard_normal((4, 3, 3))),
                       ((i, slice(None), np.array([0, 2, 1])), rng.standard_normal((1, 5))),  # leading 1 dropped
                       (([1, 3],), rng.standard_normal(3)), ((0, [4, 0], [2, 1]), [7.0, 8.0])]:
        t[tuple(cf.from_numpy(a) if isinstance(a, np.ndarray) else a for a in key)] = (
            cf.from_numpy(value) if isinstance(value, np.ndarray) else value)
        x[key] = value
        np.testing.assert_array_equal(t.numpy(), x, err_msg=str(key))
    view[cf.tensor([0]), 0] = -1.0
    x[1:][[0], 0] = -1.0
    np.testing.assert_array_equal(t.numpy(), x)
    # a position selected twice keeps the last value written, as NumPy's assignment
    t[[0, 0, 3, 0], [1, 1, 2, 1], 0] = cf.tensor([1.0, 2.0, 3.0, 4.0])
    assert t[0, 1, 0].item() == 4.0 and t[3, 2, 0].item() == 3.0
    # bool and int64 tensors (int64 beyond 2^53 exact)
    b = cf.zeros([2, 3], dtype=cf.bool)
    b[cf.arange(2), cf.tensor([2, 0])] = True
    b[[1, 1], [0, 0]] = cf.tensor([False, True])
    assert b.tolist() == [[False, False, True], [True, False, False]]
    n = cf.zeros([3], dtype=cf.int64)
    n[[0, 2]] = 2**60 + 1
    assert n.tolist() == [2**60 + 1, 0, 2**60 + 1]
    # NumPy values (arrays as tensors, scalars as the numbers they hold), numbers converted as basic setitem's
    f = cf.zeros([3])
    f[[0, 1]] = np.array([1.5, 2.5])
    f[[2]] = np.float32(4.5)
    assert f.tolist() == [1.5, 2.5, 4.5]
    n[[1]] = np.int64(2**60 + 3)  # exactly, as n[1] = ...
    assert n.tolist() == [2**60 + 1, 2**60 + 3, 2**60 + 1]
    n[[0]] = 2.5  # truncated, as n[0] = 2.5 and PyTorch
    assert n[0].item() == 2
    b[[0, 1], [0, 0]] = cf.tensor([-0.3, 0.0])  # a float value into bool: nonzero is True (through int64 -0.3 was 0)
    assert b.tolist() == [[True, False, True], [False, False, False]]
    z = cf.ones([2], dtype=cf.float64)
    z[[0]] = cf.tensor([-0.0], dtype=cf.float64)  # values are moved, not added: the sign of zero kept
    assert np.signbit(z.numpy()).tolist() == [True, False]
    # cf's in-place rule, as basic setitem: no write into a tensor that requires grad while recording, no value
    # that requires grad (the write is not recorded)
    leaf = cf.ones([3])
    leaf.requires_grad = True
    with pytest.raises(cf.AutogradError, match=r"in-place change of a tensor that requires grad"):
        leaf[[0]] = 5.0
    with pytest.raises(cf.AutogradError, match=r"^\[setitem\] the value written requires grad"):
        f[[0]] = leaf[:1]
    with pytest.raises(cf.ShapeError, match=r"^\[setitem\] a value of shape \(3\) cannot be broadcast to the "
                       r"selection's shape \(2\)"):
        t[[0, 1], [0, 1], 0] = cf.tensor([1.0, 2.0, 3.0])
    with pytest.raises(cf.IndexError, match=r"^\[setitem\] index 5 .* out of range for axis 1 of size 5"):
        t[[0, 1], [0, 5]] = 0.0


def test_boolean_mask_indexing():
    # PyTorch's y[y == PAD] = -100 and x[x > 0] (they were refused: "index tensors must be int64")
    y = cf.tensor([1, 0, 2, 0])
    y[y == 0] = -100
    assert y.tolist() == [1, -100, 2, -100] and y[y > 0].tolist() == [1, 2]
    x = cf.arange(6, dtype=cf.float32).reshape([2, 3])
    assert x[x > 2].tolist() == [3.0, 4.0, 5.0] and x[cf.zeros([2, 3], dtype=cf.bool)].shape == (0,)
    rows = cf.tensor([True, False])  # a mask of the leading dims selects (fills) rows
    assert x[rows].tolist() == [[0.0, 1.0, 2.0]]
    x[rows] = 0.5
    assert x.tolist() == [[0.5, 0.5, 0.5], [3.0, 4.0, 5.0]]
    w = cf.ones([3], requires_grad=True)
    (w * 2)[cf.tensor([True, False, True])].sum().backward()  # differentiable (one index_select)
    assert w.grad.tolist() == [2.0, 0.0, 2.0]
    with pytest.raises(cf.IndexError, match=r"^\[getitem\] a boolean mask bool \(1\) on cpu must have the shape of"):
        x[cf.tensor([True])]
    # tensor, array and list values (PyTorch's index_put_ with the mask: one value per true position, or per
    # selected row, or one broadcast to them); the mask is read back once for them
    v = cf.arange(6, dtype=cf.float32).reshape([2, 3])
    v[v > 2.5] = cf.tensor([30.0, 40.0, 50.0])
    assert v.tolist() == [[0.0, 1.0, 2.0], [30.0, 40.0, 50.0]]
    import numpy as np
    v[v < 1.5] = np.array([-1.0, -2.0])  # (a bare TypeError before: an array taken for an index)
    v[cf.tensor([False, True])] = [7.0, 8.0, 9.0]
    v[v > 8.5] = cf.ones([1])
    assert v.tolist() == [[-1.0, -2.0, 2.0], [7.0, 8.0, 1.0]]
    flags = cf.zeros([3], dtype=cf.bool)
    flags[cf.tensor([True, False, True])] = True
    assert flags.tolist() == [True, False, True]
    with pytest.raises(cf.ShapeError, match=r"^\[setitem\] a value of shape \(2\) cannot be broadcast to the "
                       r"selection's shape \(4\)"):
        v[v > 0] = cf.tensor([1.0, 2.0])
    with pytest.raises(cf.IndexError, match=r"a boolean mask is taken as the whole key only"):
        x[0, cf.tensor([True, False, True])]


def test_review_findings_on_operators_and_conveniences():
    np = pytest.importorskip("numpy")
    inf = float("inf")
    assert not cf.allclose(cf.tensor([1.0]), cf.tensor([inf])) and not cf.allclose(cf.tensor([-inf]), cf.tensor([inf]))
    assert cf.allclose(cf.tensor([inf]), cf.tensor([inf]))
    base = cf.tensor([10, 7, -7, 3])
    view = base[0:2]
    view //= 4  # in place through the view (the fallback t = t // u rebound the name)
    assert base.tolist() == [2, 1, -7, 3]
    alias = base
    alias %= 2
    assert alias is base and base.tolist() == [0, 1, 1, 1]
    with cf.autocast("cuda", cf.bfloat16):  # torch's second positional is the dtype
        assert cf.autocast_dtype() == cf.bfloat16
    z = cf.zeros([3], dtype=cf.float64, requires_grad=True)
    z.norm().backward()  # NaN through sqrt at 0 before
    assert z.grad.tolist() == [0.0, 0.0, 0.0]
    assert cf.tensor([300.0, 400.0], dtype=cf.float16).norm().item() == 500.0  # inf before (the squares overflowed)
    assert cf.tensor([[3.0, 4.0], [0.0, 0.0]]).norm(dim=1).tolist() == [5.0, 0.0]
    y = cf.tensor([2**62 + 1, 0])
    y[y != 0] = 2**62 + 3  # exact, not through a double
    assert y.tolist() == [2**62 + 3, 0]
    x = cf.ones([3])
    x[x > 0] = np.float32(0.5)
    assert x.tolist() == [0.5, 0.5, 0.5]
    data = list(range(8))
    with pytest.raises(cf.ValueError, match=r"^\[DataLoader\] a distributed loader \(num_replicas 2\) that shuffles needs seed="):
        cf.data.DataLoader(data, batch_size=2, shuffle=True, num_replicas=2, rank=0)
    loader = cf.data.DataLoader(data, batch_size=2, shuffle=True)
    again = cf.data.DataLoader(data, batch_size=2, shuffle=True, seed=loader.seed)
    assert [b.indices for b in loader] == [b.indices for b in again]


def test_masked_fill_in_place():
    x = cf.zeros([2, 3])
    mask = cf.tensor([True, False, True])
    assert x.masked_fill_(mask, 5.0) is x and x.tolist() == [[5, 0, 5], [5, 0, 5]]
    v = x.version
    assert cf.masked_fill_(x, cf.tensor([[False], [True]]), -1) is x and x.tolist() == [[5, 0, 5], [-1, -1, -1]]
    assert x.version > v
    big = cf.zeros([3], dtype=cf.int64)
    big.masked_fill_(mask, 2 ** 60 + 1)  # exact beyond 2^53
    assert big.tolist() == [2 ** 60 + 1, 0, 2 ** 60 + 1]
    col = cf.zeros([3, 2])[:, 1]  # a strided view: written through
    col.masked_fill_(mask, 1.0)
    assert col.tolist() == [1, 0, 1]
    with pytest.raises(cf.AutogradError, match=r"^\[masked_fill_\] in-place change of a tensor that requires grad"):
        cf.randn([3], requires_grad=True).masked_fill_(mask, 1.0)
    with pytest.raises(cf.ShapeError, match=r"^\[masked_fill_\] shapes \(2,3\) and \(2\) cannot be broadcast"):
        x.masked_fill_(cf.tensor([True, False]), 1.0)
    with pytest.raises(cf.DTypeError, match=r"^\[masked_fill_\] argument 'mask' must be bool, got float32"):
        x.masked_fill_(cf.ones([3]), 1.0)


def test_randint_with_high_only_as_torch():
    t = cf.randint(5, [200], generator=cf.Generator(3))
    assert t.dtype == cf.int64 and t.shape == (200,) and 0 <= t.min().item() and t.max().item() <= 4
    assert cf.equal(t, cf.randint(0, 5, [200], generator=cf.Generator(3)))
    with pytest.raises(cf.ValueError, match=r"^\[randint\]"):
        cf.randint(0, [3])


def test_masked_fill_in_place_refuses_overlapping_views():
    b = cf.tensor([1.0, 2.0, 3.0])
    with pytest.raises(cf.ValueError, match=r"^\[masked_fill_\]"):
        b.expand([2, 3]).masked_fill_(cf.tensor([[True, False, False], [False, True, False]]), 9.0)
    assert b.tolist() == [1.0, 2.0, 3.0]  # refused before any write
    z = cf.ones([3], dtype=cf.int64)
    with pytest.raises(cf.ValueError, match=r"^\[masked_fill_\]"):
        z.expand([2, 3]).masked_fill_(cf.tensor([[True, False, False], [False, True, False]]), 2 ** 60)
    assert z.tolist() == [1, 1, 1]
    # a mask that shares the tensor's memory is read before the writes (NumPy's rule)
    m = cf.tensor([True, False, True, True, False])
    m[1:].masked_fill_(m[:4], False)
    assert m.tolist() == [True, False, True, False, False]
