//! Products whose A has few rows: decoding's tied output layer (a row per
//! caption), an LSTM step's recurrent product (a row per sequence), and
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
//!   order. (With more rows, `gemm`'s packing of B pays for itself: a
//!   register-blocked kernel for them made BLIP-base-shaped decoding
//!   slower than `gemm` did.)
//!
//! Sixteen lanes are one AVX-512 register or two AVX2 registers; the
//! arithmetic, and so the bits, are the same either way, and whatever the
//! split over threads. Other CPUs (this module is x86-64's only), and the
//! products these forms do not fit, stay with `gemm`.

use rayon::prelude::*;

/// The most rows of A this module takes: beyond them `gemm`'s packing pays
/// for itself.
pub const MAX_ROWS: usize = 64;

/// The fewest elements of a transposed B this module takes for more than
/// one row of A: a smaller B (an attention head's keys in training, a
/// small network's layer) stays in cache, where `gemm`'s packing is cheap.
pub const MIN_B_ELEMENTS: usize = 1 << 16;

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
    /// `gemm` everywhere (to compare the two; any other value is an
    /// error's worth of a warning, and the kernels run).
    pub fn detected() -> Option<Isa> {
        static ISA: std::sync::OnceLock<Option<Isa>> = std::sync::OnceLock::new();
        *ISA.get_or_init(|| {
            match std::env::var("CAPTUNE_CPU_MATMUL").as_deref() {
                Ok("gemm") => return None,
                Ok(other) => eprintln!(
                    "warning: CAPTUNE_CPU_MATMUL={other} is not a choice (only `gemm`, which puts \
                     every CPU product on the gemm crate); ignored"
                ),
                Err(_) => {}
            }
            Isa::available().into_iter().next()
        })
    }

    /// Every ISA this CPU can run, the best first.
    pub fn available() -> Vec<Isa> {
        [Isa::Avx512, Isa::Avx2]
            .into_iter()
            .filter(|isa| isa.runs_here())
            .collect()
    }

    fn runs_here(self) -> bool {
        use std::arch::is_x86_feature_detected as has;
        match self {
            Isa::Avx512 => has!("avx512f"),
            Isa::Avx2 => has!("avx2") && has!("fma"),
        }
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
    assert!(
        p.trans_b || p.m == 1,
        "few_rows: B as stored takes one row of A"
    );
    // C's rows are written from several threads as slices of their own.
    assert!(
        p.m > 0 && p.n > 0 && p.k > 0 && (p.m == 1 || p.ldc >= p.n),
        "few_rows: an empty product, or C's rows overlapping"
    );
    // SAFETY: the caller's promises, passed on.
    unsafe {
        match isa {
            Isa::Avx512 => x86::avx512(p),
            Isa::Avx2 => x86::avx2(p),
        }
    }
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

/// Rows of B the [k, n] form fetches ahead of the one it multiplies (the
/// [n, k] form fetches the next group's rows instead).
const AHEAD: usize = 8;

#[inline(always)]
fn prefetch(p: *const f32) {
    use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
    // SAFETY: a prefetch never faults, wherever it points.
    unsafe { _mm_prefetch::<_MM_HINT_T0>(p.cast()) }
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

/// Columns of C a task of the [k, n] form keeps (in L1, 4 KiB): the
/// size of its sums.
const CHUNK: usize = 1024;

/// The [k, n] form (one row of A) in chunks of 16 to [`CHUNK`] columns,
/// two a thread where a parallel product's columns allow.
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
        // SAFETY (the three blocks): the ISA is the kernel's; 16 elements
        // from v < whole <= cols <= CHUNK are in the row and in `sums`.
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
    // A row of A past the last is read as the last, and of B likewise:
    // their sums are not stored.
    let a_row = |row: usize| p.a.wrapping_add(row.min(m - 1) * p.lda);
    let b_row = |row: usize| p.b.wrapping_add(row.min(n - 1) * p.ldb);
    let b: [*const f32; TC] = std::array::from_fn(|t| b_row(j + t));
    (0..TC).for_each(|t| prefetch_span(b_row(j + TC + t), k));
    for r in (0..m).step_by(TR) {
        let a: [*const f32; TR] = std::array::from_fn(|t| a_row(r + t));
        // SAFETY (the blocks below): the ISA is the kernel's; every row
        // pointer is a row of A or B, k long, and q + 16 <= whole <= k.
        let mut acc = [[unsafe { L::zero() }; TC]; TR];
        for q in (0..whole).step_by(16) {
            // Plain loops, not closures: a closure would be a function
            // compiled without the kernel's ISA.
            let mut av = [unsafe { L::zero() }; TR];
            for (av, a) in av.iter_mut().zip(&a) {
                *av = unsafe { L::load(a.add(q)) };
            }
            for (t, b) in b.iter().enumerate() {
                let bv = unsafe { L::load(b.add(q)) };
                for (acc, av) in acc.iter_mut().zip(&av) {
                    acc[t] = unsafe { av.mul_add(bv, acc[t]) };
                }
            }
        }
        for (t, acc) in acc.iter().enumerate().take(TR.min(m - r)) {
            let mut sums = [0.0f32; TC];
            for (u, (sum, acc)) in sums.iter_mut().zip(acc).enumerate() {
                *sum = unsafe { acc.sum() };
                for q in whole..k {
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

    /// A product's operands, with rows padded past their lengths so that
    /// the strides are not the widths.
    struct Case {
        m: usize,
        n: usize,
        k: usize,
        trans_b: bool,
        a: Vec<f32>,
        b: Vec<f32>,
        c: Vec<f32>,
    }

    impl Case {
        fn new(m: usize, n: usize, k: usize, trans_b: bool, rng: &mut impl Rng) -> Self {
            let mut random = |len: usize| (0..len).map(|_| rng.random_range(-1.0..1.0)).collect();
            let b_len = if trans_b { n * (k + 5) } else { k * (n + 5) };
            Case {
                m,
                n,
                k,
                trans_b,
                a: random(m * (k + 3)),
                b: random(b_len),
                c: random(m * (n + 2)),
            }
        }

        fn lda(&self) -> usize {
            self.k + 3
        }

        fn ldb(&self) -> usize {
            if self.trans_b { self.k + 5 } else { self.n + 5 }
        }

        fn ldc(&self) -> usize {
            self.n + 2
        }

        fn a(&self, r: usize, q: usize) -> f32 {
            self.a[r * self.lda() + q]
        }

        /// op(B)[q][j].
        fn b(&self, q: usize, j: usize) -> f32 {
            match self.trans_b {
                true => self.b[j * self.ldb() + q],
                false => self.b[q * self.ldb() + j],
            }
        }

        /// C after the product on `isa`.
        fn on(&self, isa: Isa, alpha: f32, accumulate: bool, parallel: bool) -> Vec<f32> {
            let mut c = self.c.clone();
            let p = Product {
                m: self.m,
                n: self.n,
                k: self.k,
                a: self.a.as_ptr(),
                lda: self.lda(),
                b: self.b.as_ptr(),
                ldb: self.ldb(),
                trans_b: self.trans_b,
                c: c.as_mut_ptr(),
                ldc: self.ldc(),
                alpha,
                accumulate,
                parallel,
            };
            // SAFETY: `isa` runs here (Isa::available); the strides fit
            // the operands' lengths (`Case::new`).
            unsafe { run(isa, &p) };
            c
        }

        /// C as the kernels' arithmetic gives it, one operation at a time:
        /// for B transposed, 16 lanes of fused multiply-add chains over k,
        /// summed by the tree, then the tail in order; for B as stored, one
        /// chain over k in order.
        fn modelled(&self, alpha: f32, accumulate: bool) -> Vec<f32> {
            let mut c = self.c.clone();
            let whole = self.k / 16 * 16;
            for r in 0..self.m {
                for j in 0..self.n {
                    let term = |q: usize| (self.a(r, q), self.b(q, j));
                    let mut sum = 0.0f32;
                    if self.trans_b {
                        let mut lanes = [0.0f32; 16];
                        for q in 0..whole {
                            let (x, y) = term(q);
                            lanes[q % 16] = x.mul_add(y, lanes[q % 16]);
                        }
                        let mut width = 8;
                        while width > 0 {
                            for l in 0..width {
                                lanes[l] += lanes[l + width];
                            }
                            width /= 2;
                        }
                        sum = lanes[0];
                        for q in whole..self.k {
                            let (x, y) = term(q);
                            sum = x.mul_add(y, sum);
                        }
                    } else {
                        for q in 0..self.k {
                            let (x, y) = term(q);
                            sum = x.mul_add(y, sum);
                        }
                    }
                    let at = &mut c[r * self.ldc() + j];
                    *at = if accumulate {
                        *at + alpha * sum
                    } else {
                        alpha * sum
                    };
                }
            }
            c
        }
    }

    /// The shapes of the sweep: one row and a few (B transposed only),
    /// every remainder of k modulo 16 and of the columns modulo a group,
    /// and columns past one task's chunk of B as stored.
    fn shapes() -> Vec<(usize, usize, usize, bool)> {
        let mut shapes = vec![];
        for k in 1..=33 {
            for n in [1, 2, 5, 8, 9, 16, 17] {
                shapes.push((1, n, k, true));
                shapes.push((1, n, k, false));
                shapes.push((3, n, k, true));
            }
        }
        for n in 1..=17 {
            shapes.push((1, n, 40, false));
            shapes.push((5, n, 40, true));
        }
        shapes.extend([
            (1, 2100, 33, false),
            (1, 1030, 7, false),
            (1, 577, 64, true),
            (1, 64, 577, false),
            (8, 65, 64, true),
            (13, 31, 100, true),
            (64, 40, 17, true),
        ]);
        shapes
    }

    /// On every ISA this CPU has and on one thread or several, each
    /// element of C has the bits of the kernels' arithmetic done one
    /// operation at a time (so every ISA gives the same bits, on any
    /// machine this runs on), is within float rounding of the exact
    /// product, and C's padding is untouched; over [`shapes`], both
    /// layouts of B, alpha and accumulation.
    #[test]
    fn few_row_products_have_the_bits_of_their_arithmetic_on_every_isa() {
        let isas = Isa::available();
        if isas.is_empty() {
            eprintln!("skipped: this CPU has neither AVX-512 nor AVX2 with FMA");
            return;
        }
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
        for (m, n, k, trans_b) in shapes() {
            let case = Case::new(m, n, k, trans_b, &mut rng);
            for (alpha, accumulate) in [(1.0, false), (0.37, true), (-2.0, false)] {
                let want = case.modelled(alpha, accumulate);
                for (r, j) in (0..m).flat_map(|r| (0..n).map(move |j| (r, j))) {
                    let (mut exact, mut size) = (0.0f64, 0.0f64);
                    for q in 0..k {
                        let term = case.a(r, q) as f64 * case.b(q, j) as f64;
                        exact += term;
                        size += term.abs();
                    }
                    let at = r * case.ldc() + j;
                    let base = if accumulate { case.c[at] as f64 } else { 0.0 };
                    let tolerance = 1e-6 * (alpha.abs() as f64 * size + base.abs());
                    let error = (want[at] as f64 - base - alpha as f64 * exact).abs();
                    assert!(
                        error <= tolerance,
                        "the model at C[{r}][{j}] of {m}x{n}x{k}"
                    );
                }
                for &isa in &isas {
                    for parallel in [false, true] {
                        let got = case.on(isa, alpha, accumulate, parallel);
                        let what = format!(
                            "{isa:?} {m}x{n}x{k} trans_b {trans_b} alpha {alpha} \
                             accumulate {accumulate} parallel {parallel}"
                        );
                        for (at, (g, w)) in got.iter().zip(&want).enumerate() {
                            assert_eq!(g.to_bits(), w.to_bits(), "{what}: C element {at}");
                        }
                    }
                }
            }
        }
    }
}
