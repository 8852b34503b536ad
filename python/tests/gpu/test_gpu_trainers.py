# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""mok inside real trainers on the GPU, with the trainers' own released
code (wheels from PyPI carried to the GPU machine): the checks of
bench/trainer_checks.py with CUDA tensors, so mok runs its GPU kernels
(mok.functional compiles and loads them for the device's chip). The
float64 reference and the bound are the CPU tests' (python/tests/
test_trainers.py)."""
import pytest

from bench import trainer_checks as checks

REL = checks.REL_BOUND


def _need(module):
    pytest.importorskip(module, reason=f"needs {module} (a wheel carried to the GPU machine)")


def test_functional_import_leaves_cuda_alone():
    import subprocess
    import sys
    code = ("import ctypes, torch, mok.functional, mok.ops\n"
            "assert not torch.cuda.is_initialized()\n"
            "cu = ctypes.CDLL('libcuda.so.1')\n"
            "assert cu.cuInit(0) == 0\n"
            "flags, active = ctypes.c_uint(), ctypes.c_int()\n"
            "assert cu.cuDevicePrimaryCtxGetState(0, ctypes.byref(flags), "
            "ctypes.byref(active)) == 0\n"
            "print(active.value)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "0", "importing mok.functional made a CUDA context"


def test_automodel_init_parity_on_gpu():
    _need("nemo_automodel.components.moe.mok_experts")
    native_keys, mok_keys, same = checks.automodel_init_parity(device="cuda")
    assert native_keys == mok_keys and same


@pytest.mark.parametrize("kw", [
    dict(tokens=512, dim=1024, inter=512, experts=16, topk=4),
    dict(tokens=333, dim=512, inter=256, experts=8, topk=2, swiglu_limit=0.75, drop=0.2),
    dict(tokens=1, dim=256, inter=256, experts=8, topk=2),
], ids=["t512-h1024-e16-k4", "t333-clamped-dropped", "t1"])
def test_automodel_experts_on_gpu(kw):
    _need("nemo_automodel.components.moe.mok_experts")
    result = checks.automodel_experts_check(device="cuda", **kw)
    for name, (mine, native) in result.items():
        print(f"automodel {kw.get('tokens')} {name}: mok {mine:.2e} native {native:.2e}")
        assert mine <= REL, f"{name}: mok {mine:.2e} (native {native:.2e})"


def test_automodel_moe_block_on_gpu():
    _need("nemo_automodel.components.moe.mok_experts")
    result = checks.automodel_moe_check(device="cuda", tokens=1024, dim=1024, inter=512,
                                        experts=16, topk=4)
    for name, rel in result.items():
        assert rel <= 2 * REL, f"{name}: {rel:.2e}"


def test_hf_experts_on_gpu():
    _need("transformers.integrations.moe")
    result = checks.hf_experts_check(device="cuda", tokens=777, hidden=512, moe_inter=256,
                                     experts=16, topk=4)
    for name, (mine, native) in result.items():
        print(f"hf experts {name}: mok {mine:.2e} grouped_mm {native:.2e}")
        assert mine <= REL, f"{name}: mok {mine:.2e} (grouped_mm {native:.2e})"


def test_hf_qwen3_model_on_gpu():
    _need("transformers.integrations.moe")
    result = checks.hf_qwen3_check(device="cuda", batch=2, seq=24, hidden=256, moe_inter=128,
                                   experts=16, topk=4)
    result.pop("redraws")
    for name, (mine, native) in result.items():
        assert mine <= 2 * native + 1e-3, f"{name}: mok {mine:.2e}, grouped_mm {native:.2e}"


def test_hf_training_on_gpu():
    _need("transformers.integrations.moe")
    curves = checks.hf_qwen3_training(device="cuda")
    for step, a, b in zip(curves["step"], curves["mok"], curves["grouped_mm"]):
        assert abs(a - b) <= 0.01 * b, f"step {step}: mok {a:.4f}, grouped_mm {b:.4f}"


@pytest.mark.parametrize("main_grad", [False, True], ids=["grad", "main_grad"])
def test_megatron_backend_on_gpu(main_grad):
    _need("megatron.core.transformer.moe.experts")
    result, _, _ = checks.megatron_check(device="cuda", tokens=700, hidden=512, inter=256,
                                         shared_inter=512, experts=16, topk=4,
                                         main_grad=main_grad)
    for name, (mine, native) in result.items():
        print(f"megatron {name}: mok {mine:.2e} native {native:.2e}")
        assert mine <= REL, f"{name}: mok {mine:.2e} (native {native:.2e})"


def test_megatron_moe_layer_with_mok_on_gpu():
    """Megatron-Core's own MoELayer (router, dispatcher, experts) against a
    copy running mok through use_mok: its router needs CUDA, so this runs
    on the GPU only."""
    _need("megatron.core.transformer.moe.moe_layer")
    result = checks.megatron_moe_layer_check(device="cuda")
    for name, rel in result.items():
        print(f"megatron MoELayer {name}: {rel:.2e}")
        assert rel <= 2 * REL, f"{name}: {rel:.2e}"
