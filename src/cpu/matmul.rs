//! CPU twin of `shaders/matmul.wgsl`, on the `gemm` crate (BLIS-style
//! packed kernels, AVX2/AVX-512/NEON, threads through rayon), which takes
//! any row and column strides, so operands laid out as attention heads in
//! token-major rows need no copy.

#[cfg(target_arch = "x86_64")]
mod few_rows;

use crate::backend::Matmul;
use gemm::Parallelism;
use rayon::prelude::*;

/// Below this many multiply-adds a product runs on one thread.
const PARALLEL_MIN_MACS: usize = 1 << 18;

/// C's base pointer, shared by the threads that write its batch items
/// (`Matmul::check` has shown that no two items share an element).
#[derive(Clone, Copy)]
struct SharedC(*mut f32);
// SAFETY: each thread writes only its own item's elements.
unsafe impl Send for SharedC {}
unsafe impl Sync for SharedC {}

pub fn matmul(a: &[f32], b: &[f32], c: &mut [f32], s: &Matmul) {
    s.check((a.len(), b.len(), c.len()));
    if s.batch == 0 || s.m == 0 || s.n == 0 {
        return;
    }
    let macs = s.m * s.n * s.k;
    let out = SharedC(c.as_mut_ptr());
    // SAFETY (both branches): `check` bounds every element an item's
    // strides reach inside a, b and c, and keeps C's items apart.
    let item = |i: usize, par: Parallelism| unsafe {
        product(
            a.as_ptr().add(s.a.start(i, s.heads)),
            b.as_ptr().add(s.b.start(i, s.heads)),
            { out }.0.add(s.c.start(i, s.heads)),
            s,
            par,
        )
    };
    if s.batch > 1 && macs < PARALLEL_MIN_MACS {
        // Many small products (attention heads): one thread each.
        (0..s.batch)
            .into_par_iter()
            .for_each(|i| item(i, Parallelism::None));
    } else {
        let par = if macs >= PARALLEL_MIN_MACS {
            Parallelism::Rayon(rayon::current_num_threads())
        } else {
            Parallelism::None
        };
        for i in 0..s.batch {
            item(i, par);
        }
    }
}

/// Whether a product goes to [`few_rows`]: a single row of A (a head's
/// query or weights against its keys and values), or a few rows against a
/// transposed B of a layer's size (a tied output layer, an LSTM's
/// recurrent product, a layer's input gradient). With B as stored, a few
/// rows are faster on `gemm`.
#[cfg(target_arch = "x86_64")]
fn takes_few_rows(s: &Matmul) -> bool {
    !s.trans_a
        && (s.m == 1
            || (s.trans_b && s.m <= few_rows::MAX_ROWS && s.n * s.k >= few_rows::MIN_B_ELEMENTS))
}

