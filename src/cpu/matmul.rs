//! CPU twin of `shaders/matmul.wgsl`, on the `gemm` crate (BLIS-style
//! packed kernels, AVX2/AVX-512/NEON, threads through rayon), which takes
//! any row and column strides, so operands laid out as attention heads in
//! token-major rows need no copy.

mod few_rows;

use crate::backend::Matmul;
use few_rows::{Isa, Product};
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
/// transposed B of a layer's size (a tied output layer, a layer's input
/// gradient). With B as stored, a few rows are faster on `gemm`.
fn takes_few_rows(s: &Matmul) -> bool {
    s.m == 1 || (s.trans_b && s.m <= few_rows::MAX_ROWS && s.n * s.k >= 1 << 16)
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
    if let Some(isa) = Isa::detected()
        && !s.trans_a
        && takes_few_rows(s)
    {
        let product = Product {
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
