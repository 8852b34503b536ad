# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""No mok._runtime instance outlives the interpreter: nanobind reports the
instances of the extension's types still alive at the exit ("nanobind:
leaked N instances!" on stderr), so a process that creates, checks, binds,
loads (on the stand-in driver), runs and drops layers — and one that keeps
some, and errors holding them, in globals until it exits — must exit
without that line. A process that builds the one cycle the collector
cannot see (leak_scenarios.py "cycle") shows that the line would be there.
On the GPU, gpu/test_gpu_reliability.py runs the same check with real
loads, forwards and training steps."""
import os
import subprocess
import sys

import pytest

import driver_scenarios

HERE = os.path.dirname(os.path.abspath(__file__))


def _run(script, *args, driver=None):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([HERE] + sys.path))
    if driver:
        env["MOK_CUDA_DRIVER"] = driver
    proc = subprocess.run([sys.executable, os.path.join(HERE, script), *args],
                          capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc.stderr


def test_the_leak_report_shows_an_uncollectable_cycle():
    stderr = _run("leak_scenarios.py", "cycle")
    assert "nanobind: leaked" in stderr and 'type "mok._runtime.Layer"' in stderr, stderr


def test_layers_created_checked_and_dropped_leave_nothing():
    stderr = _run("leak_scenarios.py", "api")
    assert "leaked" not in stderr, stderr[-4000:]


@pytest.mark.skipif(bool(driver_scenarios.available()),
                    reason=driver_scenarios.available() or "built")
def test_loaded_layers_leave_nothing():
    stderr = _run("driver_scenarios.py", "leaks", "1", "50", driver=driver_scenarios.FAKE)
    assert "leaked" not in stderr, stderr[-4000:]
