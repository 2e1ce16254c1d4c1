//! The GPU backend: wgpu + the WGSL kernels in `shaders/`.
//!
//! Ops record dispatches into one command encoder and, until something
//! needs a copy, one compute pass. Each dispatch's parameters go into a CPU
//! arena, and host data written to tensors into an upload arena copied
//! inside the command stream; both are uploaded in one write each just
//! before the encoder is submitted, so a training step touches the queue
//! once. Work is submitted when a result is read back, at
//! [`Backend::submit`] (the end of a training step) or at [`Backend::flush`].
//! Buffers come from a pool ([`memory`]) and bind groups from a cache, so
//! a step that repeats the previous one's shapes creates neither.
//!
//! Each kernel family's ops are in the file named after its shader (as on
//! the CPU, in `src/cpu/`); `ops` implements [`crate::backend::Backend`]
//! over them.

mod adamw;
pub mod adapter;
mod attention;
mod beam;
mod choose;
mod elementwise;
mod embedding;
mod heads;
mod layernorm;
mod logprob;
mod lstm;
mod matmul;
mod matmul_plan;
mod memory;
mod normalize;
mod ops;
mod pool;
mod profile_queries;
mod reduce;
mod sequence;
mod softmax;
mod transfer;

use crate::backend::{DeviceCounters, WorkgroupCounts};
use crate::kernel_profile::{self as profile, KernelProfile};
use anyhow::{Context, Result};
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;
use std::time::{Duration, Instant};

pub use matmul_plan::{MatmulKernel, MatmulPlan, MatmulTile, k_split, plan as matmul_plan};
use memory::BufferPool;
pub use memory::GpuBuffer;
use profile_queries::Profiler;
pub use transfer::PendingRead;

/// f32 storage on the GPU.
pub struct GpuTensor(GpuBuffer);
/// u32 storage on the GPU.
pub struct GpuIds(GpuBuffer);

impl crate::backend::Storage for GpuTensor {
    fn len(&self) -> usize {
        self.0.len
    }
}

impl crate::backend::Storage for GpuIds {
    fn len(&self) -> usize {
        self.0.len
    }
}

/// A size or index as the kernels take it.
fn u(x: usize) -> u32 {
    u32::try_from(x).expect("size exceeds u32: the WGSL kernels index with u32")
}

/// wgpu's runtime checks on captune's own shaders: the bounds checks
/// stay (no kernel reads or writes outside its bindings), the loop
/// bounding goes. That check gives every loop a hidden counter; on
/// NVIDIA's Vulkan driver it kept the loops over register tiles from being
/// unrolled, so the matmul's accumulators left the registers and a
/// training step of the `shapes` preset took six times as long (measured
/// on an H100: docs/results.md, "What the shader checks cost"). Dropping
/// it is sound for code whose every loop ends, as captune's do: each is a
/// `for` over a counter, or a binary search that narrows at every step
/// (`tests/suite/kernels/shaders_validate.rs` refuses any other kind).
fn shader_runtime_checks() -> wgpu::ShaderRuntimeChecks {
    let mut checks = wgpu::ShaderRuntimeChecks::checked();
    checks.force_loop_bounding = false;
    checks
}

struct Pipeline {
    pipeline: wgpu::ComputePipeline,
    layout: wgpu::BindGroupLayout,
    /// The storage buffers' binding numbers the entry point uses, in order.
    storage_bindings: Vec<u32>,
}

/// Bytes of dispatch parameters one submission may hold.
const PARAMS_ARENA_BYTES: u64 = 1 << 20;
/// Bytes of host data one submission may upload through the arena; a
/// larger write (weights, at load) goes straight through the queue.
const UPLOAD_ARENA_BYTES: u64 = 8 << 20;
/// Bind groups kept; past this the cache starts again (it only grows when
/// shapes keep changing).
const BIND_GROUP_CACHE: usize = 8192;

/// The open encoder and pass, and the parameters and uploads of the
/// commands in them.
struct Recorder {
    encoder: Option<wgpu::CommandEncoder>,
    pass: Option<wgpu::ComputePass<'static>>,
    params: Vec<u8>,
    params_buffer: wgpu::Buffer,
    uploads: Vec<u8>,
}

