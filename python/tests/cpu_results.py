# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""State shared by the CPU tests and their summary (not in conftest.py: the
GPU tests have a conftest of their own, and both would be "conftest")."""
import os
import zlib

# Fresh random inputs every run; MOK_TEST_SEED=<n> repeats a run (the seed is
# printed at the end).
SEED = int(os.environ.get("MOK_TEST_SEED", int.from_bytes(os.urandom(4), "little")))


def seed_for(name):
    """A per-test seed derived from the run's seed (stable across processes,
    unlike hash())."""
    return (SEED + zlib.crc32(name.encode())) % 2**32


# (case, quantity, relative error, max abs error) of every comparison against
# the float64 reference, printed at the end of the run.
MEASURED = []
