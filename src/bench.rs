//! `captune bench kernels`: matmul GFLOP/s and elementwise GB/s per backend.
//! GPU times come from timestamp queries around one compute pass where the
//! adapter has them (else from submission to completion); CPU times are the
//! median of repeated runs after a warm-up. Also what every benchmark
//! records beside its figures: the process's peak memory (which the app's
//! frame report gives too), the device's counters and its products'
//! workgroups per step.

use crate::backend::{
    Backend, BackendKind, DeviceCounters, Matmul, WorkgroupCounts, WorkgroupSummary,
};
use crate::gpu::GpuBackend;
use rand::{Rng, SeedableRng};
use std::time::{Duration, Instant};

#[derive(Debug, Clone, serde::Serialize)]
pub struct BenchRecord {
    pub op: String,
    pub backend: BackendKind,
    pub adapter: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub m: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub n: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub k: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gflops: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gbps: Option<f64>,
    /// Seconds per op.
    pub seconds: f64,
}

impl std::fmt::Display for BenchRecord {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let shape = match (self.m, self.n, self.k) {
            (Some(m), Some(n), Some(k)) => format!("{m}x{n}x{k}"),
            (_, Some(n), _) => format!("n={n}"),
            _ => String::new(),
        };
        let rate = match (self.gflops, self.gbps) {
            (Some(g), _) => format!("{g:9.1} GFLOP/s"),
            (_, Some(g)) => format!("{g:9.1} GB/s"),
            _ => String::new(),
        };
        write!(
            f,
            "{:<4} {:<8} {:<16} {rate}  ({:.3} ms)",
            self.backend,
            self.op,
            shape,
            self.seconds * 1e3
        )
    }
}

/// How a backend times `reps` repetitions of recorded work.
pub trait Timer: Backend {
    fn time_reps(&self, reps: usize, f: &mut dyn FnMut()) -> Duration;
}

impl Timer for crate::cpu::CpuBackend {
    fn time_reps(&self, reps: usize, f: &mut dyn FnMut()) -> Duration {
        let start = Instant::now();
        for _ in 0..reps {
            f();
        }
        start.elapsed()
    }
}

impl Timer for GpuBackend {
    fn time_reps(&self, reps: usize, f: &mut dyn FnMut()) -> Duration {
        self.time(|| {
            for _ in 0..reps {
                f();
            }
        })
    }
}

/// Seconds of one timing sample of a benchmark's op.
const SAMPLE_SECONDS: f64 = 0.1;

/// Seconds per call of `f`: one warm-up, then the median of five timings
/// of enough repetitions to fill about `sample_seconds` each.
fn seconds_per_op<B: Timer>(b: &B, sample_seconds: f64, f: &mut dyn FnMut()) -> f64 {
    let once = b.time_reps(1, f).as_secs_f64().max(1e-7);
    let reps = ((sample_seconds / once) as usize).clamp(1, 200);
    let mut samples: Vec<f64> = (0..5)
        .map(|_| b.time_reps(reps, f).as_secs_f64() / reps as f64)
        .collect();
    samples.sort_by(f64::total_cmp);
    samples[2]
}

fn random(len: usize, seed: u64) -> Vec<f32> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    (0..len).map(|_| rng.random_range(-1.0..1.0)).collect()
}

/// Square matmuls of each size, then one elementwise op (y = a x + b y over
/// `elementwise_len` floats: 12 bytes per element moved).
pub fn kernels<B: Timer>(
    b: &B,
    sizes: &[usize],
    elementwise_len: usize,
    mut report: impl FnMut(&BenchRecord),
) {
    let adapter = b.adapter_name();
    for &size in sizes {
        let x = b.tensor(&random(size * size, 1));
        let y = b.tensor(&random(size * size, 2));
        let mut z = b.zeros(size * size);
        let shape = Matmul::new(size, size, size);
        let seconds = seconds_per_op(b, SAMPLE_SECONDS, &mut || b.matmul(&x, &y, &mut z, &shape));
        report(&BenchRecord {
            op: "matmul".into(),
            backend: b.kind(),
            adapter: adapter.clone(),
            m: Some(size),
            n: Some(size),
            k: Some(size),
            gflops: Some(shape.flops() / seconds / 1e9),
            gbps: None,
            seconds,
        });
    }
    if elementwise_len > 0 {
        let x = b.tensor(&random(elementwise_len, 3));
        let mut y = b.tensor(&random(elementwise_len, 4));
        let seconds = seconds_per_op(b, SAMPLE_SECONDS, &mut || b.axpby(0.5, &x, 0.5, &mut y));
        report(&BenchRecord {
            op: "axpby".into(),
            backend: b.kind(),
            adapter,
            m: None,
            n: Some(elementwise_len),
            k: None,
            gflops: None,
            gbps: Some(12.0 * elementwise_len as f64 / seconds / 1e9),
            seconds,
        });
    }
}

