//! Buffers and transfers on the GPU: tensors from the buffer pool and
//! groups of them laid out in one block, uploads through the recorder's
//! arena, and readbacks, waited for or begun without waiting.

use super::{GpuBackend, GpuBuffer, GpuIds, GpuTensor, UPLOAD_ARENA_BYTES, memory};
use std::cell::RefCell;
use std::rc::Rc;

/// A read begun without waiting ([`GpuBackend::begin_read`]): its staging
/// buffer is being mapped; it returns to the backend's pool once read.
pub struct PendingRead {
    staging: Option<wgpu::Buffer>,
    size: u64,
    mapped: std::sync::mpsc::Receiver<Result<(), wgpu::BufferAsyncError>>,
    device: wgpu::Device,
    free: Rc<RefCell<Vec<wgpu::Buffer>>>,
}

impl PendingRead {
    /// The bytes, once the device has copied and mapped them; `None`
    /// before, and after they were taken. Never waits.
    pub fn poll(&mut self) -> Option<Vec<u8>> {
        self.staging.as_ref()?;
        let _ = self.device.poll(wgpu::PollType::Poll);
        match self.mapped.try_recv() {
            Ok(result) => {
                result.expect("mapping a read buffer failed");
                Some(self.finish())
            }
            Err(_) => None,
        }
    }

    /// The mapped bytes; the buffer unmapped and back in the pool.
    fn finish(&mut self) -> Vec<u8> {
        let staging = self.staging.take().expect("a read is finished once");
        let bytes = staging
            .get_mapped_range(..self.size.max(4))
            .expect("read buffer is mapped")[..self.size as usize]
            .to_vec();
        staging.unmap();
        self.free.borrow_mut().push(staging);
        bytes
    }
}

impl Drop for PendingRead {
    /// A read nobody took: its mapping is waited for (by then the device
    /// has usually finished, a later readback having waited for it), so
    /// that its buffer can serve another read.
    fn drop(&mut self) {
        if self.staging.is_some() {
            let _ = self.device.poll(wgpu::PollType::wait_indefinitely());
            if let Ok(Ok(())) = self.mapped.recv() {
                self.finish();
            }
        }
    }
}

impl GpuBackend {
    /// A pooled buffer for `len` elements (at least one is allocated:
    /// wgpu cannot bind an empty buffer), and whether it is new (zeros).
    pub(super) fn allocate(&self, len: usize) -> (GpuBuffer, bool) {
        let (block, fresh) = self.pool.take(&self.device, (len.max(1) * 4) as u64);
        if fresh {
            self.count(|c| c.buffers_created += 1);
        }
        (GpuBuffer::new(block, len, self.pool.clone()), fresh)
    }

    /// A buffer of `len` zeros: a reused one is cleared by a recorded command.
    pub(super) fn zeroed(&self, len: usize) -> GpuBuffer {
        let (buffer, fresh) = self.allocate(len);
        if !fresh {
            self.with_encoder(|encoder| {
                encoder.clear_buffer(buffer.raw(), 0, Some(buffer.bound_bytes()))
            });
        }
        buffer
    }

    fn buffer_from_bytes(&self, bytes: &[u8], len: usize) -> GpuBuffer {
        let (buffer, _) = self.allocate(len);
        self.write_bytes(&buffer, bytes);
        buffer
    }

    pub(super) fn new_tensor(&self, data: &[f32]) -> GpuTensor {
        GpuTensor(self.buffer_from_bytes(bytemuck::cast_slice(data), data.len()))
    }

    pub(super) fn new_ids(&self, data: &[u32]) -> GpuIds {
        GpuIds(self.buffer_from_bytes(bytemuck::cast_slice(data), data.len()))
    }

    /// A scratch tensor for a multi-pass kernel whose first pass writes
    /// every element before any is read: not cleared (a clear would end
    /// the compute pass). Dropping it right after recording is fine: its
    /// buffer goes back to the pool, and only commands recorded later can
    /// reuse it.
    pub(super) fn scratch(&self, len: usize) -> GpuTensor {
        GpuTensor(self.allocate(len).0)
    }

    /// Elements between the starts of two tensors of a group: the
    /// device's storage-binding offset alignment.
    fn group_align(&self) -> usize {
        (self.limits.min_storage_buffer_offset_alignment as usize / 4).max(1)
    }

    /// Tensors holding `data`, laid out one after another in one block
    /// (zeros between them), so that an op over the whole group is one
    /// dispatch ([`Backend::span`]); apart, where the group would exceed
    /// what one binding may cover.
    pub(super) fn group(&self, data: &[&[f32]]) -> Vec<GpuTensor> {
        let lens: Vec<usize> = data.iter().map(|d| d.len()).collect();
        let (starts, total) = memory::group_layout(&lens, self.group_align());
        let bytes = (total * 4) as u64;
        if bytes > self.limits.max_storage_buffer_binding_size
            || bytes > self.limits.max_buffer_size
        {
            return data.iter().map(|d| self.new_tensor(d)).collect();
        }
        let whole = self.zeroed(total);
        starts
            .iter()
            .zip(data)
            .map(|(&start, d)| {
                let view = whole.view((start * 4) as u64, d.len());
                if d.iter().any(|&x| x != 0.0) {
                    self.write_bytes(&view, bytemuck::cast_slice(d));
                }
                GpuTensor(view)
            })
            .collect()
    }

