# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""Rows of the GPU summary table, filled by the tests, printed by conftest."""
RESULTS = []
# Rows of the backward table: one per case and gradient.
BACKWARD_RESULTS = []