/// The process's peak resident memory (Linux's VmHWM, since the start or
/// the last reset of it), in MiB; None where the kernel does not say.
pub fn peak_memory_mib() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024.0)
}

/// The sizes of the products `matmul_variants` times: rows of a training
/// step (captions x positions), the width, the MLP's width, the
/// vocabulary and the rows of a decoding step.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ProductSizes {
    /// A GPT-2-small ClipCap's: 16 captions of 41 positions, width 768,
    /// MLP 3072, 50257 ids; decoding 64 images at once, and 16 (an SCST
    /// step's greedy baseline).
    Gpt2Small,
    /// The same products at a size a software adapter runs in seconds.
    Tiny,
}

/// One product of a training or decoding step.
pub struct NamedProduct {
    pub name: &'static str,
    pub shape: Matmul,
}

impl ProductSizes {
    /// Seconds of each timing sample: the tiny products rehearse the bench
    /// on a software adapter, where their times mean nothing.
    fn sample_seconds(self) -> f64 {
        match self {
            ProductSizes::Gpt2Small => SAMPLE_SECONDS,
            ProductSizes::Tiny => SAMPLE_SECONDS / 10.0,
        }
    }

    /// Each matmul a step runs, once (forward, input and weight gradients
    /// of the linear layers and the head, and decoding's products at two
    /// batch sizes).
    pub fn products(self) -> Vec<NamedProduct> {
        let (rows, width, hidden, vocab, decoding, baseline) = match self {
            ProductSizes::Gpt2Small => (16 * 41, 768, 3072, 50257, 64, 16),
            ProductSizes::Tiny => (48, 64, 256, 400, 8, 6),
        };
        let product = |name, shape| NamedProduct { name, shape };
        vec![
            product("qkv", Matmul::new(rows, 3 * width, width)),
            product("proj", Matmul::new(rows, width, width)),
            product("fc1", Matmul::new(rows, hidden, width)),
            product("fc2", Matmul::new(rows, width, hidden)),
            product("head", Matmul::new(rows, vocab, width).trans_b()),
            product("d_hidden", Matmul::new(rows, width, vocab)),
            product("d_fc2_input", Matmul::new(rows, hidden, width).trans_b()),
            product(
                "d_qkv_weight",
                Matmul::new(width, 3 * width, rows).trans_a(),
            ),
            product("d_fc1_weight", Matmul::new(width, hidden, rows).trans_a()),
            product("d_head_weight", Matmul::new(vocab, width, rows).trans_a()),
            product("decode_qkv", Matmul::new(decoding, 3 * width, width)),
            product("decode_proj", Matmul::new(decoding, width, width)),
            product("decode_fc2", Matmul::new(decoding, width, hidden)),
            product("decode_head", Matmul::new(decoding, vocab, width).trans_b()),
            product("baseline_qkv", Matmul::new(baseline, 3 * width, width)),
            product("baseline_proj", Matmul::new(baseline, width, width)),
            product("baseline_fc1", Matmul::new(baseline, hidden, width)),
            product("baseline_fc2", Matmul::new(baseline, width, hidden)),
            product(
                "baseline_head",
                Matmul::new(baseline, vocab, width).trans_b(),
            ),
        ]
    }
}

/// One matmul kernel on one product: its speed, its plan, and its error
/// against the CPU backend's product.
#[derive(Clone, Debug, serde::Serialize)]
pub struct VariantRecord {
    pub op: &'static str,
    pub product: &'static str,
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub trans_a: bool,
    pub trans_b: bool,
    /// The kernel's entry point in shaders/matmul.wgsl.
    pub kernel: &'static str,
    /// k per split where the product runs split-K.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub k_split: Option<usize>,
    pub workgroups: usize,
    /// Whether the adapter's own plan takes this kernel for this product.
    pub planned: bool,
    pub gflops: f64,
    pub seconds: f64,
    /// ||gpu - cpu|| / ||cpu||.
    pub relative_error: f64,
}

impl std::fmt::Display for VariantRecord {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{:<14} {:>5}x{:<5}x{:>5} {:<17} {:>6} wg{:<12} {:8.1} GFLOP/s  ({:.3} ms, error {:.1e}){}",
            self.product,
            self.m,
            self.n,
            self.k,
            self.kernel,
            self.workgroups,
            self.k_split
                .map_or(String::new(), |s| format!(", split {s}")),
            self.gflops,
            self.seconds * 1e3,
            self.relative_error,
            if self.planned { "  <- planned" } else { "" }
        )
    }
}

