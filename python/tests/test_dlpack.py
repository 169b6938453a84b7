"""Zero-copy exchange with NumPy through DLPack and the array interface: writing
through one side is seen by the other, and memory outlives the side it came from."""
import gc

import pytest

import cf
from conftest import requires_cuda

np = pytest.importorskip("numpy")


def test_numpy_asarray_views_cpu_tensor():
    t = cf.arange(6, dtype=cf.float32).reshape([2, 3])
    a = np.asarray(t)
    assert a.dtype == np.float32 and a.shape == (2, 3) and a.ctypes.data == t.data_ptr()
    a[0, 1] = 42.0  # NumPy writes, cf sees
    assert t[0, 1].item() == 42.0
    t[1, 2] = -1.0  # cf writes, NumPy sees
    assert a[1, 2] == -1.0
    # strided views keep their strides
    tt = t.T
    at = np.asarray(tt)
    assert at.strides == (4, 12) and at[1, 0] == 42.0
    assert np.asarray(cf.tensor([True, False])).dtype == np.bool_
    assert np.asarray(cf.arange(3)).dtype == np.int64


def test_numpy_array_outlives_the_tensor_object():
    a = np.asarray(cf.full([1000], 3.0))
    gc.collect()
    assert float(a.sum()) == 3000.0


def test_from_dlpack_numpy_shares_memory():
    a = np.arange(12, dtype=np.float64).reshape(3, 4)
    t = cf.from_dlpack(a)
    assert t.dtype == cf.float64 and t.shape == (3, 4) and t.data_ptr() == a.ctypes.data
    t[0, 0] = 100.0
    assert a[0, 0] == 100.0
    a[2, 3] = -5.0
    assert t[2, 3].item() == -5.0
    # a non-contiguous NumPy view
    v = cf.from_dlpack(a[:, ::2])
    assert v.shape == (3, 2) and v.strides == (4, 2) and v.tolist()[2] == [8.0, 10.0]
    # the producer's memory stays alive while cf holds it
    b = np.ones(4, dtype=np.int64)
    tb = cf.from_dlpack(b)
    del b
    gc.collect()
    assert tb.tolist() == [1, 1, 1, 1]
    # cf ops on borrowed memory, and autograd through it
    x = cf.from_dlpack(np.linspace(-1, 1, 5)).requires_grad_()
    cf.sum(x * x).backward()
    assert x.grad.tolist() == pytest.approx([-2, -1, 0, 1, 2])


def test_numpy_from_dlpack_of_cf_tensor():
    t = cf.randn([4, 5], generator=cf.Generator(3))
    a = np.from_dlpack(t)
    assert a.ctypes.data == t.data_ptr()
    t.fill_(0.0)  # NumPy (before 2.1) marks DLPack imports read-only, so cf writes and NumPy reads
    assert float(np.abs(a).max()) == 0.0
    assert t.__dlpack_device__() == (1, 0)


def test_capsule_round_trip():
    t = cf.arange(4)
    u = cf.from_dlpack(cf.to_dlpack(t))
    assert u.shares_storage(t) is False and u.data_ptr() == t.data_ptr()  # a new storage over the same bytes
    u[0] = 7
    assert t[0].item() == 7
    cap = t.__dlpack__()
    cf.from_dlpack(cap)
    with pytest.raises(cf.ValueError, match=r"^\[from_dlpack\]"):
        cf.from_dlpack(cap)  # a capsule is consumed once


def test_unsupported_inputs_are_clear_errors():
    with pytest.raises(cf.DTypeError, match=r"^\[from_dlpack\] dtype"):
        cf.from_dlpack(np.zeros(3, dtype=np.int32))
    with pytest.raises(cf.ValueError, match="no __dlpack__"):
        cf.from_dlpack([1, 2, 3])
    # NumPy refuses to export these (its BufferError): cf's names the op and the object's type
    ro = np.arange(3.0)
    ro.flags.writeable = False
    try:  # NumPy >= 2.1 exports it marked read-only through DLPack 1.0, and cf then refuses it itself
        ro.__dlpack__(max_version=(1, 0))
        exported = True
    except (TypeError, BufferError):
        exported = False
    if exported:
        with pytest.raises(cf.ValueError, match=r"^\[from_dlpack\] the producer marked the tensor read-only"):
            cf.from_dlpack(ro)
    else:
        with pytest.raises(BufferError, match=r"^\[from_dlpack\] <class 'numpy.ndarray'> cannot be exported: \S"):
            cf.from_dlpack(ro)
    with pytest.raises(BufferError, match=r"^\[from_dlpack\] <class 'numpy.ndarray'> cannot be exported: \S"):
        cf.from_dlpack(np.arange(3, dtype=">f4"))  # byte-swapped
    assert cf.from_dlpack(np.arange(3, dtype="<f4")).tolist() == [0.0, 1.0, 2.0]  # native order is taken


