# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""No hangs: the persistent kernels wait at grid barriers for every CTA of
their grid, so every CTA must be resident at once. The runtime sizes the
grid by the kernel's occupancy, refuses a grid that cannot be resident, and
launches cooperatively (the driver then refuses, rather than starts, a grid
that cannot be resident). These run layers beside other work on the GPU,
each bounded by a watchdog, and the bounded-wait debugging mode
(barrier_timeout_ms) on a grid made too large on purpose.
"""
import os
import time

import pytest

import mok
from bench import torch_reference
from bench.cases import CASES

ARTIFACTS = os.environ.get("MOK_GPU_ARTIFACTS", "gpu-artifacts")
REL_BOUND = 1e-2
WATCHDOG_S = 60


def _layer(name):
    path = os.path.join(ARTIFACTS, name, "moe_layer")
    if not os.path.exists(path + ".ptx"):
        pytest.fail(f"{path}.ptx is missing: run python3 -m bench.compile tests")
    return mok.GpuArtifact.from_files(path).load(poison_outputs=True)


def _inputs(name, seed):
    import torch
    gen = torch.Generator().manual_seed(seed)
    return torch_reference.make_inputs(CASES[name], gen)


def _reference(name, args):
    c = CASES[name]
    return torch_reference.forward(args, c["experts"], c.get("swiglu_limit"))


def _finish(events, what):
    """Waits for the events without blocking in the driver, at most
    WATCHDOG_S: a hang fails the test (naming `what`) instead of the run."""
    start = time.time()
    while not all(e.query() for e in events):
        if time.time() - start > WATCHDOG_S:
            pytest.fail(f"{what}: not finished after {WATCHDOG_S} s (a hang)")
        time.sleep(0.001)
    return time.time() - start


@pytest.mark.parametrize("name", ["top2_no_route", "top1_clamp", "mc_top1_clamp"])
def test_grid_is_sized_by_occupancy_and_may_be_smaller(name):
    import torch
    layer = _layer(name)
    sms = torch.cuda.get_device_properties(layer.device).multi_processor_count
    ctas, most = layer.grid
    cluster = layer.meta.get("cluster", 1)
    assert ctas <= sms and ctas % cluster == 0 and most >= ctas
    with pytest.raises(mok.MokRuntimeError, match=r"ctas: \d+ CTAs cannot be resident at "
                       r"once; at most \d+"):
        layer.set_grid(most + cluster)
    assert layer.grid[0] == ctas  # a refused grid leaves the old one
    args = _inputs(name, 3)
    ref = _reference(name, args)
    # The kernels work over any grid: a quarter of the SMs, and one cluster.
    for share in (max(cluster, ctas // 4 // cluster * cluster), cluster):
        layer.set_grid(share)
        assert layer.grid[0] == share
        out = layer(**args)
        layer.check_errors()
        assert torch_reference.relative_error(out, ref) <= REL_BOUND, f"grid {share}"
    layer.set_grid(0)
    assert layer.grid[0] == ctas


def test_layers_on_concurrent_streams_finish():
    """Two persistent layers launched on two streams at once, many times,
    each on every SM: cooperative launches never leave two grids each
    waiting for multiprocessors the other holds."""
    import torch
    a, b = _layer("top1_clamp"), _layer("top2_no_route")
    args_a, args_b = _inputs("top1_clamp", 1), _inputs("top2_no_route", 2)
    ref_a, ref_b = _reference("top1_clamp", args_a), _reference("top2_no_route", args_b)
    sa, sb = torch.cuda.Stream(), torch.cuda.Stream()
    outs, events = [], []
    for _ in range(50):
        with torch.cuda.stream(sa):
            outs.append(("top1_clamp", a(**args_a)))
        with torch.cuda.stream(sb):
            outs.append(("top2_no_route", b(**args_b)))
    for s in (sa, sb):
        e = torch.cuda.Event()
        e.record(s)
        events.append(e)
    _finish(events, "two layers on two streams")
    for name, out in outs:
        ref = ref_a if name == "top1_clamp" else ref_b
        assert torch_reference.relative_error(out, ref) <= REL_BOUND, name


def test_layers_on_shares_of_the_gpu_run_side_by_side():
    """Each layer on half of the multiprocessors (how expert-parallel ranks
    share one GPU in the tests), launched together on two streams."""
    import torch
    a, b = _layer("top1_clamp"), _layer("short_k")
    half = a.grid[0] // 2
    a.set_grid(half)
    b.set_grid(half)
    args_a, args_b = _inputs("top1_clamp", 4), _inputs("short_k", 5)
    sa, sb = torch.cuda.Stream(), torch.cuda.Stream()
    with torch.cuda.stream(sa):
        out_a = [a(**args_a) for _ in range(20)]
    with torch.cuda.stream(sb):
        out_b = [b(**args_b) for _ in range(20)]
    events = [torch.cuda.Event(), torch.cuda.Event()]
    events[0].record(sa)
    events[1].record(sb)
    _finish(events, "two layers on halves of the GPU")
    for o in out_a:
        assert torch_reference.relative_error(o, _reference("top1_clamp", args_a)) <= REL_BOUND
    for o in out_b:
        assert torch_reference.relative_error(o, _reference("short_k", args_b)) <= REL_BOUND


def test_layer_beside_a_kernel_holding_the_multiprocessors():
    """A stream of large matrix products (every SM busy for a while) and the
    layer launched on another stream meanwhile: the layer waits for
    multiprocessors or shares them, and finishes, exact."""
    import torch
    layer = _layer("top1_clamp")
    args = _inputs("top1_clamp", 6)
    ref = _reference("top1_clamp", args)
    side = torch.cuda.Stream()
    m = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    with torch.cuda.stream(side):
        for _ in range(20):
            m = (m @ m).clamp(-1, 1)
    outs = [layer(**args) for _ in range(10)]
    done = torch.cuda.Event()
    done.record()
    busy = torch.cuda.Event()
    busy.record(side)
    _finish([done, busy], "a layer beside a busy stream")
    for o in outs:
        assert torch_reference.relative_error(o, ref) <= REL_BOUND


@pytest.mark.parametrize("name", ["timeout_top2_no_route", "timeout_top1_clamp"])
def test_bounded_barrier_reports_a_grid_that_cannot_be_resident(name, monkeypatch):
    """barrier_timeout_ms: a grid twice what can be resident (the testing
    hook MOK_TESTING_OVERSUBSCRIBE lets set_grid ask for it and launch it
    without the cooperative guarantee) stalls at the first grid barrier; the
    resident CTAs give up after the bound, the others then run through, the
    call raises MOK_ERROR_TIMEOUT naming the barrier, and the layer works
    again on its own grid."""
    import torch
    layer = _layer(name)
    previous = mok.set_error_checks("off")
    try:
        args = _inputs(name, 8)
        ref = _reference(name, args)
        ctas, most = layer.grid
        # A whole run first: the routing plan's buffers then hold one plan
        # (what the CTAs that give up go on with).
        assert torch_reference.relative_error(layer(**args), ref) <= REL_BOUND
        layer.check_errors()
        monkeypatch.setenv("MOK_TESTING_OVERSUBSCRIBE", "1")
        layer.set_grid(2 * most)
        start = time.time()
        layer(**args)
        done = torch.cuda.Event()
        done.record()
        _finish([done], f"{name} on {2 * most} CTAs")
        with pytest.raises(mok.MokRuntimeError,
                           match=rf"grid barrier 0 waited longer than its bound .* with "
                                 rf"\d+ of {2 * most} CTAs arrived") as info:
            layer.check_errors()
        assert info.value.status == "MOK_ERROR_TIMEOUT"
        elapsed = time.time() - start
        assert elapsed < 20, f"{name}: the bounded wait took {elapsed:.1f} s"
        monkeypatch.delenv("MOK_TESTING_OVERSUBSCRIBE")
        layer.set_grid(0)
        out = layer(**args)
        layer.check_errors()
        assert torch_reference.relative_error(out, ref) <= REL_BOUND
    finally:
        mok.set_error_checks(previous)