/// One product, C = alpha * op(A) op(B) (+ C), at the given item starts.
///
/// # Safety
/// Every element the shape's row strides reach from `a`, `b` and `c` is
/// in bounds, and no other thread touches the elements of C reached.
unsafe fn product(a: *const f32, b: *const f32, c: *mut f32, s: &Matmul, par: Parallelism) {
    let (m, n, k) = (s.m, s.n, s.k);
    let [lda, ldb, ldc] = s.row_strides();
    // (row stride, column stride) of op(A) and op(B) in their storage.
    let (a_rs, a_cs) = if s.trans_a { (1, lda) } else { (lda, 1) };
    let (b_rs, b_cs) = if s.trans_b { (1, ldb) } else { (ldb, 1) };
    if k == 0 {
        if !s.accumulate {
            for r in 0..m {
                unsafe { std::slice::from_raw_parts_mut(c.add(r * ldc), n) }.fill(0.0);
            }
        }
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if let Some(isa) = few_rows::Isa::detected()
        && takes_few_rows(s)
    {
        let product = few_rows::Product {
            m,
            n,
            k,
            a,
            lda,
            b,
            ldb,
            trans_b: s.trans_b,
            c,
            ldc,
            alpha: s.alpha,
            accumulate: s.accumulate,
            parallel: matches!(par, Parallelism::Rayon(_)),
        };
        // SAFETY: `isa` was detected on this CPU; the caller's promises.
        return unsafe { few_rows::run(isa, &product) };
    }
    // gemm computes dst = alpha_dst * dst + beta * lhs * rhs.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            c,
            1,
            ldc as isize,
            s.accumulate,
            a,
            a_cs as isize,
            a_rs as isize,
            b,
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

#[cfg(test)]
mod tests {
    use super::matmul;
    use crate::backend::{Matmul, Operand};
    use rand::{Rng, SeedableRng};

    /// C of `s` in float64 from its own description: each item's start,
    /// each operand's row stride, transposes, alpha and accumulation.
    fn reference(a: &[f32], b: &[f32], c: &[f32], s: &Matmul) -> Vec<f64> {
        let [lda, ldb, ldc] = s.row_strides();
        let mut out: Vec<f64> = c.iter().map(|&v| v as f64).collect();
        for i in 0..s.batch {
            let (a0, b0, c0) = (
                s.a.start(i, s.heads),
                s.b.start(i, s.heads),
                s.c.start(i, s.heads),
            );
            for r in 0..s.m {
                for j in 0..s.n {
                    let sum: f64 = (0..s.k)
                        .map(|q| {
                            let x = if s.trans_a {
                                a[a0 + q * lda + r]
                            } else {
                                a[a0 + r * lda + q]
                            };
                            let y = if s.trans_b {
                                b[b0 + j * ldb + q]
                            } else {
                                b[b0 + q * ldb + j]
                            };
                            x as f64 * y as f64
                        })
                        .sum();
                    let at = &mut out[c0 + r * ldc + j];
                    *at = s.alpha as f64 * sum + if s.accumulate { *at } else { 0.0 };
                }
            }
        }
        out
    }

    /// The layouts that reach the few-rows kernels on x86-64 (and `gemm`
    /// elsewhere) give the product: decoding's attention over cached image
    /// keys and values (a query per head, read in place in token-major
    /// rows) and an LSTM step's recurrent product (strided rows of A and
    /// C, accumulated, against a transposed weight).
    #[test]
    fn products_with_few_rows_in_their_layouts_are_exact_to_rounding() {
        let (groups, heads, d, tokens) = (3, 4, 20, 37);
        let width = heads * d;
        let head_of = |row_stride: usize, col_offset: usize| Operand {
            offset: col_offset,
            row_stride,
            group_stride: tokens * row_stride,
            head_stride: d,
        };
        let query = Operand {
            group_stride: width,
            ..head_of(width, 0)
        };
        let scores = Matmul::per_head(groups, heads, 1, tokens, d)
            .with_a(query)
            .with_b(head_of(2 * width, 0))
            .trans_b()
            .alpha(0.125);
        let weighted = Matmul::per_head(groups, heads, 1, d, tokens)
            .with_b(head_of(2 * width, width))
            .with_c(query);
        let (rows, hidden, slots) = (6, 160, 3);
        let recurrent = Matmul::new(rows, 4 * hidden, hidden)
            .with_a(Operand {
                offset: hidden,
                row_stride: slots * hidden,
                ..Operand::packed(0)
            })
            .with_c(Operand {
                offset: 8 * hidden,
                row_stride: 12 * hidden,
                ..Operand::packed(0)
            })
            .trans_b()
            .accumulate();
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(11);
        for s in [scores, weighted, recurrent] {
            let (a_len, b_len, c_len) = s.required_lens();
            let mut random = |len: usize| -> Vec<f32> {
                (0..len).map(|_| rng.random_range(-1.0..1.0)).collect()
            };
            let (a, b, mut c) = (random(a_len), random(b_len), random(c_len));
            let want = reference(&a, &b, &c, &s);
            matmul(&a, &b, &mut c, &s);
            for (at, (&got, want)) in c.iter().zip(want).enumerate() {
                assert!(
                    (got as f64 - want).abs() <= 1e-5 * (1.0 + want.abs()),
                    "{s:?}: C[{at}] = {got}, not {want}"
                );
            }
        }
    }
}
