//! Device memory that a training step does not allocate: buffers freed by
//! dropping their tensor go back to a pool and serve later allocations of
//! the same size class, and host data reaches the device through an upload
//! arena copied inside the command stream.
//!
//! Reuse is safe because every op is recorded, in program order, on one
//! queue: a buffer dropped after some dispatch read it can only be
//! rewritten by commands recorded after that dispatch (a caching allocator
//! on a single stream). wgpu zero-fills a new buffer; a reused one is
//! cleared by a recorded command where zeros are promised.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;

/// Usages every pooled buffer has, so that any freed buffer fits any use.
pub(super) const USAGE: wgpu::BufferUsages = wgpu::BufferUsages::STORAGE
    .union(wgpu::BufferUsages::COPY_SRC)
    .union(wgpu::BufferUsages::COPY_DST);

/// One device buffer and the id bind groups are cached under.
pub(super) struct Block {
    pub id: u64,
    pub buffer: wgpu::Buffer,
}

#[derive(Default)]
pub(super) struct BufferPool {
    free: RefCell<HashMap<u64, Vec<Block>>>,
    next_id: Cell<u64>,
    /// Bytes of every buffer created: the pool keeps what it made, so this
    /// is what its tensors hold on the device, at least their peak (size
    /// classes round requests up).
    bytes: Cell<u64>,
}

/// The bytes a request for `bytes` is served with: powers of two up to
/// 4 KiB, then steps of 1/16 of the next power of two (at most 1/8 of the
/// request wasted), so that
/// allocations of nearly equal sizes (a batch's index arrays) share buffers.
pub(super) fn size_class(bytes: u64) -> u64 {
    let bytes = bytes.max(16);
    let power = bytes.next_power_of_two();
    if power <= 4096 {
        power
    } else {
        bytes.next_multiple_of(power / 16)
    }
}

impl BufferPool {
    /// A buffer of at least `bytes`, and whether it was just created (and
    /// so holds zeros).
    pub fn take(&self, device: &wgpu::Device, bytes: u64) -> (Block, bool) {
        let class = size_class(bytes);
        if let Some(block) = self.free.borrow_mut().get_mut(&class).and_then(Vec::pop) {
            return (block, false);
        }
        let id = self.next_id.get();
        self.next_id.set(id + 1);
        self.bytes.set(self.bytes.get() + class);
        let buffer = device.create_buffer(&wgpu::BufferDescriptor {
            label: None,
            size: class,
            usage: USAGE,
            mapped_at_creation: false,
        });
        (Block { id, buffer }, true)
    }

    /// Bytes of every buffer the pool has created.
    pub fn bytes(&self) -> u64 {
        self.bytes.get()
    }

    pub fn give_back(&self, block: Block) {
        self.free
            .borrow_mut()
            .entry(block.buffer.size())
            .or_default()
            .push(block);
    }
}

/// `len` elements (f32 or u32) at byte `offset` of a pooled block: the
/// whole block, or one tensor of a group laid out in one block. The block
/// returns to the pool when its last tensor is dropped.
pub struct GpuBuffer {
    block: Option<Rc<Block>>,
    pub(super) offset: u64,
    pub(super) len: usize,
    pool: Rc<BufferPool>,
}

impl GpuBuffer {
    pub(super) fn new(block: Block, len: usize, pool: Rc<BufferPool>) -> Self {
        GpuBuffer {
            block: Some(Rc::new(block)),
            offset: 0,
            len,
            pool,
        }
    }

    /// `len` elements at byte `offset` of the same block.
    pub(super) fn view(&self, offset: u64, len: usize) -> GpuBuffer {
        GpuBuffer {
            block: self.block.clone(),
            offset,
            len,
            pool: self.pool.clone(),
        }
    }

    fn block(&self) -> &Block {
        self.block.as_ref().expect("a live buffer holds its block")
    }

    pub(super) fn raw(&self) -> &wgpu::Buffer {
        &self.block().buffer
    }

    pub(super) fn id(&self) -> u64 {
        self.block().id
    }

    /// Bytes bound for it (wgpu binds no empty range).
    pub(super) fn bound_bytes(&self) -> u64 {
        (self.len.max(1) * 4) as u64
    }

    pub(super) fn binding(&self) -> wgpu::BindingResource<'_> {
        wgpu::BindingResource::Buffer(wgpu::BufferBinding {
            buffer: self.raw(),
            offset: self.offset,
            size: wgpu::BufferSize::new(self.bound_bytes()),
        })
    }

    pub(super) fn same_block(&self, other: &GpuBuffer) -> bool {
        match (&self.block, &other.block) {
            (Some(a), Some(b)) => Rc::ptr_eq(a, b),
            _ => false,
        }
    }
}

impl Drop for GpuBuffer {
    fn drop(&mut self) {
        if let Some(block) = self.block.take().and_then(Rc::into_inner) {
            self.pool.give_back(block);
        }
    }
}

/// Where each of tensors of `lens` elements starts in a group laid out in
/// one block, in elements: one after another, each at a multiple of
/// `align` elements (the device's storage-binding offset alignment); and
/// the group's total length.
pub(super) fn group_layout(lens: &[usize], align: usize) -> (Vec<usize>, usize) {
    let mut starts = Vec::with_capacity(lens.len());
    let mut end: usize = 0;
    for &len in lens {
        let start = end.next_multiple_of(align);
        starts.push(start);
        end = start + len.max(1);
    }
    (starts, end)
}

#[cfg(test)]
mod tests {
    use super::{group_layout, size_class};

    #[test]
    fn group_members_start_aligned_one_after_another() {
        let (starts, total) = group_layout(&[100, 0, 64, 3], 64);
        assert_eq!(starts, [0, 128, 192, 256]);
        assert_eq!(total, 259);
    }

    #[test]
    fn size_classes_round_up_by_at_most_an_eighth_above_4_kib() {
        assert_eq!(size_class(1), 16);
        assert_eq!(size_class(100), 128);
        assert_eq!(size_class(4096), 4096);
        assert_eq!(size_class(4097), 4608);
        assert_eq!(size_class(9000), 9216);
        for bytes in (4097..2_000_000).step_by(997) {
            let c = size_class(bytes);
            assert!(c >= bytes && c - bytes <= bytes / 8 + 1, "{bytes} -> {c}");
        }
    }
}