/// What a bind group binds: the pipeline, the size of its parameter block
/// (whose place in the arena is a dynamic offset) and the buffers.
#[derive(Clone, PartialEq, Eq, Hash)]
struct BindKey {
    pipeline: usize,
    params_size: usize,
    /// (block id, byte offset, length) of each buffer.
    buffers: Vec<(u64, u64, usize)>,
}

pub struct GpuBackend {
    device: wgpu::Device,
    queue: wgpu::Queue,
    info: wgpu::AdapterInfo,
    limits: wgpu::Limits,
    features: wgpu::Features,
    matmul_kernel: Cell<MatmulKernel>,
    modules: RefCell<HashMap<&'static str, wgpu::ShaderModule>>,
    /// Each kernel family's bind group layout entries by entry point,
    /// read once per family.
    layouts: RefCell<HashMap<&'static str, HashMap<String, Vec<wgpu::BindGroupLayoutEntry>>>>,
    pipelines: RefCell<HashMap<(&'static str, &'static str), Rc<Pipeline>>>,
    recorder: RefCell<Recorder>,
    upload_buffer: wgpu::Buffer,
    pool: Rc<BufferPool>,
    /// The readback staging buffer, grown as needed.
    staging: RefCell<Option<wgpu::Buffer>>,
    /// Staging buffers of reads begun without waiting, back when read.
    async_staging: Rc<RefCell<Vec<wgpu::Buffer>>>,
    bind_groups: RefCell<HashMap<BindKey, wgpu::BindGroup>>,
    /// Bound in place of a key mask when a softmax has none.
    no_mask: GpuIds,
    /// Bound for a kernel's optional writable output when it has none.
    spare: GpuTensor,
    counters: Cell<DeviceCounters>,
    matmul_workgroups: RefCell<WorkgroupCounts>,
    /// Per-kernel timestamps while a kernel profile is on.
    profiler: RefCell<Option<Profiler>>,
}