/// Every matmul kernel on every product of `sizes`, each checked against
/// the CPU backend and timed, so that one run compares them all. The
/// adapter's own choice of kernels is restored afterwards.
pub fn matmul_variants(
    gpu: &GpuBackend,
    sizes: ProductSizes,
    mut report: impl FnMut(&VariantRecord),
) {
    use crate::gpu::{MatmulKernel, MatmulTile, matmul_plan};
    let cpu = crate::cpu::CpuBackend::new();
    let own = gpu.matmul_kernel();
    for (i, NamedProduct { name, shape }) in sizes.products().into_iter().enumerate() {
        let (a, b) = (
            random(shape.m * shape.k, 2 * i as u64),
            random(shape.k * shape.n, 2 * i as u64 + 1),
        );
        let mut expected = cpu.zeros(shape.m * shape.n);
        cpu.matmul(&cpu.tensor(&a), &cpu.tensor(&b), &mut expected, &shape);
        let expected = cpu.to_vec(&expected);
        let (ga, gb) = (gpu.tensor(&a), gpu.tensor(&b));
        let planned = matmul_plan(own, shape.m, shape.n, shape.k, 1, true).tile;
        for tile in MatmulTile::ALL {
            gpu.set_matmul_kernel(MatmulKernel::Only(tile));
            let plan = matmul_plan(gpu.matmul_kernel(), shape.m, shape.n, shape.k, 1, true);
            // Poisoned, so that an element no workgroup writes shows.
            let mut c = gpu.tensor(&vec![f32::NAN; shape.m * shape.n]);
            gpu.matmul(&ga, &gb, &mut c, &shape);
            let got = gpu.to_vec(&c);
            let seconds = seconds_per_op(gpu, sizes.sample_seconds(), &mut || {
                gpu.matmul(&ga, &gb, &mut c, &shape)
            });
            report(&VariantRecord {
                op: "matmul_variant",
                product: name,
                m: shape.m,
                n: shape.n,
                k: shape.k,
                trans_a: shape.trans_a,
                trans_b: shape.trans_b,
                kernel: tile.entry(),
                k_split: plan.k_split,
                workgroups: plan.workgroups(shape.m, shape.n, shape.k, 1),
                planned: tile == planned,
                gflops: shape.flops() / seconds / 1e9,
                seconds,
                relative_error: relative_error(&got, &expected),
            });
        }
    }
    gpu.set_matmul_kernel(own);
}

/// ||got - expected|| / ||expected||; infinite where `got` holds a NaN.
fn relative_error(got: &[f32], expected: &[f32]) -> f64 {
    let (mut diff, mut norm) = (0.0f64, 0.0f64);
    for (&g, &e) in got.iter().zip(expected) {
        diff += (g as f64 - e as f64).powi(2);
        norm += (e as f64).powi(2);
    }
    if diff.is_nan() {
        return f64::INFINITY;
    }
    (diff / norm.max(f64::MIN_POSITIVE)).sqrt()
}

/// What a benchmark's process held: its peak resident memory since
/// [`MemoryUse::reset`] (Linux's VmHWM), and on the GPU the device memory
/// the backend holds (its pool keeps buffers for reuse, so after another
/// record on the same device this includes what that one made). Each is
/// None where there is nothing to read.
#[derive(Clone, Debug, serde::Serialize)]
pub struct MemoryUse {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peak_memory_mib: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device_memory_mib: Option<f64>,
}

impl MemoryUse {
    /// Starts the process's peak resident memory afresh (Linux: writing 5
    /// to /proc/self/clear_refs), so that a record after another in the
    /// same process reports its own peak; elsewhere nothing happens.
    pub fn reset() {
        let _ = std::fs::write("/proc/self/clear_refs", "5");
    }

    pub fn now<B: Backend>(b: &B) -> MemoryUse {
        MemoryUse {
            peak_memory_mib: peak_memory_mib(),
            device_memory_mib: b
                .device_memory_bytes()
                .map(|bytes| bytes as f64 / (1024.0 * 1024.0)),
        }
    }
}

impl std::fmt::Display for MemoryUse {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if let Some(m) = self.peak_memory_mib {
            write!(f, ", peak memory {m:.0} MiB")?;
        }
        if let Some(m) = self.device_memory_mib {
            write!(f, ", device memory {m:.0} MiB")?;
        }
        Ok(())
    }
}

/// The matmul dispatches since `before` (`Backend::matmul_workgroups`),
/// per one of `n` (rounded up), with their fewest and median workgroups
/// and, per one of `n`, the kernels they ran.
pub fn matmul_summary<B: Backend>(
    b: &B,
    before: Option<WorkgroupCounts>,
    n: usize,
) -> Option<WorkgroupSummary> {
    let summary = b.matmul_workgroups()?.since(&before?).summary()?;
    let per = |count: u64| count.div_ceil(n.max(1) as u64);
    Some(WorkgroupSummary {
        matmul_dispatches: per(summary.matmul_dispatches),
        kernels: (summary.kernels.into_iter())
            .map(|(kernel, count)| (kernel, per(count)))
            .collect(),
        ..summary
    })
}

/// The counters from `before` to `after`, per one of `n` (rounded up).
pub fn per(
    after: Option<DeviceCounters>,
    before: Option<DeviceCounters>,
    n: usize,
) -> Option<DeviceCounters> {
    Some(after?.since(&before?).per(n))
}
