//! Products whose A has few rows: decoding's tied output layer (a row per
//! caption), an LSTM step's input gradient (a row per sequence), and
//! attention over cached image keys (a row per head). There every element
//! of B is used a few times only, and the `gemm` crate's packing of B into
//! its own layout at every call costs about as much as the product. These
//! kernels read B where it lies, with the rows ahead prefetched, in one
//! of two forms:
//!
//! - B stored `[n, k]` (op(B) = B^T): dot products of A's rows with B's, a
//!   block of them in registers, 16 lanes of k at a time, the lanes summed
//!   by a fixed tree, then the last k % 16 terms in order.
//! - B stored `[k, n]` (op(B) = B), one row of A only: each row of B,
//!   times A's value at that k, added to C's row held in L1 a chunk at a
//!   time. Every element of C is a fused multiply-add chain over k in
//!   order. (With more rows, `gemm`'s packing of B pays for itself: it
//!   was measured faster.)
//!
//! Sixteen lanes are one AVX-512 register or two AVX2 registers; the
//! arithmetic, and so the bits, are the same either way, and whatever the
//! split over threads. Other CPUs, and the products these forms do not
//! fit, stay with `gemm`.

use rayon::prelude::*;

/// The most rows of A this module takes: beyond them `gemm`'s packing pays
/// for itself.
pub const MAX_ROWS: usize = 64;

/// One product C = alpha * A op(B) (+ C), A's rows contiguous.
#[derive(Clone, Copy)]
pub struct Product {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub a: *const f32,
    pub lda: usize,
    pub b: *const f32,
    pub ldb: usize,
    /// B is stored `[n, k]`.
    pub trans_b: bool,
    pub c: *mut f32,
    pub ldc: usize,
    pub alpha: f32,
    pub accumulate: bool,
    /// Split the product over the thread pool.
    pub parallel: bool,
}

// SAFETY: a product's pointers are only read (a, b) or written at
// elements no other thread writes (c); see `run`.
unsafe impl Send for Product {}
unsafe impl Sync for Product {}

/// Which vector instructions the kernels run on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Isa {
    Avx512,
    Avx2,
}

impl Isa {
    /// The best this CPU has, unless `CAPTUNE_CPU_MATMUL=gemm` asks for
    /// `gemm` everywhere (to compare the two).
    pub fn detected() -> Option<Isa> {
        static ISA: std::sync::OnceLock<Option<Isa>> = std::sync::OnceLock::new();
        *ISA.get_or_init(|| {
            if std::env::var("CAPTUNE_CPU_MATMUL").is_ok_and(|v| v == "gemm") {
                return None;
            }
            Isa::of_this_cpu()
        })
    }

    #[cfg(target_arch = "x86_64")]
    fn of_this_cpu() -> Option<Isa> {
        if std::arch::is_x86_feature_detected!("avx512f") {
            Some(Isa::Avx512)
        } else if std::arch::is_x86_feature_detected!("avx2")
            && std::arch::is_x86_feature_detected!("fma")
        {
            Some(Isa::Avx2)
        } else {
            None
        }
    }

    #[cfg(not(target_arch = "x86_64"))]
    fn of_this_cpu() -> Option<Isa> {
        None
    }

    /// Every ISA this CPU can run.
    #[cfg(test)]
    pub fn available() -> Vec<Isa> {
        [Isa::Avx512, Isa::Avx2]
            .into_iter()
            .filter(|isa| isa.runs_here())
            .collect()
    }

    #[cfg(test)]
    fn runs_here(self) -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            match self {
                Isa::Avx512 => std::arch::is_x86_feature_detected!("avx512f"),
                Isa::Avx2 => {
                    std::arch::is_x86_feature_detected!("avx2")
                        && std::arch::is_x86_feature_detected!("fma")
                }
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        false
    }
}

