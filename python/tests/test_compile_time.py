# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""bench.compile_time on a test-sized layer: a cold and a cached compile,
each in fresh processes, the breakdown of the cold one, the table and the
JSON; its argument checks."""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")


def run(*args):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [os.path.abspath(ROOT)] + sys.path))
    return subprocess.run([sys.executable, "-m", "bench.compile_time", *args],
                          capture_output=True, text=True, cwd=ROOT, env=env)


def test_compile_time_measures_a_tiny_layer(tmp_path):
    pytest.importorskip("mok._mok")
    out = tmp_path / "ct.json"
    proc = run("tiny", "--targets", "sm_100a", "--forms", "forward", "training",
               "--runs", "1", "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    table = proc.stdout
    assert "tiny         sm_100a  forward" in table and "training" in table
    assert "cold compile by part" in table and "load average" in table
    report = json.loads(out.read_text())
    meta = report["meta"]
    assert meta["runs"] == 1 and len(meta["loadavg_before"]) == 3 and meta["cpus"] >= 1
    forward, training = report["results"]
    assert (forward["form"], training["form"]) == ("forward", "training")
    for r in (forward, training):
        assert r["shape"] == "tiny" and r["target"] == "sm_100a"
        assert 0 < r["cached_in_process_s"] < r["cold_s"]
        assert 0 < r["cached_new_process_s"] < r["cold_s"]
        parts = r["breakdown_s"]
        for part in ("parse", "mk", "gpu", "llvm", "ptx", "ptx.optimize", "ptx.codegen",
                     "print", "python"):
            assert part in parts
        steps = sum(parts[p] for p in ("parse", "training", "mk", "gpu", "llvm", "ptx",
                                       "print", "python") if p in parts)
        assert steps == pytest.approx(r["breakdown_run_cold_s"], rel=1e-6)
        assert r["cold_runs_s"] == [r["cold_s"]]
    assert "training" in training["breakdown_s"] and "training" not in forward["breakdown_s"]


def test_compile_time_refuses_bad_arguments():
    proc = run("no-such-shape")
    assert proc.returncode == 2 and "SHAPE: unknown shape(s) no-such-shape" in proc.stderr
    proc = run("tiny", "--runs", "0")
    assert proc.returncode == 2 and "--runs: expected at least 1, got 0" in proc.stderr
