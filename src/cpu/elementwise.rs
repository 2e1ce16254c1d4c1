//! CPU twins of `shaders/elementwise.wgsl`.

use rayon::prelude::*;

const GELU_S: f32 = 0.797_884_6; // sqrt(2 / pi)

/// e^x for GELU, tanh, softmax and attention: Cephes' single-precision
/// polynomial after range reduction, written without calls or branches so
/// that a loop of it vectorises (glibc's expf is one call per element, and GELU dominated a
/// CPU training step). Within a few ulp of exp for |x| < 87.
#[inline(always)]
pub(super) fn exp(x: f32) -> f32 {
    // Adding 1.5 * 2^23 rounds to the nearest integer.
    const ROUND: f32 = 12_582_912.0;
    let x = x.clamp(-87.0, 87.0);
    // t = 1.5 * 2^23 + n, so t's low bits hold the integer n.
    let t = x * std::f32::consts::LOG2_E + ROUND;
    let n = t - ROUND;
    // x - n ln 2, with ln 2 in two parts.
    let r = x - n * 0.693_359_4 - n * -2.121_944_4e-4;
    let p = ((((1.987_569_2e-4 * r + 1.398_199_9e-3) * r + 8.333_452e-3) * r + 4.166_579_6e-2) * r
        + 0.166_666_65)
        * r
        + 0.5;
    let e = p * (r * r) + r + 1.0;
    // 2^n built from t's bits: `n as i32` would saturate lane by lane
    // and keep the loop from vectorising.
    let biased = t.to_bits().wrapping_sub(ROUND.to_bits()).wrapping_add(127);
    e * f32::from_bits(biased << 23)
}

/// tanh from one `exp`: 1 - 2 / (e^{2u} + 1), exact at both tails, within
/// 1e-7 of tanh near 0.
#[inline(always)]
pub(super) fn tanh(u: f32) -> f32 {
    1.0 - 2.0 / (exp(2.0 * u) + 1.0)
}

/// Elements per parallel task of the transcendental kernels.
const CHUNK: usize = 1 << 14;

#[inline(always)]
fn gelu_run(x: &[f32], y: &mut [f32]) {
    for (yi, &v) in y.iter_mut().zip(x) {
        *yi = 0.5 * v * (1.0 + tanh(GELU_S * (v + 0.044715 * v * v * v)));
    }
}

#[inline(always)]
fn gelu_backward_run(x: &[f32], dy: &[f32], dx: &mut [f32], accumulate: bool) {
    for ((d, &v), &g) in dx.iter_mut().zip(x).zip(dy) {
        let t = tanh(GELU_S * (v + 0.044715 * v * v * v));
        let du = GELU_S * (1.0 + 3.0 * 0.044715 * v * v);
        let grad = g * (0.5 * (1.0 + t) + 0.5 * v * (1.0 - t * t) * du);
        *d = if accumulate { *d + grad } else { grad };
    }
}

/// Calls the loop `$run`'s AVX2 build where the CPU has AVX2, else the
/// loop as compiled for the baseline.
macro_rules! with_avx2 {
    ($run:ident($($arg:expr),*)) => {{
        #[cfg(target_arch = "x86_64")]
        if avx2::available() {
            // SAFETY: the CPU has AVX2, checked just above.
            return unsafe { avx2::$run($($arg),*) };
        }
        $run($($arg),*)
    }};
}

/// The same loops compiled for AVX2 (8 lanes), chosen at run time.
#[cfg(target_arch = "x86_64")]
mod avx2 {
    #[target_feature(enable = "avx2")]
    pub(super) fn gelu_run(x: &[f32], y: &mut [f32]) {
        super::gelu_run(x, y)
    }

    #[target_feature(enable = "avx2")]
    pub(super) fn gelu_backward_run(x: &[f32], dy: &[f32], dx: &mut [f32], accumulate: bool) {
        super::gelu_backward_run(x, dy, dx, accumulate)
    }

    #[target_feature(enable = "avx2")]
    pub(super) fn quick_gelu_run(x: &[f32], y: &mut [f32]) {
        super::quick_gelu_run(x, y)
    }

    #[target_feature(enable = "avx2")]
    pub(super) fn quick_gelu_backward_run(x: &[f32], dy: &[f32], dx: &mut [f32]) {
        super::quick_gelu_backward_run(x, dy, dx)
    }

    #[target_feature(enable = "avx2")]
    pub(super) fn exp_shifted_run(shift: f32, x: &mut [f32]) {
        super::exp_shifted_run(shift, x)
    }

