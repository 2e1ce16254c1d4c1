//! CPU twin of `shaders/matmul.wgsl`, on the `gemm` crate (BLIS-style
//! packed kernels, AVX2/AVX-512/NEON, threads through rayon).

use crate::backend::Matmul;
use gemm::Parallelism;
use rayon::prelude::*;

/// Below this many multiply-adds a product runs on one thread.
const PARALLEL_MIN_MACS: usize = 1 << 18;

pub fn matmul(a: &[f32], b: &[f32], c: &mut [f32], s: &Matmul) {
    let (len_a, len_b, len_c) = s.required_lens();
    assert!(
        a.len() >= len_a && b.len() >= len_b && c.len() >= len_c,
        "matmul: operands too short for {s:?}"
    );
    if s.batch == 0 || s.m == 0 || s.n == 0 {
        return;
    }
    let macs = s.m * s.n * s.k;
    let c = &mut c[..len_c];
    if s.batch > 1 && macs < PARALLEL_MIN_MACS {
        // Many small products (attention heads): one thread each.
        assert!(s.stride_c >= s.m * s.n, "matmul: batch items of C overlap");
        c.par_chunks_mut(s.stride_c)
            .enumerate()
            .for_each(|(i, ci)| {
                product(
                    &a[i * s.stride_a..],
                    &b[i * s.stride_b..],
                    ci,
                    s,
                    Parallelism::None,
                )
            });
    } else {
        let par = if macs >= PARALLEL_MIN_MACS {
            Parallelism::Rayon(rayon::current_num_threads())
        } else {
            Parallelism::None
        };
        for i in 0..s.batch {
            product(
                &a[i * s.stride_a..],
                &b[i * s.stride_b..],
                &mut c[i * s.stride_c..],
                s,
                par,
            );
        }
    }
}

/// One product, C = alpha * op(A) op(B) (+ C).
fn product(a: &[f32], b: &[f32], c: &mut [f32], s: &Matmul, par: Parallelism) {
    let (m, n, k) = (s.m, s.n, s.k);
    assert!(a.len() >= m * k && b.len() >= k * n && c.len() >= m * n);
    // (row stride, column stride) of op(A) and op(B) in their storage.
    let (a_rs, a_cs) = if s.trans_a { (1, m) } else { (k, 1) };
    let (b_rs, b_cs) = if s.trans_b { (1, k) } else { (n, 1) };
    if k == 0 {
        if !s.accumulate {
            c[..m * n].fill(0.0);
        }
        return;
    }
    // SAFETY: the asserts above keep every index the strides reach in bounds;
    // gemm computes dst = alpha_dst * dst + beta * lhs * rhs.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            c.as_mut_ptr(),
            1,
            n as isize,
            s.accumulate,
            a.as_ptr(),
            a_cs as isize,
            a_rs as isize,
            b.as_ptr(),
            b_cs as isize,
            b_rs as isize,
            1.0,
            s.alpha,
            false,
            false,
            false,
            par,
        );
    }
}