impl GpuBackend {
    /// Opens a device on `adapter` with its best limits, and timestamp
    /// queries where it has them.
    pub fn new(adapter: &wgpu::Adapter) -> Result<Self> {
        let info = adapter.get_info();
        let features = adapter.features() & wgpu::Features::TIMESTAMP_QUERY;
        let limits = adapter.limits();
        let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
            label: Some("captune"),
            required_features: features,
            required_limits: limits.clone(),
            ..Default::default()
        }))
        .with_context(|| format!("could not open a device on adapter '{}'", info.name))?;
        let params_buffer = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("dispatch params"),
            size: PARAMS_ARENA_BYTES,
            usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let matmul_kernel = adapter::matmul_tiles_from_env(if adapter::is_hardware(&info) {
            MatmulKernel::Shared
        } else {
            MatmulKernel::Registers
        })?;
        let upload_buffer = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("uploads"),
            size: UPLOAD_ARENA_BYTES,
            usage: wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let pool = Rc::new(BufferPool::default());
        let (block, _) = pool.take(&device, 4);
        queue.write_buffer(&block.buffer, 0, &[1, 0, 0, 0]);
        let no_mask = GpuIds(GpuBuffer::new(block, 1, pool.clone()));
        let (block, _) = pool.take(&device, 4);
        let spare = GpuTensor(GpuBuffer::new(block, 1, pool.clone()));
        Ok(GpuBackend {
            device,
            queue,
            info,
            limits,
            features,
            matmul_kernel: Cell::new(matmul_kernel),
            modules: RefCell::default(),
            layouts: RefCell::default(),
            pipelines: RefCell::default(),
            recorder: RefCell::new(Recorder {
                encoder: None,
                pass: None,
                params: Vec::new(),
                params_buffer,
                uploads: Vec::new(),
            }),
            upload_buffer,
            pool,
            staging: RefCell::default(),
            async_staging: Rc::default(),
            bind_groups: RefCell::default(),
            no_mask,
            spare,
            counters: Cell::default(),
            matmul_workgroups: RefCell::default(),
            profiler: RefCell::default(),
        })
    }

    /// Adds to one of the counters.
    fn count(&self, what: impl FnOnce(&mut DeviceCounters)) {
        let mut c = self.counters.get();
        what(&mut c);
        self.counters.set(c);
    }

    /// Counts a matmul dispatch of `workgroups` workgroups by `kernel`.
    pub(crate) fn count_matmul(&self, kernel: &str, workgroups: u64) {
        let mut counts = self.matmul_workgroups.borrow_mut();
        *counts.workgroups.entry(workgroups).or_default() += 1;
        *counts.kernels.entry(kernel.to_string()).or_default() += 1;
    }

    pub fn matmul_workgroups(&self) -> WorkgroupCounts {
        self.matmul_workgroups.borrow().clone()
    }

    pub fn counters(&self) -> DeviceCounters {
        self.counters.get()
    }

    /// Device memory held: the pooled tensors' buffers, the upload and
    /// dispatch-parameter arenas and the readback staging buffer.
    pub fn device_memory_bytes(&self) -> u64 {
        let staging = self.staging.borrow().as_ref().map_or(0, wgpu::Buffer::size);
        let params = self.recorder.borrow().params_buffer.size();
        self.pool.bytes() + self.upload_buffer.size() + params + staging
    }

    /// The best adapter on the backends `CAPTUNE_WGPU_BACKEND` allows,
    /// hardware or software.
    pub fn best_available() -> Result<Self> {
        let backends = adapter::backends_from_env()?;
        let adapter = adapter::adapters(backends).into_iter().next().with_context(|| {
            format!(
                "no GPU adapter found on wgpu backends {backends:?}.\n\
                 Fix: install a Vulkan driver (Debian/Ubuntu: `sudo apt-get install mesa-vulkan-drivers` for the \
                 software adapter lavapipe, or your GPU vendor's driver), check {} if it is set, or use --device cpu.",
                adapter::BACKEND_ENV
            )
        })?;
        Self::new(&adapter)
    }

    pub fn info(&self) -> &wgpu::AdapterInfo {
        &self.info
    }

    pub fn matmul_kernel(&self) -> MatmulKernel {
        self.matmul_kernel.get()
    }

    /// Chooses the matmul kernel (tests run both; the default suits the adapter).
    pub fn set_matmul_kernel(&self, kernel: MatmulKernel) {
        self.matmul_kernel.set(kernel);
    }

    pub fn has_timestamps(&self) -> bool {
        self.features.contains(wgpu::Features::TIMESTAMP_QUERY)
    }

    // ---- recording ----

    fn pipeline(&self, shader: &'static str, entry: &'static str) -> Rc<Pipeline> {
        if let Some(p) = self.pipelines.borrow().get(&(shader, entry)) {
            return p.clone();
        }
        let mut modules = self.modules.borrow_mut();
        let module = modules.entry(shader).or_insert_with(|| {
            let desc = wgpu::ShaderModuleDescriptor {
                label: Some(shader),
                source: wgpu::ShaderSource::Wgsl(crate::shaders::source(shader).into()),
            };
            // SAFETY: every loop in captune's shaders ends (see
            // `shader_runtime_checks`), the one promise that dropping the
            // loop bounding asks for; the bounds checks stay.
            unsafe {
                self.device
                    .create_shader_module_trusted(desc, shader_runtime_checks())
            }
        });
        let mut layouts = self.layouts.borrow_mut();
        let entries = &layouts
            .entry(shader)
            .or_insert_with(|| layout_entries(crate::shaders::source(shader)))[entry];
        let layout = self
            .device
            .create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
                label: Some(entry),
                entries,
            });
        let mut storage_bindings: Vec<u32> = (entries.iter().map(|e| e.binding))
            .filter(|&b| b != 0)
            .collect();
        storage_bindings.sort_unstable();
        let pipeline_layout = self
            .device
            .create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
                label: Some(entry),
                bind_group_layouts: &[Some(&layout)],
                immediate_size: 0,
            });
        let pipeline = self
            .device
            .create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: Some(entry),
                layout: Some(&pipeline_layout),
                module,
                entry_point: Some(entry),
                compilation_options: Default::default(),
                cache: None,
            });
        let p = Rc::new(Pipeline {
            pipeline,
            layout,
            storage_bindings,
        });
        self.pipelines
            .borrow_mut()
            .insert((shader, entry), p.clone());
        p
    }

    /// Records one dispatch of `shader`'s `entry`: binding 0 is `params`,
    /// and `buffers` are the storage bindings the entry point uses, in the
    /// order of their numbers (1.., less any it leaves unused).
    fn dispatch<P: bytemuck::Pod>(
        &self,
        shader: &'static str,
        entry: &'static str,
        params: &P,
        buffers: &[&GpuBuffer],
        groups: [u32; 3],
    ) {
        if groups.contains(&0) {
            return;
        }
        let max = self.limits.max_compute_workgroups_per_dimension;
        assert!(
            groups.iter().all(|&g| g <= max),
            "{shader}/{entry}: grid {groups:?} exceeds {max} per dimension"
        );
        let pipeline = self.pipeline(shader, entry);
        let bytes = bytemuck::bytes_of(params);
        let align = self.limits.min_uniform_buffer_offset_alignment.max(16) as usize;
        if self.recorder.borrow().params.len() + align + bytes.len() > PARAMS_ARENA_BYTES as usize {
            self.submit();
        }
        let mut rec = self.recorder.borrow_mut();
        let offset = rec.params.len().next_multiple_of(align);
        rec.params.resize(offset, 0);
        rec.params.extend_from_slice(bytes);
        // The parameter block is bound at a dynamic offset, so the bind
        // group depends only on the buffers.
        let mut entries = vec![wgpu::BindGroupEntry {
            binding: 0,
            resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                buffer: &rec.params_buffer,
                offset: 0,
                size: wgpu::BufferSize::new(bytes.len() as u64),
            }),
        }];
        assert_eq!(
            buffers.len(),
            pipeline.storage_bindings.len(),
            "{shader}/{entry}: one buffer per storage binding it uses"
        );
        let limit = self.limits.max_storage_buffer_binding_size;
        for (b, &binding) in buffers.iter().zip(&pipeline.storage_bindings) {
            // Checked here to say what is too large: wgpu would only say
            // that the bind group is invalid.
            assert!(
                b.bound_bytes() <= limit,
                "{shader}/{entry}: a tensor of {} MiB is larger than this adapter binds \
                 ({} MiB, its max_storage_buffer_binding_size); use a smaller model or \
                 --device cpu",
                b.bound_bytes() >> 20,
                limit >> 20
            );
            entries.push(wgpu::BindGroupEntry {
                binding,
                resource: b.binding(),
            });
        }
        self.count(|c| c.dispatches += 1);
        let key = BindKey {
            pipeline: Rc::as_ptr(&pipeline) as usize,
            params_size: bytes.len(),
            buffers: buffers.iter().map(|b| (b.id(), b.offset, b.len)).collect(),
        };
        let mut cache = self.bind_groups.borrow_mut();
        let bind_group = match cache.get(&key) {
            Some(group) => group.clone(),
            None => {
                self.count(|c| c.bind_groups_created += 1);
                let group = self.device.create_bind_group(&wgpu::BindGroupDescriptor {
                    label: Some(entry),
                    layout: &pipeline.layout,
                    entries: &entries,
                });
                if cache.len() >= BIND_GROUP_CACHE {
                    cache.clear();
                }
                cache.insert(key, group.clone());
                group
            }
        };
        let mut profiler = self.profiler.borrow_mut();
        let profiled = profiler.is_some();
        if rec.pass.is_none() || profiled {
            self.count(|c| c.passes += 1);
        }
        let timestamps = profiler.as_mut().map(|p| {
            rec.pass = None;
            let encoder = rec.encoder.get_or_insert_with(|| {
                self.device
                    .create_command_encoder(&wgpu::CommandEncoderDescriptor::default())
            });
            let workgroups = groups.iter().map(|&g| g as u64).product();
            p.next(&self.device, encoder, (shader, entry, workgroups))
        });
        let pass = Self::open_pass(&self.device, &mut rec, timestamps);
        pass.set_pipeline(&pipeline.pipeline);
        pass.set_bind_group(0, &bind_group, &[offset as u32]);
        pass.dispatch_workgroups(groups[0], groups[1], groups[2]);
        if profiled {
            // The pass's end timestamp follows this dispatch alone.
            rec.pass = None;
        }
    }

    /// A 2-D grid of `workgroups` workgroups; kernels flatten it back.
    fn grid(&self, workgroups: usize) -> [u32; 3] {
        let max = self.limits.max_compute_workgroups_per_dimension as usize;
        let x = workgroups.min(max);
        [x as u32, workgroups.div_ceil(x.max(1)) as u32, 1]
    }

    /// The grid for one thread per element, 256 threads per workgroup.
    fn grid_for(&self, elements: usize) -> [u32; 3] {
        self.grid(elements.div_ceil(256))
    }

    fn open_pass<'r>(
        device: &wgpu::Device,
        rec: &'r mut Recorder,
        timestamps: Option<wgpu::ComputePassTimestampWrites<'_>>,
    ) -> &'r mut wgpu::ComputePass<'static> {
        if rec.pass.is_none() {
            let encoder = rec.encoder.get_or_insert_with(|| {
                device.create_command_encoder(&wgpu::CommandEncoderDescriptor::default())
            });
            let pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: Some("captune"),
                timestamp_writes: timestamps,
            });
            rec.pass = Some(pass.forget_lifetime());
        }
        rec.pass.as_mut().expect("pass was just opened")
    }

    /// Ends the open pass and hands the encoder to `f` (for copies).
    fn with_encoder(&self, f: impl FnOnce(&mut wgpu::CommandEncoder)) {
        let mut rec = self.recorder.borrow_mut();
        rec.pass = None;
        let encoder = rec.encoder.get_or_insert_with(|| {
            self.device
                .create_command_encoder(&wgpu::CommandEncoderDescriptor::default())
        });
        f(encoder);
    }

    /// Submits everything recorded, with its parameters.
    fn submit(&self) {
        let mut rec = self.recorder.borrow_mut();
        rec.pass = None;
        if let Some(encoder) = rec.encoder.take() {
            if !rec.params.is_empty() {
                self.queue.write_buffer(&rec.params_buffer, 0, &rec.params);
            }
            if !rec.uploads.is_empty() {
                self.queue
                    .write_buffer(&self.upload_buffer, 0, &rec.uploads);
            }
            self.queue.submit([encoder.finish()]);
            self.count(|c| c.submissions += 1);
        }
        rec.params.clear();
        rec.uploads.clear();
    }

    fn wait(&self) {
        self.device
            .poll(wgpu::PollType::wait_indefinitely())
            .expect("GPU device lost");
    }

    /// Starts timing every dispatch on its own (`finish_kernel_profile`
    /// sums them); false, and nothing started, where the adapter has no
    /// timestamp queries.
    pub fn start_kernel_profile(&self) -> bool {
        if !self.has_timestamps() {
            return false;
        }
        self.submit();
        *self.profiler.borrow_mut() = Some(Profiler::new(&self.device));
        true
    }

    /// Runs what is recorded and returns each kernel's GPU time since
    /// `start_kernel_profile`; `None` where no profile is on.
    pub fn finish_kernel_profile(&self) -> Option<KernelProfile> {
        let mut profiler = self.profiler.borrow_mut().take()?;
        self.with_encoder(|encoder| profiler.resolve(&self.device, encoder));
        self.submit();
        let mut dispatches = Vec::new();
        for (readback, keys) in profiler.into_resolved() {
            let ticks: Vec<u64> =
                bytemuck::pod_collect_to_vec(&self.map_read(&readback, readback.size()));
            for (key, pair) in keys.into_iter().zip(ticks.chunks_exact(2)) {
                dispatches.push((key, pair[1].saturating_sub(pair[0])));
            }
        }
        Some(profile::summarise(
            &dispatches,
            self.queue.get_timestamp_period() as f64,
            profile::SizeMeaning::Workgroups,
        ))
    }

    /// Runs `f` (which records ops) and returns the GPU time it took:
    /// from timestamp queries around one compute pass where the adapter has
    /// them, else wall-clock time from submission to completion.
    pub fn time(&self, f: impl FnOnce()) -> Duration {
        self.submit();
        self.wait();
        if !self.has_timestamps() {
            let start = Instant::now();
            f();
            self.submit();
            self.wait();
            return start.elapsed();
        }
        let queries = self.device.create_query_set(&wgpu::QuerySetDescriptor {
            label: Some("timing"),
            ty: wgpu::QueryType::Timestamp,
            count: 2,
        });
        let resolved = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("timestamps"),
            size: 16,
            usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
            mapped_at_creation: false,
        });
        let staging = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("timestamps readback"),
            size: 16,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        {
            let mut rec = self.recorder.borrow_mut();
            Self::open_pass(
                &self.device,
                &mut rec,
                Some(wgpu::ComputePassTimestampWrites {
                    query_set: &queries,
                    beginning_of_pass_write_index: Some(0),
                    end_of_pass_write_index: Some(1),
                }),
            );
        }
        f();
        self.with_encoder(|encoder| {
            encoder.resolve_query_set(&queries, 0..2, &resolved, 0);
            encoder.copy_buffer_to_buffer(&resolved, 0, &staging, 0, 16);
        });
        self.submit();
        let ticks: Vec<u64> = bytemuck::pod_collect_to_vec(&self.map_read(&staging, 16));
        let ns =
            ticks[1].saturating_sub(ticks[0]) as f64 * self.queue.get_timestamp_period() as f64;
        Duration::from_nanos(ns as u64)
    }
}

