//! The CPU backend's op profile (`bench --profile` on the CPU): each op's
//! wall time, summed by op and by op and size. The CPU's ops run to the
//! end before they return, so an op's time is the time its call took on
//! the thread that made it, its rayon workers included.

use crate::kernel_profile::{self, KernelProfile, Key, SizeMeaning};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

/// Whether a profile is on: read by every op, so an atomic, not the lock.
static ON: AtomicBool = AtomicBool::new(false);
/// Each timed op since the profile started, with its nanoseconds.
static OPS: Mutex<Vec<(Key, u64)>> = Mutex::new(Vec::new());

/// Times one op from its creation to its drop, while a profile is on.
pub struct Timed {
    key: Key,
    start: Instant,
}

/// Starts timing an op of `family` (the kernel file's name), `entry` and
/// `size` (a product's multiply-adds; for other ops the elements they
/// write); `None`, at the cost of one load, when no profile is on.
pub fn op(family: &'static str, entry: &'static str, size: usize) -> Option<Timed> {
    ON.load(Ordering::Relaxed).then(|| Timed {
        key: (family, entry, size as u64),
        start: Instant::now(),
    })
}

impl Drop for Timed {
    fn drop(&mut self) {
        let nanoseconds = self.start.elapsed().as_nanos() as u64;
        ops().push((self.key, nanoseconds));
    }
}

fn ops() -> std::sync::MutexGuard<'static, Vec<(Key, u64)>> {
    // A panic while the lock is held leaves only timings behind it.
    OPS.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

pub fn start() {
    ops().clear();
    ON.store(true, Ordering::Relaxed);
}

/// The ops timed since `start`; `None` where no profile is on.
pub fn finish() -> Option<KernelProfile> {
    if !ON.swap(false, Ordering::Relaxed) {
        return None;
    }
    let ops = std::mem::take(&mut *ops());
    Some(kernel_profile::summarise(&ops, 1.0, SizeMeaning::Work))
}

#[cfg(test)]
mod tests {
    use crate::backend::{Backend, Matmul};
    use crate::cpu::CpuBackend;

    /// Ops are timed under their names while a profile is on, and not
    /// otherwise. (Other tests' ops may land in the same profile, so this
    /// product's dispatches are a lower bound.)
    #[test]
    fn a_profile_times_each_op_under_its_name() {
        let b = CpuBackend::new();
        let (m, n, k) = (7, 11, 13);
        let (x, y) = (b.tensor(&vec![1.0; m * k]), b.tensor(&vec![1.0; k * n]));
        let mut c = b.zeros(m * n);
        let product = Matmul::new(m, n, k);
        assert!(b.finish_kernel_profile().is_none(), "no profile was on");
        assert!(b.start_kernel_profile());
        b.matmul(&x, &y, &mut c, &product);
        b.matmul(&x, &y, &mut c, &product.trans_b());
        let profile = b.finish_kernel_profile().expect("a profile was on");
        for name in ["matmul/matmul", "matmul/matmul_bt"] {
            let time = (profile.kernels.iter())
                .find(|t| t.kernel == name)
                .unwrap_or_else(|| panic!("no {name} in {profile:?}"));
            assert!(time.dispatches >= 1 && time.seconds > 0.0, "{time:?}");
        }
        assert!((profile.groups.iter()).all(|t| t.workgroups.is_none() && t.work.is_some()));
        assert!(b.finish_kernel_profile().is_none(), "the profile ended");
    }
}
