# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""The float64 reference's backward agrees with finite differences of its
forward, so it can judge mok's gradients."""
import numpy as np
import pytest

import reference


def _problem(rng, limit, shared):
    T, H, I, E, k = 5, 6, 4, 3, 2
    p = dict(x=rng.standard_normal((T, H)),
             top=np.array([[0, 2], [1, -1], [2, 2], [1, 0], [-1, 1]]),
             rw=rng.random((T, k)),
             wg=rng.standard_normal((E, I, H)) * 0.5,
             wu=rng.standard_normal((E, I, H)) * 0.5,
             wd=rng.standard_normal((E, H, I)) * 0.5)
    if shared:
        p["shared"] = [rng.standard_normal((3, H)) * 0.5, rng.standard_normal((3, H)) * 0.5,
                       rng.standard_normal((H, 3)) * 0.5]
    return p, rng.standard_normal((T, H))


@pytest.mark.parametrize("limit", [None, 0.7])
@pytest.mark.parametrize("shared", [False, True])
def test_backward_matches_finite_differences(limit, shared, monkeypatch):
    monkeypatch.setattr(reference, "BF16_GATE_UP", False)
    rng = np.random.default_rng(1234)
    p, d_out = _problem(rng, limit, shared)

    def loss(q):
        return float(np.sum(d_out * reference.forward(
            q["x"], q["top"], q["rw"], q["wg"], q["wu"], q["wd"],
            q.get("shared"), limit)))

    grads = reference.backward(p["x"], p["top"], p["rw"], p["wg"], p["wu"], p["wd"],
                               d_out, p.get("shared"), limit)
    names = {"x": "x", "rw": "router_weights", "wg": "gate_weights",
             "wu": "up_weights", "wd": "down_weights"}
    eps = 1e-6
    for key, name in names.items():
        v = rng.standard_normal(p[key].shape)
        plus = {**p, key: p[key] + eps * v}
        minus = {**p, key: p[key] - eps * v}
        numeric = (loss(plus) - loss(minus)) / (2 * eps)
        analytic = float(np.sum(grads[name] * v))
        assert numeric == pytest.approx(analytic, rel=1e-6, abs=1e-8), name
    if shared:
        for i, name in enumerate(["shared_gate_weights", "shared_up_weights",
                                  "shared_down_weights"]):
            v = rng.standard_normal(p["shared"][i].shape)
            plus, minus = [list(p["shared"]) for _ in range(2)]
            plus[i] = plus[i] + eps * v
            minus[i] = minus[i] - eps * v
            numeric = (loss({**p, "shared": plus}) - loss({**p, "shared": minus})) / (2 * eps)
            analytic = float(np.sum(grads[name] * v))
            assert numeric == pytest.approx(analytic, rel=1e-6, abs=1e-8), name


def test_clamp_is_active_in_the_limited_problem():
    # The limit=0.7 case above only checks the clamp's masks if some
    # pre-activations exceed it.
    rng = np.random.default_rng(1234)
    p, _ = _problem(rng, 0.7, False)
    g = np.einsum("eih,th->tei", p["wg"], p["x"])
    u = np.einsum("eih,th->tei", p["wu"], p["x"])
    assert (g > 0.7).any() and (np.abs(u) > 0.7).any()