@requires_cuda
def test_cuda_dlpack_round_trip():
    t = cf.arange(8, dtype=cf.float32, device="cuda")
    assert t.__dlpack_device__() == (2, 0)
    u = cf.from_dlpack(t.__dlpack__(stream=1))
    assert u.device == t.device and u.data_ptr() == t.data_ptr()
    u[3] = -1.0
    assert t[3].item() == -1.0
    with pytest.raises(cf.DeviceError, match=r"\[__array__\] tensor is on cuda:0: NumPy reads CPU memory only"):
        np.asarray(t)
    with pytest.raises(cf.DeviceError, match="NumPy reads CPU memory only"):
        np.sum(t)  # NumPy's functions view tensors as np.asarray does


def test_low_precision_dtypes_cross_numpy_and_dlpack():
    # bfloat16 / float16 (issue 26): values round to nearest even once, float16 crosses NumPy
    # both ways, bfloat16 (which NumPy lacks) says so, and DLPack carries both to PyTorch.
    a = cf.tensor([1.0, 2.5, 1.0 + 2.0**-8], dtype=cf.bfloat16)
    assert a.dtype == cf.bfloat16 and a.tolist() == [1.0, 2.5, 1.0]
    assert cf.is_floating(cf.float16) and cf.dtype_size(cf.bfloat16) == 2
    h = cf.tensor(np.array([1.5, 65504.0], dtype=np.float16))
    assert h.dtype == cf.float16 and np.asarray(h).dtype == np.float16
    assert np.asarray(h).tolist() == [1.5, 65504.0]
    with pytest.raises(cf.DTypeError, match="bfloat16"):
        np.asarray(a)
    torch = pytest.importorskip("torch")
    t = torch.from_dlpack(a)
    assert t.dtype == torch.bfloat16 and t.tolist() == [1.0, 2.5, 1.0]
    back = cf.from_dlpack(torch.tensor([0.5, -3.0], dtype=torch.float16))
    assert back.dtype == cf.float16 and back.tolist() == [0.5, -3.0]


def test_an_empty_tensor_imported_from_torch_reaches_numpy():
    # torch hands an empty tensor over DLPack with data address 0, which NumPy's array interface refuses
    torch = pytest.importorskip("torch")
    for shape in [(0, 3), (0,)]:
        t = cf.from_dlpack(torch.zeros(*shape))
        assert t.shape == list(shape) or tuple(t.shape) == shape
        for view in (t.numpy(), np.asarray(t), np.asarray(t[0:0])):
            assert view.size == 0 and view.dtype == np.float32
        assert t.numpy().shape == shape


def test_numpy_functions_take_cpu_tensors():
    # NumPy's reductions used to call the tensor's methods with NumPy's keywords (t.sum(axis=None,
    # out=None)) and fail; every NumPy function now runs on views of the tensors.
    t = cf.arange(6, dtype=cf.float64).reshape([2, 3])
    s = np.sum(t)
    assert isinstance(s, np.floating) and s == 15.0
    assert np.mean(t, axis=0).tolist() == [1.5, 2.5, 3.5]
    assert np.max(t) == 5.0 and np.argmin(t) == 0 and np.var(cf.tensor([1.0, 3.0])) == 1.0
    c = np.concatenate([t, np.ones((1, 3))])
    assert isinstance(c, np.ndarray) and c.shape == (3, 3) and c[2].tolist() == [1.0, 1.0, 1.0]
    assert np.allclose(t, np.arange(6).reshape(2, 3))
    # out= a tensor writes into its memory (a view), counts the write and returns the tensor
    out = cf.zeros([3], dtype=cf.float64)
    v = out.version
    assert np.sum(t, axis=0, out=out) is out
    assert out.tolist() == [3.0, 5.0, 7.0] and out.version > v
    # a tensor inside a container NumPy's dispatch finds but the views skip: NumPy converts it (no recursion)
    import collections
    assert np.concatenate(collections.deque([t, np.ones((1, 3))])).shape == (3, 3)
    # shape, ndim and squeeze read the tensor itself: any tensor, and squeeze stays a cf.Tensor on the graph
    g = cf.ones([1, 2], requires_grad=True)
    assert np.shape(g) == (1, 2) and np.ndim(g) == 2
    sq = np.squeeze(g)
    assert isinstance(sq, cf.Tensor) and sq.shape == (2,) and sq.requires_grad
    # refused as np.asarray(t) refuses: a tensor that requires grad (as PyTorch's .numpy())
    with pytest.raises(cf.AutogradError, match=r"\[__array__\] cannot view a tensor that requires grad"):
        np.sum(cf.ones([2], requires_grad=True))