/// C = alpha * A op(B) (+ C) on `isa`. B stored `[k, n]` (not
/// `trans_b`) takes one row of A only.
///
/// # Safety
/// `isa` runs on this CPU; rows 0..m of A (k elements each, `lda` apart),
/// the n rows of k (or k rows of n) elements of B `ldb` apart, and rows
/// 0..m of C (n elements each, `ldc` apart) are in bounds; C overlaps
/// neither A nor B, and no other thread touches it.
pub unsafe fn run(isa: Isa, p: &Product) {
    assert!(p.trans_b || p.m == 1, "few_rows: B as stored takes one row of A");
    #[cfg(target_arch = "x86_64")]
    // SAFETY: the caller's promises, passed on.
    unsafe {
        match isa {
            Isa::Avx512 => x86::avx512(p),
            Isa::Avx2 => x86::avx2(p),
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    unreachable!("no few-rows kernels for {isa:?} off x86_64 ({p:p})");
}

/// Sixteen f32 lanes and what the kernels do with them.
///
/// Every method is unsafe: it may run only in a function compiled for
/// its ISA (the `#[target_feature]` kernels of `x86`), and `load` and
/// `store` need 16 elements at their pointer.
trait Lanes: Copy {
    unsafe fn zero() -> Self;
    unsafe fn load(p: *const f32) -> Self;
    unsafe fn splat(x: f32) -> Self;
    /// self * b + c, one rounding.
    unsafe fn mul_add(self, b: Self, c: Self) -> Self;
    unsafe fn store(self, p: *mut f32);
    /// The lanes' sum: lane i + lane i + 8, then + 4, + 2, + 1.
    unsafe fn sum(self) -> f32;
}

/// Rows of B fetched ahead of the one being multiplied.
const AHEAD: usize = 8;

#[inline(always)]
fn prefetch(p: *const f32) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch never faults, wherever it points.
    unsafe {
        use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
        _mm_prefetch::<_MM_HINT_T0>(p.cast());
    }
}

/// Fetches the `floats` elements from `p` on (a cache line per 16).
#[inline(always)]
fn prefetch_span(p: *const f32, floats: usize) {
    for line in (0..floats).step_by(16) {
        prefetch(p.wrapping_add(line));
    }
}

/// Runs `part(i)` for i in 0..parts, over the pool for a parallel product.
fn split(p: &Product, parts: usize, part: impl Fn(usize) + Send + Sync) {
    if p.parallel {
        (0..parts)
            .into_par_iter()
            .with_min_len(parts.div_ceil(4 * rayon::current_num_threads()))
            .for_each(part);
    } else {
        (0..parts).for_each(part);
    }
}

/// A chunk's kernel of the [k, n] form (its first column and width),
/// compiled for its ISA.
type ChunkKernel = unsafe fn(&Product, usize, usize);

/// A group's kernel of the [n, k] form, compiled for its ISA.
type GroupKernel = unsafe fn(&Product, usize);

/// Columns of C a task of the [k, n] form keeps (in L1, 4 KiB).
const CHUNK: usize = 1024;

/// The [k, n] form (one row of A) in chunks of at most [`CHUNK`]
/// columns, two a thread at least for a parallel product.
unsafe fn axpy(p: &Product, kernel: ChunkKernel) {
    let fewest = if p.parallel {
        2 * rayon::current_num_threads()
    } else {
        1
    };
    let parts = p.n.div_ceil(CHUNK).max(fewest);
    let width = p.n.div_ceil(parts).next_multiple_of(16).min(CHUNK);
    // SAFETY: the caller's promises, passed on.
    split(p, p.n.div_ceil(width), |i| unsafe {
        kernel(p, i * width, width)
    });
}

/// The [n, k] form with groups of `tc` rows of B.
unsafe fn dot(p: &Product, tc: usize, kernel: GroupKernel) {
    // SAFETY: the caller's promises, passed on.
    split(p, p.n.div_ceil(tc), |g| unsafe { kernel(p, g) });
}

/// The chunk of `width` columns from j of the [k, n] form with one row
/// of A: each row of B's columns there, times A's value at that k, added
/// to the sums, which stay in L1 while B streams past.
#[inline(always)]
unsafe fn axpy_chunk<L: Lanes>(p: &Product, j: usize, width: usize) {
    let cols = width.min(p.n - j);
    let whole = cols / 16 * 16;
    let mut sums = [0.0f32; CHUNK];
    for q in 0..p.k {
        // SAFETY: A's row and B's row q, columns j..j + cols, are in
        // bounds (`run`).
        let (x, row) = unsafe { (*p.a.add(q), p.b.add(q * p.ldb + j)) };
        prefetch_span(row.wrapping_add(AHEAD * p.ldb), cols);
        let xv = unsafe { L::splat(x) };
        for v in (0..whole).step_by(16) {
            let sum = sums[v..].as_mut_ptr();
            unsafe { xv.mul_add(L::load(row.add(v)), L::load(sum)).store(sum) };
        }
        for (v, sum) in sums.iter_mut().enumerate().take(cols).skip(whole) {
            *sum = x.mul_add(unsafe { *row.add(v) }, *sum);
        }
    }
    // SAFETY: C's columns j..j + cols of its one row are this chunk's alone.
    let c = unsafe { std::slice::from_raw_parts_mut(p.c.add(j), cols) };
    write(c, &sums[..cols], p.alpha, p.accumulate);
}

/// Group `group` of the [n, k] form: TR rows of A by TC rows of B a block.
#[inline(always)]
unsafe fn dot_group<L: Lanes, const TR: usize, const TC: usize>(p: &Product, group: usize) {
    let (m, n, k) = (p.m, p.n, p.k);
    let whole = k / 16 * 16;
    let j = group * TC;
    let cols = TC.min(n - j);
    // A row past the last is read as the last: its sums are not stored.
    let a_row = |r: usize| p.a.wrapping_add(r.min(m - 1) * p.lda);
    let b_row = |j: usize| p.b.wrapping_add(j.min(n - 1) * p.ldb);
    let b: [*const f32; TC] = std::array::from_fn(|t| b_row(j + t));
    (0..TC).for_each(|t| prefetch_span(b_row(j + TC + t), k));
    for r in (0..m).step_by(TR) {
        let a: [*const f32; TR] = std::array::from_fn(|t| a_row(r + t));
        let mut acc = [[unsafe { L::zero() }; TC]; TR];
        for q in (0..whole).step_by(16) {
            // SAFETY: every row pointer is a row of A or B, k long.
            let av: [L; TR] = std::array::from_fn(|t| unsafe { L::load(a[t].add(q)) });
            let bv: [L; TC] = std::array::from_fn(|t| unsafe { L::load(b[t].add(q)) });
            for (acc, av) in acc.iter_mut().zip(&av) {
                for (acc, bv) in acc.iter_mut().zip(&bv) {
                    *acc = unsafe { av.mul_add(*bv, *acc) };
                }
            }
        }
        for (t, acc) in acc.iter().enumerate().take(TR.min(m - r)) {
            let mut sums = [0.0f32; TC];
            for (u, (sum, acc)) in sums.iter_mut().zip(acc).enumerate() {
                *sum = unsafe { acc.sum() };
                for q in whole..k {
                    // SAFETY: q < k, inside both rows.
                    *sum = unsafe { (*a[t].add(q)).mul_add(*b[u].add(q), *sum) };
                }
            }
            // SAFETY: C's row and columns are in bounds and this group's
            // alone.
            let c = unsafe { std::slice::from_raw_parts_mut(p.c.add((r + t) * p.ldc + j), cols) };
            write(c, &sums[..cols], p.alpha, p.accumulate);
        }
    }
}

#[inline(always)]
fn write(c: &mut [f32], sums: &[f32], alpha: f32, accumulate: bool) {
    if accumulate {
        c.iter_mut().zip(sums).for_each(|(c, s)| *c += alpha * s);
    } else {
        c.iter_mut().zip(sums).for_each(|(c, s)| *c = alpha * s);
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{Lanes, Product, axpy, axpy_chunk, dot, dot_group};
    use std::arch::x86_64::*;

    #[derive(Clone, Copy)]
    struct Zmm(__m512);

    impl Lanes for Zmm {
        #[inline(always)]
        unsafe fn zero() -> Self {
            unsafe { Zmm(_mm512_setzero_ps()) }
        }
        #[inline(always)]
        unsafe fn load(p: *const f32) -> Self {
            unsafe { Zmm(_mm512_loadu_ps(p)) }
        }
        #[inline(always)]
        unsafe fn splat(x: f32) -> Self {
            unsafe { Zmm(_mm512_set1_ps(x)) }
        }
        #[inline(always)]
        unsafe fn mul_add(self, b: Self, c: Self) -> Self {
            unsafe { Zmm(_mm512_fmadd_ps(self.0, b.0, c.0)) }
        }
        #[inline(always)]
        unsafe fn store(self, p: *mut f32) {
            unsafe { _mm512_storeu_ps(p, self.0) }
        }
        #[inline(always)]
        unsafe fn sum(self) -> f32 {
            unsafe {
                let low = _mm512_castps512_ps256(self.0);
                let high = _mm512_extractf64x4_pd::<1>(_mm512_castps_pd(self.0));
                Ymm2(low, _mm256_castpd_ps(high)).sum()
            }
        }
    }

    /// Sixteen lanes as two AVX2 registers: lanes 0-7, then 8-15.
    #[derive(Clone, Copy)]
    struct Ymm2(__m256, __m256);

    impl Lanes for Ymm2 {
        #[inline(always)]
        unsafe fn zero() -> Self {
            unsafe { Ymm2(_mm256_setzero_ps(), _mm256_setzero_ps()) }
        }
        #[inline(always)]
        unsafe fn load(p: *const f32) -> Self {
            unsafe { Ymm2(_mm256_loadu_ps(p), _mm256_loadu_ps(p.add(8))) }
        }
        #[inline(always)]
        unsafe fn splat(x: f32) -> Self {
            unsafe { Ymm2(_mm256_set1_ps(x), _mm256_set1_ps(x)) }
        }
        #[inline(always)]
        unsafe fn mul_add(self, b: Self, c: Self) -> Self {
            unsafe {
                Ymm2(
                    _mm256_fmadd_ps(self.0, b.0, c.0),
                    _mm256_fmadd_ps(self.1, b.1, c.1),
                )
            }
        }
        #[inline(always)]
        unsafe fn store(self, p: *mut f32) {
            unsafe {
                _mm256_storeu_ps(p, self.0);
                _mm256_storeu_ps(p.add(8), self.1);
            }
        }
        #[inline(always)]
        unsafe fn sum(self) -> f32 {
            unsafe {
                let eight = _mm256_add_ps(self.0, self.1);
                let four = _mm_add_ps(
                    _mm256_castps256_ps128(eight),
                    _mm256_extractf128_ps::<1>(eight),
                );
                let two = _mm_add_ps(four, _mm_movehl_ps(four, four));
                let one = _mm_add_ss(two, _mm_shuffle_ps::<1>(two, two));
                _mm_cvtss_f32(one)
            }
        }
    }

    #[target_feature(enable = "avx512f")]
    unsafe fn axpy_zmm(p: &Product, j: usize, width: usize) {
        unsafe { axpy_chunk::<Zmm>(p, j, width) }
    }

    #[target_feature(enable = "avx512f")]
    unsafe fn dot_zmm<const TR: usize, const TC: usize>(p: &Product, group: usize) {
        unsafe { dot_group::<Zmm, TR, TC>(p, group) }
    }

    #[target_feature(enable = "avx2,fma")]
    unsafe fn axpy_ymm(p: &Product, j: usize, width: usize) {
        unsafe { axpy_chunk::<Ymm2>(p, j, width) }
    }

    #[target_feature(enable = "avx2,fma")]
    unsafe fn dot_ymm<const TR: usize, const TC: usize>(p: &Product, group: usize) {
        unsafe { dot_group::<Ymm2, TR, TC>(p, group) }
    }

    /// 16 accumulators of AVX-512's 32 registers; a single row (one
    /// attention head's, of a batch) in fewer, against more rows of B.
    pub(super) unsafe fn avx512(p: &Product) {
        unsafe {
            match (p.trans_b, p.m) {
                (false, _) => axpy(p, axpy_zmm),
                (true, 1) => dot(p, 8, dot_zmm::<1, 8>),
                (true, _) => dot(p, 4, dot_zmm::<4, 4>),
            }
        }
    }

    /// At most 8 accumulators of AVX2's 16 registers.
    pub(super) unsafe fn avx2(p: &Product) {
        unsafe {
            match (p.trans_b, p.m) {
                (false, _) => axpy(p, axpy_ymm),
                (true, 1) => dot(p, 4, dot_ymm::<1, 4>),
                (true, _) => dot(p, 2, dot_ymm::<2, 2>),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Isa, Product, run};
    use rand::{Rng, SeedableRng};

    /// C (m x n, `ldc` apart) of one product on `isa`, from C's `start`.
    #[allow(clippy::too_many_arguments)]
    fn product(
        isa: Isa,
        (m, n, k): (usize, usize, usize),
        a: &[f32],
        b: &[f32],
        trans_b: bool,
        start: &[f32],
        (alpha, accumulate, parallel): (f32, bool, bool),
    ) -> Vec<f32> {
        let (lda, ldb, ldc) = (k + 3, if trans_b { k + 5 } else { n + 5 }, n + 2);
        assert!(a.len() >= m * lda && start.len() == m * ldc);
        assert!(b.len() >= if trans_b { n * ldb } else { k * ldb });
        let mut c = start.to_vec();
        let p = Product {
            m,
            n,
            k,
            a: a.as_ptr(),
            lda,
            b: b.as_ptr(),
            ldb,
            trans_b,
            c: c.as_mut_ptr(),
            ldc,
            alpha,
            accumulate,
            parallel,
        };
        // SAFETY: `isa` runs here (Isa::available); the strides above fit
        // the lengths asserted.
        unsafe { run(isa, &p) };
        c
    }

    fn random(len: usize, rng: &mut impl Rng) -> Vec<f32> {
        (0..len).map(|_| rng.random_range(-1.0..1.0)).collect()
    }

    /// Every ISA this CPU has gives each element of C within float
    /// rounding of the exact product, leaves C's padding alone, and gives
    /// the same bits as every other ISA and split: over one row and a
    /// few (B transposed), columns and k of every remainder, both layouts
    /// of B, alpha, accumulation.
    #[test]
    fn few_row_products_are_exact_to_rounding_and_the_same_bits_everywhere() {
        let isas = Isa::available();
        if isas.is_empty() {
            eprintln!("skipped: this CPU has neither AVX-512 nor AVX2 with FMA");
            return;
        }
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
        let shapes = [
            (1, 1, 1),
            (1, 17, 15),
            (1, 64, 577),
            (1, 577, 64),
            (1, 2100, 33),
            (2, 9, 16),
            (3, 33, 47),
            (5, 130, 31),
            (8, 65, 64),
            (13, 31, 100),
            (64, 40, 17),
        ];
        for (m, n, k) in shapes {
            for trans_b in [false, true] {
                let ldb = if trans_b { k + 5 } else { n + 5 };
                let a = random(m * (k + 3), &mut rng);
                let b = random(if trans_b { n * ldb } else { k * ldb }, &mut rng);
                let start = random(m * (n + 2), &mut rng);
                if !trans_b && m > 1 {
                    continue;
                }
                for options in [(1.0, false, false), (0.37, true, true), (-2.0, false, true)] {
                    let (alpha, accumulate, _) = options;
                    let mut first: Option<Vec<f32>> = None;
                    for &isa in &isas {
                        for parallel in [false, true] {
                            let options = (alpha, accumulate, parallel);
                            let got = product(isa, (m, n, k), &a, &b, trans_b, &start, options);
                            let what = format!("{isa:?} {m}x{n}x{k} trans_b {trans_b} {options:?}");
                            for r in 0..m {
                                for j in 0..n + 2 {
                                    let at = r * (n + 2) + j;
                                    if j >= n {
                                        assert_eq!(got[at], start[at], "{what}: padding");
                                        continue;
                                    }
                                    let (mut exact, mut size) = (0.0f64, 0.0f64);
                                    for q in 0..k {
                                        let bv = if trans_b {
                                            b[j * ldb + q]
                                        } else {
                                            b[q * ldb + j]
                                        };
                                        let term = a[r * (k + 3) + q] as f64 * bv as f64;
                                        exact += term;
                                        size += term.abs();
                                    }
                                    let base = if accumulate { start[at] as f64 } else { 0.0 };
                                    let want = base + alpha as f64 * exact;
                                    let tolerance =
                                        1e-6 * (alpha.abs() as f64 * size + base.abs() + 1e-30);
                                    assert!(
                                        (got[at] as f64 - want).abs() <= tolerance,
                                        "{what}: C[{r}][{j}] = {} for {want}",
                                        got[at]
                                    );
                                }
                            }
                            match &first {
                                None => first = Some(got),
                                Some(first) => assert!(
                                    first
                                        .iter()
                                        .zip(&got)
                                        .all(|(x, y)| x.to_bits() == y.to_bits()),
                                    "{what}: other bits than {:?}'s serial product",
                                    isas[0]
                                ),
                            }
                        }
                    }
                }
            }
        }
    }
}
