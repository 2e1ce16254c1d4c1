//! What a real GPU pays for, as the backend counts it: dispatches,
//! submissions, readbacks, creations, and the matmul dispatches' workgroups.

use std::collections::BTreeMap;

/// Counts of what stalls or costs a real GPU, since the backend was made:
/// compute dispatches, queue submissions, readbacks, and the buffers and
/// bind groups that ops and transfers create (uploads through the queue
/// and the device's own set-up are not counted). This project's machines
/// have no GPU to time, so the benchmarks report these per training step
/// and per decoded batch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct DeviceCounters {
    pub dispatches: u64,
    /// Compute passes begun: a copy, a clear or an upload between two
    /// dispatches ends one.
    pub passes: u64,
    pub submissions: u64,
    /// Reads that wait for the device.
    pub readbacks: u64,
    /// Reads begun without waiting ([`Backend::begin_ids_read`](super::Backend::begin_ids_read)).
    pub async_reads: u64,
    pub buffers_created: u64,
    pub bind_groups_created: u64,
}

impl std::fmt::Display for DeviceCounters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} dispatches, {} passes, {} submissions, {} readbacks, {} reads without waiting, \
             {} buffers, {} bind groups",
            self.dispatches,
            self.passes,
            self.submissions,
            self.readbacks,
            self.async_reads,
            self.buffers_created,
            self.bind_groups_created
        )
    }
}

impl DeviceCounters {
    /// One `n`-th of each count, rounded up.
    pub fn per(&self, n: usize) -> DeviceCounters {
        let n = n.max(1) as u64;
        DeviceCounters {
            dispatches: self.dispatches.div_ceil(n),
            passes: self.passes.div_ceil(n),
            submissions: self.submissions.div_ceil(n),
            readbacks: self.readbacks.div_ceil(n),
            async_reads: self.async_reads.div_ceil(n),
            buffers_created: self.buffers_created.div_ceil(n),
            bind_groups_created: self.bind_groups_created.div_ceil(n),
        }
    }

    /// What happened between `earlier` and `self`.
    pub fn since(&self, earlier: &DeviceCounters) -> DeviceCounters {
        DeviceCounters {
            dispatches: self.dispatches - earlier.dispatches,
            passes: self.passes - earlier.passes,
            submissions: self.submissions - earlier.submissions,
            readbacks: self.readbacks - earlier.readbacks,
            async_reads: self.async_reads - earlier.async_reads,
            buffers_created: self.buffers_created - earlier.buffers_created,
            bind_groups_created: self.bind_groups_created - earlier.bind_groups_created,
        }
    }
}

/// Matmul dispatches by their workgroup count and by the kernel chosen
/// for them: how well the products would fill a real GPU.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WorkgroupCounts {
    pub workgroups: BTreeMap<u64, u64>,
    pub kernels: BTreeMap<String, u64>,
}

/// `now` less `earlier`, count by count.
fn counts_since<K: Ord + Clone>(
    now: &BTreeMap<K, u64>,
    earlier: &BTreeMap<K, u64>,
) -> BTreeMap<K, u64> {
    let mut out = now.clone();
    for (key, n) in earlier {
        if let Some(count) = out.get_mut(key) {
            *count -= n;
        }
    }
    out.retain(|_, n| *n > 0);
    out
}

impl WorkgroupCounts {
    /// What happened between `earlier` and `self`.
    pub fn since(&self, earlier: &WorkgroupCounts) -> WorkgroupCounts {
        WorkgroupCounts {
            workgroups: counts_since(&self.workgroups, &earlier.workgroups),
            kernels: counts_since(&self.kernels, &earlier.kernels),
        }
    }

    /// The summary the benchmarks report (`None` without a dispatch).
    pub fn summary(&self) -> Option<WorkgroupSummary> {
        let dispatches: u64 = self.workgroups.values().sum();
        let min = *self.workgroups.keys().next()?;
        // The lower median: the count of the (dispatches - 1) / 2-th
        // dispatch in order of workgroups.
        let mut left = (dispatches - 1) / 2;
        let mut median = min;
        for (&groups, &n) in &self.workgroups {
            if left < n {
                median = groups;
                break;
            }
            left -= n;
        }
        Some(WorkgroupSummary {
            matmul_dispatches: dispatches,
            min,
            median,
            kernels: self.kernels.clone(),
        })
    }
}

/// Matmul dispatches, their fewest and median workgroups, and how many
/// ran each kernel (`+split` for split-K).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct WorkgroupSummary {
    pub matmul_dispatches: u64,
    #[serde(rename = "matmul_workgroups_min")]
    pub min: u64,
    #[serde(rename = "matmul_workgroups_median")]
    pub median: u64,
    #[serde(rename = "matmul_kernels")]
    pub kernels: BTreeMap<String, u64>,
}

impl std::fmt::Display for WorkgroupSummary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} matmuls, workgroups min {} median {} (",
            self.matmul_dispatches, self.min, self.median
        )?;
        for (i, (kernel, n)) in self.kernels.iter().enumerate() {
            let sep = if i == 0 { "" } else { ", " };
            write!(f, "{sep}{kernel} {n}")?;
        }
        write!(f, ")")
    }
}