    /// One tensor covering `group` where it is a group's members in order
    /// (padding included).
    pub(super) fn covering(&self, group: &[&GpuTensor]) -> Option<GpuTensor> {
        let (first, last) = (group.first()?, group.last()?);
        let lens: Vec<usize> = group.iter().map(|t| t.0.len).collect();
        let (starts, total) = memory::group_layout(&lens, self.group_align());
        let base = first.0.offset;
        let laid_out = group
            .iter()
            .zip(&starts)
            .all(|(t, &start)| t.0.same_block(&first.0) && t.0.offset == base + (start * 4) as u64);
        (laid_out && last.0.same_block(&first.0)).then(|| GpuTensor(first.0.view(base, total)))
    }

    /// The staging buffer, at least `size` bytes.
    fn staging(&self, size: u64) -> wgpu::Buffer {
        let mut staging = self.staging.borrow_mut();
        match &*staging {
            Some(b) if b.size() >= size => b.clone(),
            _ => {
                self.count(|c| c.buffers_created += 1);
                let b = self.device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some("readback"),
                    size: memory::size_class(size),
                    usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                    mapped_at_creation: false,
                });
                *staging = Some(b.clone());
                b
            }
        }
    }

    pub(super) fn read_bytes(&self, src: &GpuBuffer) -> Vec<u8> {
        let size = (src.len * 4) as u64;
        if size == 0 {
            return Vec::new();
        }
        self.count(|c| c.readbacks += 1);
        let staging = self.staging(size);
        self.with_encoder(|encoder| {
            encoder.copy_buffer_to_buffer(src.raw(), src.offset, &staging, 0, size)
        });
        self.submit();
        self.map_read(&staging, size)
    }

    /// Starts copying `src` to a staging buffer of its own and mapping it,
    /// without waiting ([`PendingRead::poll`] takes the bytes).
    pub(crate) fn begin_read(&self, src: &GpuBuffer) -> PendingRead {
        let size = (src.len * 4).max(4) as u64;
        self.count(|c| c.async_reads += 1);
        let pooled = {
            let mut free = self.async_staging.borrow_mut();
            let at = free.iter().position(|b| b.size() >= size);
            at.map(|at| free.swap_remove(at))
        };
        let staging = pooled.unwrap_or_else(|| {
            self.count(|c| c.buffers_created += 1);
            self.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("read without waiting"),
                size: memory::size_class(size),
                usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            })
        });
        if src.len > 0 {
            self.with_encoder(|encoder| {
                encoder.copy_buffer_to_buffer(src.raw(), src.offset, &staging, 0, size)
            });
        }
        self.submit();
        let (tx, rx) = std::sync::mpsc::channel();
        staging.map_async(wgpu::MapMode::Read, ..size, move |result| {
            let _ = tx.send(result);
        });
        PendingRead {
            staging: Some(staging),
            size: (src.len * 4) as u64,
            mapped: rx,
            device: self.device.clone(),
            free: self.async_staging.clone(),
        }
    }

    pub(super) fn map_read(&self, staging: &wgpu::Buffer, size: u64) -> Vec<u8> {
        let (tx, rx) = std::sync::mpsc::channel();
        staging.map_async(wgpu::MapMode::Read, ..size, move |result| {
            let _ = tx.send(result);
        });
        self.device
            .poll(wgpu::PollType::wait_indefinitely())
            .expect("GPU device lost while waiting for a readback");
        rx.recv()
            .expect("map callback dropped")
            .expect("mapping a readback buffer failed");
        let bytes = staging
            .get_mapped_range(..size)
            .expect("readback buffer is mapped")
            .to_vec();
        staging.unmap();
        bytes
    }

    /// Copies `bytes` into `dst` at this point of the program: through the
    /// upload arena and a recorded copy, or, for a write larger than a
    /// quarter of the arena, after submitting what is recorded.
    pub(super) fn write_bytes(&self, dst: &GpuBuffer, bytes: &[u8]) {
        if bytes.is_empty() {
            return;
        }
        if bytes.len() as u64 > UPLOAD_ARENA_BYTES / 4 {
            // Queue writes run before the next submission's commands.
            self.submit();
            self.queue.write_buffer(dst.raw(), dst.offset, bytes);
            return;
        }
        if self.recorder.borrow().uploads.len() + bytes.len() > UPLOAD_ARENA_BYTES as usize {
            self.submit();
        }
        let offset = {
            let mut rec = self.recorder.borrow_mut();
            let offset = rec.uploads.len();
            rec.uploads.extend_from_slice(bytes);
            offset as u64
        };
        self.with_encoder(|encoder| {
            encoder.copy_buffer_to_buffer(
                &self.upload_buffer,
                offset,
                dst.raw(),
                dst.offset,
                bytes.len() as u64,
            )
        });
    }
}
