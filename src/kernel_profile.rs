//! Per-kernel time: what a profile of a step (`Backend::
//! start_kernel_profile`) says each kernel cost, summed by kernel and by
//! kernel and grid size (on the CPU: by op, and by op and size).

use serde::Serialize;
use std::collections::HashMap;

/// What one group of dispatches is summed under: the kernel family, the
/// entry point and the dispatch's size (which tells a kernel's products or
/// sizes apart): its workgroups on a GPU, its work on the CPU.
pub type Key = (&'static str, &'static str, u64);

/// What a [`Key`]'s size counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SizeMeaning {
    /// A GPU dispatch's workgroups.
    Workgroups,
    /// A CPU op's work: a product's multiply-adds, else the elements it
    /// writes.
    Work,
}
/// The time of one kernel (or one kernel at one grid size) over a profile.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct KernelTime {
    /// `family/entry`, e.g. `matmul/matmul_shared`.
    pub kernel: String,
    /// The dispatches' workgroups, where the record is for one grid size.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub workgroups: Option<u64>,
    /// The ops' work (a product's multiply-adds, else the elements
    /// written), where the record is for one size of a CPU op.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub work: Option<u64>,
    pub dispatches: u64,
    pub seconds: f64,
}

/// A profile's times: by kernel, and the costliest kernel-and-grid groups.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct KernelProfile {
    /// Time inside the timed passes (on the CPU: ops), all kernels together.
    pub seconds: f64,
    /// By kernel, the costliest first.
    pub kernels: Vec<KernelTime>,
    /// By kernel and grid size, the costliest first (at most `TOP_GROUPS`).
    pub groups: Vec<KernelTime>,
}

/// Kernel-and-grid groups a profile keeps.
const TOP_GROUPS: usize = 20;

impl std::fmt::Display for KernelProfile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "kernel time {:.3} ms:", self.seconds * 1e3)?;
        for t in self.kernels.iter().take(8) {
            write!(
                f,
                " {} {:.0}%",
                t.kernel,
                100.0 * t.seconds / self.seconds.max(f64::MIN_POSITIVE)
            )?;
        }
        Ok(())
    }
}

/// Sums each dispatch's time (`ticks`: from its pass's start to its end)
/// by kernel and by kernel and size.
pub fn summarise(
    dispatches: &[(Key, u64)],
    nanoseconds_per_tick: f64,
    size: SizeMeaning,
) -> KernelProfile {
    let mut by_kernel: HashMap<(&str, &str), (u64, f64)> = HashMap::new();
    let mut by_group: HashMap<Key, (u64, f64)> = HashMap::new();
    let mut total = 0.0;
    for &(key, ticks) in dispatches {
        let seconds = ticks as f64 * nanoseconds_per_tick * 1e-9;
        total += seconds;
        let k = by_kernel.entry((key.0, key.1)).or_default();
        k.0 += 1;
        k.1 += seconds;
        let g = by_group.entry(key).or_default();
        g.0 += 1;
        g.1 += seconds;
    }
    let costliest_first = |a: &KernelTime, b: &KernelTime| {
        b.seconds
            .total_cmp(&a.seconds)
            .then_with(|| a.kernel.cmp(&b.kernel))
            .then_with(|| a.workgroups.cmp(&b.workgroups))
            .then_with(|| a.work.cmp(&b.work))
    };
    let mut kernels: Vec<KernelTime> = by_kernel
        .into_iter()
        .map(|((family, entry), (dispatches, seconds))| KernelTime {
            kernel: format!("{family}/{entry}"),
            workgroups: None,
            work: None,
            dispatches,
            seconds,
        })
        .collect();
    kernels.sort_by(costliest_first);
    let mut groups: Vec<KernelTime> = by_group
        .into_iter()
        .map(
            |((family, entry, group_size), (dispatches, seconds))| KernelTime {
                kernel: format!("{family}/{entry}"),
                workgroups: (size == SizeMeaning::Workgroups).then_some(group_size),
                work: (size == SizeMeaning::Work).then_some(group_size),
                dispatches,
                seconds,
            },
        )
        .collect();
    groups.sort_by(costliest_first);
    groups.truncate(TOP_GROUPS);
    KernelProfile {
        seconds: total,
        kernels,
        groups,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_summed_by_kernel_and_by_grid_costliest_first() {
        let a = ("matmul", "matmul_shared", 64);
        let b = ("matmul", "matmul_shared", 128);
        let c = ("elementwise", "axpby", 64);
        let dispatches = [(a, 10), (b, 30), (c, 5), (a, 10)];
        let profile = summarise(&dispatches, 2.0, SizeMeaning::Workgroups);
        let ns = |s: f64| (s * 1e9).round() as u64;
        assert_eq!(ns(profile.seconds), 110);
        let kernels: Vec<_> = (profile.kernels.iter())
            .map(|t| (t.kernel.as_str(), t.dispatches, ns(t.seconds)))
            .collect();
        assert_eq!(
            kernels,
            [
                ("matmul/matmul_shared", 3, 100),
                ("elementwise/axpby", 1, 10)
            ]
        );
        let groups: Vec<_> = (profile.groups.iter())
            .map(|t| (t.workgroups.unwrap(), t.dispatches, ns(t.seconds)))
            .collect();
        assert_eq!(groups, [(128, 1, 60), (64, 2, 40), (64, 1, 10)]);
    }

    /// On the CPU a group's size is its work, not workgroups.
    #[test]
    fn cpu_groups_carry_their_work() {
        let product = ("matmul", "matmul_at", 1001);
        let profile = summarise(&[(product, 40), (product, 60)], 1.0, SizeMeaning::Work);
        let group = &profile.groups[0];
        assert_eq!(
            (
                group.kernel.as_str(),
                group.work,
                group.workgroups,
                group.dispatches
            ),
            ("matmul/matmul_at", Some(1001), None, 2)
        );
        assert_eq!(profile.kernels[0].work, None);
    }
}