    #[target_feature(enable = "avx2")]
    pub(super) fn tanh_run(x: &[f32], y: &mut [f32]) {
        super::tanh_run(x, y)
    }

    #[target_feature(enable = "avx2")]
    pub(super) fn tanh_backward_run(x: &[f32], dy: &[f32], dx: &mut [f32]) {
        super::tanh_backward_run(x, dy, dx)
    }

    pub(super) fn available() -> bool {
        std::arch::is_x86_feature_detected!("avx2")
    }
}

#[inline(always)]
fn exp_shifted_run(shift: f32, x: &mut [f32]) {
    for v in x {
        *v = exp(*v - shift);
    }
}

/// x = e^(x - shift) in place, vectorised (attention's weights from their
/// scores and log-sum-exp).
pub(super) fn exp_shifted(shift: f32, x: &mut [f32]) {
    with_avx2!(exp_shifted_run(shift, x))
}

pub fn gelu(x: &[f32], y: &mut [f32]) {
    y.par_chunks_mut(CHUNK)
        .zip(x.par_chunks(CHUNK))
        .for_each(|(y, x)| with_avx2!(gelu_run(x, y)));
}

pub fn gelu_backward(x: &[f32], dy: &[f32], dx: &mut [f32], accumulate: bool) {
    dx.par_chunks_mut(CHUNK)
        .zip(x.par_chunks(CHUNK).zip(dy.par_chunks(CHUNK)))
        .for_each(|(dx, (x, dy))| with_avx2!(gelu_backward_run(x, dy, dx, accumulate)));
}

/// y = tanh(x) (ClipCap's mapper, additive attention's scores), with
/// the vectorisable `tanh`: libm's took a third of a top-down LSTM's step.
pub fn tanh_forward(x: &[f32], y: &mut [f32]) {
    y.par_chunks_mut(CHUNK)
        .zip(x.par_chunks(CHUNK))
        .for_each(|(y, x)| with_avx2!(tanh_run(x, y)));
}

/// dx = dy * (1 - tanh(x)^2).
pub fn tanh_backward(x: &[f32], dy: &[f32], dx: &mut [f32]) {
    dx.par_chunks_mut(CHUNK)
        .zip(x.par_chunks(CHUNK).zip(dy.par_chunks(CHUNK)))
        .for_each(|(dx, (x, dy))| with_avx2!(tanh_backward_run(x, dy, dx)));
}

#[inline(always)]
fn tanh_run(x: &[f32], y: &mut [f32]) {
    for (y, &v) in y.iter_mut().zip(x) {
        *y = tanh(v);
    }
}

#[inline(always)]
fn tanh_backward_run(x: &[f32], dy: &[f32], dx: &mut [f32]) {
    for ((d, &v), &g) in dx.iter_mut().zip(x).zip(dy) {
        let t = tanh(v);
        *d = g * (1.0 - t * t);
    }
}

#[inline(always)]
fn quick_gelu_run(x: &[f32], y: &mut [f32]) {
    for (yi, &v) in y.iter_mut().zip(x) {
        *yi = v / (1.0 + exp(-1.702 * v));
    }
}

#[inline(always)]
fn quick_gelu_backward_run(x: &[f32], dy: &[f32], dx: &mut [f32]) {
    for ((d, &v), &g) in dx.iter_mut().zip(x).zip(dy) {
        let s = 1.0 / (1.0 + exp(-1.702 * v));
        *d = g * (s + 1.702 * v * s * (1.0 - s));
    }
}

/// y = x sigmoid(1.702 x) (CLIP's quick GELU), with the vectorising `exp`.
pub fn quick_gelu_forward(x: &[f32], y: &mut [f32]) {
    y.par_chunks_mut(CHUNK)
        .zip(x.par_chunks(CHUNK))
        .for_each(|(y, x)| with_avx2!(quick_gelu_run(x, y)));
}

/// dx = dy * (s + 1.702 x s (1 - s)), s = sigmoid(1.702 x).
pub fn quick_gelu_backward(x: &[f32], dy: &[f32], dx: &mut [f32]) {
    dx.par_chunks_mut(CHUNK)
        .zip(x.par_chunks(CHUNK).zip(dy.par_chunks(CHUNK)))
        .for_each(|(dx, (x, dy))| with_avx2!(quick_gelu_backward_run(x, dy, dx)));
}