/// The bind group layout of each entry point of the kernel family
/// `source`: its parameter block (binding 0, the one uniform) at a dynamic
/// offset, then each storage buffer it uses, read-only where the shader
/// says so. Read from the shader with naga, as wgpu's automatic layout
/// would be, but with the dynamic offset that lets one bind group serve
/// every dispatch of the same buffers.
fn layout_entries(source: &str) -> HashMap<String, Vec<wgpu::BindGroupLayoutEntry>> {
    let module = naga::front::wgsl::parse_str(source)
        .unwrap_or_else(|e| panic!("a kernel family does not parse: {e}"));
    let info = naga::valid::Validator::new(
        naga::valid::ValidationFlags::all(),
        naga::valid::Capabilities::all(),
    )
    .validate(&module)
    .unwrap_or_else(|e| panic!("a kernel family does not validate: {e:?}"));
    module
        .entry_points
        .iter()
        .enumerate()
        .map(|(index, entry)| {
            let uses = info.get_entry_point(index);
            let entries = module
                .global_variables
                .iter()
                .filter(|(handle, _)| !uses[*handle].is_empty())
                .filter_map(|(_, var)| binding_entry(var))
                .collect();
            (entry.name.clone(), entries)
        })
        .collect()
}

/// The layout entry of a global: a uniform at a dynamic offset, or a
/// storage buffer; `None` for anything unbound.
fn binding_entry(var: &naga::GlobalVariable) -> Option<wgpu::BindGroupLayoutEntry> {
    let binding = var.binding.as_ref()?;
    let (ty, has_dynamic_offset) = match var.space {
        naga::AddressSpace::Uniform => (wgpu::BufferBindingType::Uniform, true),
        naga::AddressSpace::Storage { access } => (
            wgpu::BufferBindingType::Storage {
                read_only: !access.contains(naga::StorageAccess::STORE),
            },
            false,
        ),
        _ => return None,
    };
    Some(wgpu::BindGroupLayoutEntry {
        binding: binding.binding,
        visibility: wgpu::ShaderStages::COMPUTE,
        ty: wgpu::BindingType::Buffer {
            ty,
            has_dynamic_offset,
            min_binding_size: None,
        },
        count: None,
    })
}

pub(crate) fn describe(info: &wgpu::AdapterInfo) -> String {
    format!("{} ({:?}, {:?})", info.name, info.backend, info.device_type)
}
