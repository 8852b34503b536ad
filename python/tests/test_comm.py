# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""mok.Communicator and layers bound to one, without a GPU: every argument
error named; NCCL missing; the stand-in NCCL (runtime/tests/FakeNccl.cpp)
for NCCL's own errors, sizes that differ between ranks (threads), peer
tables, adoption, a local group of 4, and ep > 1 layers launched with their
peer table, rank and epoch (comm_scenarios.py, one process each: the
runtime loads NCCL and the driver once a process). The GPU's own tests are
gpu/test_gpu_comm.py."""
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))

try:
    from mok import _runtime as rt
    LIB = os.path.join(os.path.dirname(os.path.abspath(rt.__file__)), "..", "..", "lib")
    FAKE = os.path.join(LIB, "libmok_fake_cuda.so")
    MISSING = "" if os.path.exists(FAKE) else f"{FAKE} is not built (MOK_BUILD_TESTS)"
except ImportError as e:
    FAKE, MISSING = None, f"no runtime extension ({e})"

pytestmark = pytest.mark.skipif(bool(MISSING), reason=MISSING or "built")


def run(scenario, **env):
    """Runs `scenario` of comm_scenarios.py with the stand-ins (or what
    `env` says instead) and checks it passed."""
    environment = dict(os.environ, MOK_CUDA_DRIVER=FAKE, MOK_NCCL_LIBRARY=FAKE,
                       PYTHONPATH=os.pathsep.join([HERE] + sys.path))
    for name in ("MOK_FAKE_NCCL_VERSION", "MOK_FAKE_NCCL_LSA_SIZE", "MOK_FAKE_NCCL_WINDOW"):
        environment.pop(name, None)
    environment.update(env)
    proc = subprocess.run([sys.executable, os.path.join(HERE, "comm_scenarios.py"), scenario],
                          capture_output=True, text=True, env=environment, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), \
        proc.stdout[-2000:] + proc.stderr[-6000:]
    assert "leaked" not in proc.stderr, proc.stderr[-4000:]


def test_without_nccl_every_call_says_so_after_its_argument_errors():
    run("no_nccl", MOK_NCCL_LIBRARY="/nonexistent/libnccl.so.2",
        MOK_CUDA_DRIVER="/nonexistent/libcuda.so.1")


def test_nccl_missing_entry_point_too_old_and_a_second_copy_are_refused():
    run("nccl_load")


def test_one_rank_ids_errors_buffers_and_adoption():
    run("one_rank")


def test_two_ranks_sizes_must_agree_and_tables_reach_the_peers():
    run("two_ranks")


def test_local_group_of_four_tables_and_layers():
    run("local_group")


def test_training_layer_of_self_exchange_binds_both_kernels():
    pytest.importorskip("torch")
    run("training_self_exchange")


def test_adopt_takes_nccl_process_groups_only():
    pytest.importorskip("torch")
    run("process_groups")
