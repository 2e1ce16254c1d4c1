//! Per-kernel GPU time: while a profile is on, every dispatch runs in a
//! compute pass of its own with a timestamp at the pass's start and end.
//! Separate passes cost a little of what they measure (no overlap between
//! dispatches), so benchmarks time their steps without a profile and
//! profile one more step.

use crate::kernel_profile::Key;

/// Dispatches timed per query set; a full set is resolved and a new one begun.
const DISPATCHES_PER_SET: u32 = 1024;

/// Timestamp queries being written, and sets written but not yet read.
pub(super) struct Profiler {
    queries: wgpu::QuerySet,
    keys: Vec<Key>,
    /// Resolved sets: their readback buffer and their dispatches' keys.
    resolved: Vec<(wgpu::Buffer, Vec<Key>)>,
}

impl Profiler {
    pub(super) fn new(device: &wgpu::Device) -> Self {
        Profiler {
            queries: query_set(device),
            keys: Vec::new(),
            resolved: Vec::new(),
        }
    }

    /// The timestamp writes of the pass that will hold the next dispatch,
    /// resolving the current set into `encoder` first when it is full.
    pub(super) fn next(
        &mut self,
        device: &wgpu::Device,
        encoder: &mut wgpu::CommandEncoder,
        key: Key,
    ) -> wgpu::ComputePassTimestampWrites<'_> {
        if self.keys.len() as u32 == DISPATCHES_PER_SET {
            self.resolve(device, encoder);
        }
        let first = 2 * self.keys.len() as u32;
        self.keys.push(key);
        wgpu::ComputePassTimestampWrites {
            query_set: &self.queries,
            beginning_of_pass_write_index: Some(first),
            end_of_pass_write_index: Some(first + 1),
        }
    }

    /// Copies the current set's timestamps to a readback buffer and begins
    /// a new set.
    pub(super) fn resolve(&mut self, device: &wgpu::Device, encoder: &mut wgpu::CommandEncoder) {
        if self.keys.is_empty() {
            return;
        }
        let queries = 2 * self.keys.len() as u32;
        let bytes = 8 * queries as u64;
        let resolved = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("profile timestamps"),
            size: bytes,
            usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
            mapped_at_creation: false,
        });
        let readback = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("profile readback"),
            size: bytes,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        encoder.resolve_query_set(&self.queries, 0..queries, &resolved, 0);
        encoder.copy_buffer_to_buffer(&resolved, 0, &readback, 0, bytes);
        let keys = std::mem::take(&mut self.keys);
        self.resolved.push((readback, keys));
        self.queries = query_set(device);
    }

    /// The readback buffers and their keys, once everything is resolved
    /// and submitted.
    pub(super) fn into_resolved(self) -> Vec<(wgpu::Buffer, Vec<Key>)> {
        self.resolved
    }
}

fn query_set(device: &wgpu::Device) -> wgpu::QuerySet {
    device.create_query_set(&wgpu::QuerySetDescriptor {
        label: Some("profile"),
        ty: wgpu::QueryType::Timestamp,
        count: 2 * DISPATCHES_PER_SET,
    })
}
