//! `captune bench kernels`: matmul GFLOP/s and elementwise GB/s per backend.
//! GPU times come from timestamp queries around one compute pass where the
//! adapter has them (else from submission to completion); CPU times are the
//! median of repeated runs after a warm-up. Also the process's peak
//! memory, which every benchmark and the app's frame report give.

use crate::backend::{Backend, BackendKind, Matmul};
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

/// Seconds per call of `f`: one warm-up, then the median of five timings
/// of enough repetitions to fill about 0.1 s each.
fn seconds_per_op<B: Timer>(b: &B, f: &mut dyn FnMut()) -> f64 {
    let once = b.time_reps(1, f).as_secs_f64().max(1e-7);
    let reps = ((0.1 / once) as usize).clamp(1, 200);
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
        let seconds = seconds_per_op(b, &mut || b.matmul(&x, &y, &mut z, &shape));
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
        let seconds = seconds_per_op(b, &mut || b.axpby(0.5, &x, 0.5, &mut y));
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
