# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""The GPU side of mok's tests and benchmarks, one package run from the
repository root (`python3 -m bench.<tool>`, PYTHONPATH reaching the mok
package, e.g. build-gpu/python):

- the layers the GPU tests run (`cases`) and the benchmark shapes
  (`shapes`), compiled for a target by `bench.compile` (on a machine with
  the compiler, or on the GPU machine with the carried static one);
- the float64 PyTorch reference both check against (`torch_reference`);
- the benchmarks: `moe_forward` and `moe_training` (mok against the
  plain-PyTorch layer), `peers` (mok beside open-source MoE kernels),
  `main_grad`, `power`, `call_time`, `host_overhead`, `ab` (compiled
  variants side by side), `ep_multi_gpu` (expert parallelism on several
  GPUs, under torchrun, against a torch.distributed baseline) and the
  Nsight Compute drivers (`ncu.sh`, `ncu_forward`, `ncu_training`).

The one-command GPU runs that use them are scripts/gpu/run_h200.sh and
scripts/gpu/ab.sh.
"""
