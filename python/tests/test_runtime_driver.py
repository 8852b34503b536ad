# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""mok._runtime with layers loaded and run on the stand-in CUDA driver
(runtime/tests/FakeCuda.cpp; driver_scenarios.py, one process each): the
argument mutations of test_api_properties.py on a loaded layer's forward
(each named, none launched), driver calls failing at random (each a named
MokRuntimeError; nothing left allocated, loaded or retained; the layer
usable after), and 1,000 load + forward + drop cycles (nothing left, host
memory flat). The GPU's own loop is gpu/test_gpu_reliability.py."""
import json
import os
import subprocess
import sys

import pytest

import driver_scenarios
from properties import CASES, SEED

HERE = os.path.dirname(os.path.abspath(__file__))
CLEAN = {"live_allocations": 0, "live_modules": 0, "context_retains": 0, "bad_releases": 0}

pytestmark = pytest.mark.skipif(bool(driver_scenarios.available()),
                                reason=driver_scenarios.available() or "built")


def run(scenario, n, seed=SEED):
    """(the scenario's JSON report, its stderr), after checking it exited 0
    and nanobind reported no leaked instance at its exit."""
    env = dict(os.environ, MOK_CUDA_DRIVER=driver_scenarios.FAKE,
               PYTHONPATH=os.pathsep.join([HERE] + sys.path))
    proc = subprocess.run([sys.executable, os.path.join(HERE, "driver_scenarios.py"),
                           scenario, str(seed), str(n)], capture_output=True, text=True,
                          env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "leaked" not in proc.stderr, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


def test_loaded_layer_names_every_wrong_argument_and_launches_nothing():
    report, _ = run("loaded_arguments", CASES)
    assert report["problems"] == [], "\n".join(report["problems"][:20])
    assert report["named"] > CASES // 2 and report["launched"] > 0
    assert report["device_error"].startswith("x: expected a CUDA array on device 0, got "
                                             "cuda:1")
    assert report["after"] == CLEAN


def test_driver_failures_are_named_and_leave_nothing():
    report, _ = run("driver_failures", CASES // 3)
    assert report["problems"] == [], "\n".join(report["problems"][:20])
    assert set(report["errors"]) <= {"MOK_ERROR_CUDA", "MOK_ERROR_OUT_OF_MEMORY"}
    assert "MOK_ERROR_CUDA" in report["errors"]
    assert report["read_error"].startswith("copying the workspace buffer 'grid_barrier' "
                                           "to the host: unspecified launch failure")
    assert report["after"] == CLEAN


def test_load_unload_loop_leaves_nothing():
    report, _ = run("load_unload_loop", 1000)
    print(f"1,000 load + forward + drop cycles on the stand-in driver: RSS "
          f"{report['rss_before_kib']} -> {report['rss_after_kib']} KiB")
    assert report["after"] == CLEAN
    assert report["launches"] >= 1000
    # Each cycle allocates and frees a layer, its module, its workspace and
    # its tensor maps: a leak of any of them a cycle (a kilobyte) shows.
    assert report["rss_after_kib"] - report["rss_before_kib"] < 512, report


def test_cubins_given_and_ptx_compiled():
    """A layer's module from a given cubin or from the PTX (through the
    driver's JIT); artifacts carrying a cubin (saved, read back, loaded
    from it)."""
    report, _ = run("cubin_loads", 1)
    assert report["problems"] == [], report["problems"]
    before, (source, detail) = report["first"]
    assert before == ["none", ""]
    assert source == "ptx" and report["jits"] == 1
    assert detail.startswith("the PTX, compiled by the driver (or taken from its JIT cache) "
                             "in ") and detail.endswith(" s"), detail
    assert report["given"][0] == "cubin" and report["given"][1].startswith("the given cubin (")
    assert report["alone"][0] == "cubin"
    source, detail = report["other_chip"]
    assert source == "ptx"
    assert ("the given cubin was refused by the driver: no kernel image is available for "
            "execution on the device") in detail
    if isinstance(report["ptxas"], list):
        # ptxas's cubin passes the runtime's ELF check; the stand-in cannot
        # run it and says so, as a driver of another chip would.
        magic, (source, detail) = report["ptxas"]
        assert magic == "\x7fELF" and source == "ptx"
        assert "the given cubin was refused by the driver: device kernel image is invalid" \
            in detail
    errors = report["errors"]
    assert errors[0] == "MokRuntimeError: cubin_size: is 0, but a cubin is given"
    assert errors[1] == "TypeError: cubin: expected bytes (a cubin) or None, got str"
    assert errors[2] == "TypeError: ptx: expected a str, got NoneType"
    assert errors[3].startswith("MokRuntimeError: loading the cubin failed: no kernel image")
    same, files, source = report["artifact"]
    assert same and source == "cubin"
    assert files == ["moe_layer.cubin", "moe_layer.cubin.json", "moe_layer.json",
                     "moe_layer.ptx"]
    assert report["after"] == CLEAN


def test_a_cubin_linked_from_relocatable_code_is_not_used_beside_its_ptx():
    """The runtime's check of a given cubin against its PTX, on cubins the
    CUDA toolkit makes: the dynamic shared memory of a cubin linked from
    relocatable code does not start on the 1024-byte boundary the PTX
    declares, so the PTX is loaded instead, and the detail says why."""
    try:
        driver_scenarios.toolkit()
    except FileNotFoundError as e:
        pytest.skip(f"needs ptxas and nvlink (the CUDA toolkit): {e}")
    report, _ = run("toolkit_cubins", 1)
    source, detail, images = report["linked"]
    assert source == "ptx" and images == 0, detail
    assert ("the given cubin was not used: kernel k's dynamic shared memory would start "
            "at byte ") in detail
    assert detail.endswith(", not on the 1024-byte boundary its PTX declares (a cubin "
                           "linked from relocatable code?)"), detail
    # The whole-program cubin passes the check and reaches the driver.
    source, detail, images = report["whole"]
    assert source == "ptx" and images == 1, detail
    assert "the given cubin was refused by the driver: device kernel image is invalid" \
        in detail
    assert report["after"] == CLEAN
