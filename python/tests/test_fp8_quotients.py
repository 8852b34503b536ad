# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""The GPU quantizers' quotient sequence (lib/Conversion/MKToGPU/Quantize.cpp,
quotientOf) in exact rational arithmetic: for a block scale s >= 2^-90,
q = RN(|x| RN(1/s)) and two steps q = RN(q + RN(|x| - q s) RN(1/s)) (each
a fused multiply-add, rounded once) must be RN(x / s), the IEEE quotient
that "fp8"'s definition rounds to E4M3. Each f32 operation is modelled as
the exact result rounded to nearest even, so the test is the arithmetic's,
not a float64 approximation's. convert-mk-to-gpu-fp8.mlir checks that the
kernels emit this sequence."""
import math
import random
from fractions import Fraction

import numpy as np

E4M3 = [0.0] + [m * 2.0 ** e for e in range(-6, 9) for m in (1, 1.125, 1.25, 1.375, 1.5,
                                                               1.625, 1.75, 1.875)]


def rn32(x):
    """The f32 nearest to the rational x (ties to even), subnormals kept."""
    if x == 0:
        return 0.0
    sign, x = (-1, -x) if x < 0 else (1, x)
    e = x.numerator.bit_length() - x.denominator.bit_length()
    if Fraction(2) ** e > x:
        e -= 1
    e = max(e, -126)
    ulp = Fraction(2) ** (e - 23)
    m = x / ulp
    n, rem = divmod(m.numerator, m.denominator)
    if 2 * rem > m.denominator or (2 * rem == m.denominator and n % 2):
        n += 1
    return sign * float(n * ulp)


def f32(v):
    return float(np.float32(v))


def quotient(x, s, steps=2):
    """The kernels' sequence: |x| / s from y = RN(1 / s), x's sign."""
    a, y = abs(Fraction(x)), Fraction(rn32(1 / Fraction(s)))
    q = Fraction(rn32(a * y))
    for _ in range(steps):
        r = Fraction(rn32(a - q * Fraction(s)))  # fma(-q, s, a)
        q = Fraction(rn32(r * y + q))            # fma(r, y, q)
    return math.copysign(float(q), x)  # x's sign bit


def cases(count, seed):
    """(x, s) pairs as the quantizers meet them: s = RN(amax / 448), |x| <=
    amax; a third of them with x s-multiples of E4M3 midpoints nudged by an
    ulp (where a one-ulp error changes the code), and scales down to
    2^-90."""
    rng = random.Random(seed)
    for i in range(count):
        amax = f32(rng.uniform(1, 2) * 2.0 ** rng.randint(-78, 120))
        s = rn32(Fraction(amax) / 448)
        if i % 3 == 0:
            lo = rng.randrange(1, len(E4M3) - 1)
            mid = (E4M3[lo] + E4M3[lo + 1]) / 2
            x = np.float32(rn32(Fraction(mid) * Fraction(s)))
            x = float(np.nextafter(x, np.float32(np.inf if rng.random() < 0.5 else 0)))
        else:
            x = f32(amax * rng.random())
        if s >= 2.0 ** -90 and abs(x) <= amax:
            yield (x if rng.random() < 0.5 else -x), s


def test_the_sequence_is_the_ieee_quotient():
    checked = 0
    for x, s in cases(3000, 31):
        want = rn32(Fraction(x) / Fraction(s))
        assert quotient(x, s) == want, (x, s)
        checked += 1
    assert checked > 2500


def test_one_product_is_not_enough():
    """Without the Newton steps the product misses the quotient often: the
    cases above can tell."""
    misses = sum(quotient(x, s, steps=0) != rn32(Fraction(x) / Fraction(s))
                 for x, s in cases(600, 5))
    assert misses > 50


def test_signs_and_zeros():
    s = rn32(Fraction(3) / 448)
    assert quotient(-0.0, s) == 0.0 and math.copysign(1, quotient(-0.0, s)) == -1
    assert quotient(0.0, s) == 0.0 and math.copysign(1, quotient(0.0, s)) == 1
    assert quotient(3.0, s) == rn32(3 / Fraction(s))
    assert quotient(-3.0, s) == -rn32(3 / Fraction(s))


def test_tiny_scales_need_the_division():
    """Where s is subnormal the residuals underflow and the sequence misses
    the quotient (the kernels divide for s < 2^-90)."""
    rng = random.Random(3)
    misses = 0
    for _ in range(300):
        s = rn32(Fraction(f32(rng.uniform(1, 2) * 2.0 ** rng.randint(-140, -127))) / 448)
        lo = rng.randrange(1, len(E4M3) - 1)
        x = float(np.nextafter(np.float32(rn32(Fraction((E4M3[lo] + E4M3[lo + 1]) / 2)
                                               * Fraction(s))), np.float32(np.inf)))
        misses += quotient(x, s) != rn32(Fraction(x) / Fraction(s))
    assert misses > 10
