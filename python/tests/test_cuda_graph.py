"""cf.cuda.Graph (core/cuda_graph.h): errors without a GPU; capture and replay with one."""
import pytest

import cf

needs_cuda = pytest.mark.skipif(not cf.cuda.is_available(), reason="no CUDA device visible")


def test_graph_errors_name_the_reason_and_replayable_just_runs():
    g = cf.cuda.Graph()
    assert not g.captured and g.parts == 0 and not cf.cuda.capturing()
    with pytest.raises(cf.DeviceError, match=r"^\[cuda::Graph\] replay before a successful capture"):
        g.replay()
    with pytest.raises(cf.ValueError, match=r"^\[cuda::Graph\] captures CUDA work: device cpu is not a CUDA"):
        g.capture(lambda: None, "cpu")
    if not cf.cuda.is_available():
        with pytest.raises(cf.DeviceError, match=r"cuda:0 is not available"):
            g.capture(lambda: None)
    calls = []
    cf.cuda.replayable(lambda: calls.append(1))
    assert calls == [1]


@needs_cuda
def test_a_captured_step_replays_on_new_inputs_and_python_errors_end_the_capture():
    x = cf.tensor([0.0, 1.0, 2.0, 3.0, 4.0, 5.0], dtype=cf.float32).cuda()
    out = {}

    def step():
        out["y"] = x * 2.0 + 1.0

    g = cf.cuda.Graph()
    g.capture(step)
    g.replay()
    assert out["y"].tolist() == [1.0, 3.0, 5.0, 7.0, 9.0, 11.0]
    x.copy_(cf.full([6], 2.0).cuda())
    g.replay()
    assert out["y"].tolist() == [5.0] * 6

    def fails():
        raise KeyError("inside the capture")

    with pytest.raises(KeyError):
        g.capture(fails)
    assert not g.captured and not cf.cuda.capturing()
    with pytest.raises(cf.DeviceError, match="cannot read or write host memory"):
        g.capture(lambda: x.sum().item())
