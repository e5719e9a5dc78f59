//! The coefficient tables of every exponential in the kernels, and the portable one.
//!
//! Two polynomials for `2^f` serve them all:
//! - Cephes' `exp2f` (<https://netlib.org/cephes/>, `exp2f.c`: peak relative error 1.7e-7 on
//!   `[−½, ½]`), after `x·log₂e = n + f` with `n` the nearest integer: the portable
//!   [`exp_approx`], and `exp` of AVX2 and AVX-512 (`avx2::exp`, `avx512::exp`);
//! - minimax fits on `[0, 1)` after `n = ⌊t⌋` (AVX-512's `VREDUCEPS`), of degree 4 for weights
//!   that end up in bf16 and 5 for f32 ones: `avx512::exp2`.

/// `log₂e` as the nearest f32 and what that misses (Cody and Waite): `x·log₂e` in two pieces
/// keeps the rounding of `x·log₂e` out of `f`.
pub(crate) const LOG2_E_HI: f32 = std::f32::consts::LOG2_E;
pub(crate) const LOG2_E_LO: f32 =
    (std::f64::consts::LOG2_E - std::f32::consts::LOG2_E as f64) as f32;

/// Cephes' `exp2f` polynomial, highest power first: `2^f ≈ 1 + f·P(f)` on `[−½, ½]`.
pub(crate) const CEPHES_EXP2: [f32; 6] = [
    1.535_336_2e-4,
    1.339_887_4e-3,
    9.618_437e-3,
    5.550_332_5e-2,
    2.402_264_8e-1,
    6.931_472e-1,
];

/// The coefficients `c₁, c₂, …` of `2^f ≈ 1 + f·(c₁ + f·(c₂ + …))` on `[0, 1)`, highest degree
/// first: minimax in relative error with the constant fixed at 1. Degree 4 (Remez exchange):
/// 2.90e-6, 2.95e-6 with the f32 coefficients and f32 fused multiply-adds; enough for weights
/// that end up in bf16 (8 significant bits).
pub(crate) const EXP2_DEGREE_4: [f32; 4] =
    [1.342_668_4e-2, 5.224_247_3e-2, 2.412_802e-1, 6.930_448_4e-1];

/// Degree 5 (Lawson's iteration): 1.7e-7 in f32, for f32 weights.
pub(crate) const EXP2_DEGREE_5: [f32; 5] = [
    1.867_130_3e-3,
    9.017_03e-3,
    5.579_991_3e-2,
    2.401_644_4e-1,
    6.931_513e-1,
];

/// `e^x` without a branch or a call, so loops over it vectorise: `e^x = 2^n · 2^f` with
/// `x·log₂e = n + f`, `|f| ≤ ½`, `2^f` from [`CEPHES_EXP2`], `2^n` built in the exponent bits.
/// Below `2^-126` (and for `−∞`) it returns 0.
#[inline(always)]
pub(crate) fn exp_approx(x: f32) -> f32 {
    // 1.5·2²³: adding it rounds to an integer, which then sits in the low mantissa bits.
    const ROUND: f32 = 12_582_912.0;
    let t = x * std::f32::consts::LOG2_E;
    let underflow = t < -126.0;
    let t = if underflow { -126.0 } else { t.min(127.0) };
    let big = t + ROUND;
    let n = big - ROUND;
    let f = t - n;
    let mut p = CEPHES_EXP2[0];
    for &c in &CEPHES_EXP2[1..] {
        p = p * f + c;
    }
    let p = p * f + 1.0;
    let n_int = big.to_bits().wrapping_sub(ROUND.to_bits());
    let pow2 = f32::from_bits(n_int.wrapping_add(127) << 23);
    if underflow { 0.0 } else { p * pow2 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_approx_matches_exp() {
        // The polynomial's own error is 1.7e-7 relative, rounding adds a few ulps, and
        // rounding t = x·log₂e to f32 moves 2^t by up to |t|·2⁻²⁴·ln 2 < 1e-7·|x| relative
        // (large |x| only arise for probabilities far below any that matter).
        for i in -2000..=200 {
            let x = i as f32 * 0.05;
            let (got, want) = (exp_approx(x), x.exp());
            // Below 2^-126 the result may flush to 0.
            let tol = (4e-7 + 1e-7 * x.abs()) * want + f32::MIN_POSITIVE;
            assert!((got - want).abs() <= tol, "e^{x}: got {got}, want {want}");
        }
        assert_eq!(exp_approx(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp_approx(-100.0), 0.0);
    }
}