/// Phi(x), the standard normal CDF, as 0.5 erfc(-x / sqrt 2) with erfc
/// from Abramowitz and Stegun's 7.1.26 (absolute error below 1.5e-7),
/// evaluated on |x| so that both tails keep their precision. The WGSL
/// kernel computes the same expression.
#[inline(always)]
fn normal_cdf(x: f32) -> f32 {
    let z = x.abs() * std::f32::consts::FRAC_1_SQRT_2;
    let t = 1.0 / (1.0 + 0.327_591_1 * z);
    let poly = t
        * (0.254_829_6
            + t * (-0.284_496_74 + t * (1.421_413_8 + t * (-1.453_152 + t * 1.061_405_4))));
    let tail = 0.5 * poly * exp(-z * z);
    if x >= 0.0 { 1.0 - tail } else { tail }
}

/// 1 / sqrt(2 pi), the normal density's scale.
const NORMAL_DENSITY: f32 = 0.398_942_3;

/// y = x Phi(x) (GELU with the exact CDF: CLIP's and BERT's "gelu").
pub fn gelu_erf_forward(x: &[f32], y: &mut [f32]) {
    y.par_iter_mut()
        .zip(x)
        .for_each(|(y, &v)| *y = v * normal_cdf(v));
}

/// dx = dy * (Phi(x) + x phi(x)).
pub fn gelu_erf_backward(x: &[f32], dy: &[f32], dx: &mut [f32]) {
    dx.par_iter_mut()
        .zip(x.par_iter().zip(dy))
        .for_each(|(d, (&v, &g))| {
            *d = g * (normal_cdf(v) + v * NORMAL_DENSITY * exp(-0.5 * v * v));
        });
}

/// y = max(x, 0) (ClipCap's transformer mapper).
pub fn relu_forward(x: &[f32], y: &mut [f32]) {
    y.par_iter_mut().zip(x).for_each(|(y, &v)| *y = v.max(0.0));
}

/// dx = dy where x > 0, else 0.
pub fn relu_backward(x: &[f32], dy: &[f32], dx: &mut [f32]) {
    dx.par_iter_mut()
        .zip(x.par_iter().zip(dy))
        .for_each(|(d, (&v, &g))| *d = if v > 0.0 { g } else { 0.0 });
}

/// d = d * gelu'(x): `gelu_backward` with dy and dx the same buffer, each
/// run of 256 copied aside first.
pub fn gelu_backward_in_place(x: &[f32], d: &mut [f32]) {
    const RUN: usize = 256;
    d.par_chunks_mut(CHUNK)
        .zip(x.par_chunks(CHUNK))
        .for_each(|(d, x)| {
            let mut dy = [0.0f32; RUN];
            for (d, x) in d.chunks_mut(RUN).zip(x.chunks(RUN)) {
                let dy = &mut dy[..d.len()];
                dy.copy_from_slice(d);
                #[cfg(target_arch = "x86_64")]
                if avx2::available() {
                    // SAFETY: the CPU has AVX2, checked just above.
                    unsafe { avx2::gelu_backward_run(x, dy, d, false) };
                    continue;
                }
                gelu_backward_run(x, dy, d, false);
            }
        });
}

pub fn add_bias(y: &mut [f32], bias: &[f32]) {
    for row in y.chunks_mut(bias.len()) {
        for (v, &b) in row.iter_mut().zip(bias) {
            *v += b;
        }
    }
}

pub fn scale_by_exp(log_scale: f32, x: &[f32], y: &mut [f32], accumulate: bool) {
    let scale = log_scale.exp();
    for (yi, &xi) in y.iter_mut().zip(x) {
        *yi = if accumulate {
            *yi + scale * xi
        } else {
            scale * xi
        };
    }
}

#[cfg(test)]
mod exp_tests {
    #[test]
    fn the_polynomial_exp_is_within_a_few_ulp() {
        let mut worst = 0.0f64;
        // Inside the clamp at +-87.
        for i in -86_999..=86_999 {
            let x = i as f32 * 1e-3;
            let want = (x as f64).exp();
            let got = super::exp(x) as f64;
            worst = worst.max(((got - want) / want).abs());
        }
        assert!(worst < 4e-7, "relative error {worst}");
        // tanh saturates without overflow at both tails.
        assert_eq!(super::tanh(1e4), 1.0);
        assert_eq!(super::tanh(-1e4), -1.0);
        assert!((super::tanh(0.5) as f64 - 0.5f64.tanh()).abs() < 1e-7);
    }
}
