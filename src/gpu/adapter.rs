//! Finding wgpu adapters and describing them.

use super::MatmulKernel;
use anyhow::{Result, bail};

/// Environment variable that narrows the wgpu backends tried.
pub const BACKEND_ENV: &str = "CAPTUNE_WGPU_BACKEND";

/// The wgpu backends to try: those named by `CAPTUNE_WGPU_BACKEND`
/// (comma-separated: vulkan, metal, dx12, gl), else Vulkan, Metal and DX12.
/// GL is opt-in: it lacks compute features the others have, and probing it
/// without a display prints EGL errors.
pub fn backends_from_env() -> Result<wgpu::Backends> {
    match std::env::var(BACKEND_ENV) {
        Ok(value) => parse_backends(&value),
        Err(_) => Ok(wgpu::Backends::PRIMARY),
    }
}

pub fn parse_backends(value: &str) -> Result<wgpu::Backends> {
    let mut backends = wgpu::Backends::empty();
    for name in value
        .split(',')
        .map(|s| s.trim().to_ascii_lowercase())
        .filter(|s| !s.is_empty())
    {
        backends |= match name.as_str() {
            "vulkan" | "vk" => wgpu::Backends::VULKAN,
            "metal" | "mtl" => wgpu::Backends::METAL,
            "dx12" | "d3d12" => wgpu::Backends::DX12,
            "gl" | "gles" | "opengl" => wgpu::Backends::GL,
            other => bail!(
                "{BACKEND_ENV}={value}: unknown wgpu backend '{other}'; use vulkan, metal, dx12 or gl"
            ),
        };
    }
    if backends.is_empty() {
        bail!(
            "{BACKEND_ENV} is set but names no backend; use vulkan, metal, dx12 or gl, or unset it"
        );
    }
    Ok(backends)
}

/// Environment variable that chooses the large products' matmul tiles.
pub const MATMUL_TILES_ENV: &str = "CAPTUNE_MATMUL_TILES";

/// The large products' kernel family named by `CAPTUNE_MATMUL_TILES`
/// (`shared`: 128 x 128 tiles through workgroup memory; `buffered`: the
/// same through two staging buffers; `registers`: 64 x 64 tiles in
/// registers), else `default`: for comparing them end to end.
pub fn matmul_tiles_from_env(default: MatmulKernel) -> Result<MatmulKernel> {
    match std::env::var(MATMUL_TILES_ENV).as_deref() {
        Err(_) => Ok(default),
        Ok("shared") => Ok(MatmulKernel::Shared),
        Ok("buffered") => Ok(MatmulKernel::SharedBuffered),
        Ok("registers") => Ok(MatmulKernel::Registers),
        Ok(other) => {
            bail!("{MATMUL_TILES_ENV}={other}: use shared, buffered or registers, or unset it")
        }
    }
}

/// Every adapter wgpu finds on the given backends, best first: discrete,
/// integrated, virtual, then software (CPU-type) adapters; Vulkan before
/// the others within a type.
pub fn adapters(backends: wgpu::Backends) -> Vec<wgpu::Adapter> {
    let instance = wgpu::Instance::new(wgpu::InstanceDescriptor {
        backends,
        ..wgpu::InstanceDescriptor::new_without_display_handle()
    });
    let mut found = pollster::block_on(instance.enumerate_adapters(backends));
    found.sort_by_key(|a| {
        let info = a.get_info();
        (
            type_rank(info.device_type),
            info.backend != wgpu::Backend::Vulkan,
        )
    });
    found
}

fn type_rank(t: wgpu::DeviceType) -> u8 {
    match t {
        wgpu::DeviceType::DiscreteGpu => 0,
        wgpu::DeviceType::IntegratedGpu => 1,
        wgpu::DeviceType::VirtualGpu => 2,
        wgpu::DeviceType::Cpu => 3,
        wgpu::DeviceType::Other => 4,
    }
}

/// A real GPU, as opposed to a software rasteriser such as lavapipe.
pub fn is_hardware(info: &wgpu::AdapterInfo) -> bool {
    type_rank(info.device_type) <= 2
}

/// What `captune info` reports about an adapter.
#[derive(Debug, serde::Serialize)]
pub struct AdapterReport {
    pub name: String,
    pub backend: String,
    pub device_type: String,
    pub driver: String,
    pub driver_info: String,
    pub max_storage_buffers_per_shader_stage: u32,
    pub max_storage_buffer_binding_size: u64,
    pub max_buffer_size: u64,
    pub max_compute_workgroup_storage_size: u32,
    pub max_compute_invocations_per_workgroup: u32,
    pub max_compute_workgroups_per_dimension: u32,
    pub subgroups: bool,
    pub subgroup_size_range: Option<(u32, u32)>,
    pub shader_f16: bool,
    pub timestamp_query: bool,
    pub timestamp_query_inside_passes: bool,
    /// The cooperative-matrix (tensor-core) shapes the adapter offers, as
    /// `MxNxK A,B->C` (empty without wgpu's experimental feature).
    pub cooperative_matrices: Vec<String>,
}

impl AdapterReport {
    pub fn new(adapter: &wgpu::Adapter) -> Self {
        let info = adapter.get_info();
        let limits = adapter.limits();
        let features = adapter.features();
        let subgroups = features.contains(wgpu::Features::SUBGROUP);
        AdapterReport {
            name: info.name.clone(),
            backend: format!("{:?}", info.backend),
            device_type: format!("{:?}", info.device_type),
            driver: info.driver.clone(),
            driver_info: info.driver_info.clone(),
            max_storage_buffers_per_shader_stage: limits.max_storage_buffers_per_shader_stage,
            max_storage_buffer_binding_size: limits.max_storage_buffer_binding_size,
            max_buffer_size: limits.max_buffer_size,
            max_compute_workgroup_storage_size: limits.max_compute_workgroup_storage_size,
            max_compute_invocations_per_workgroup: limits.max_compute_invocations_per_workgroup,
            max_compute_workgroups_per_dimension: limits.max_compute_workgroups_per_dimension,
            subgroups,
            subgroup_size_range: subgroups
                .then_some((info.subgroup_min_size, info.subgroup_max_size)),
            shader_f16: features.contains(wgpu::Features::SHADER_F16),
            timestamp_query: features.contains(wgpu::Features::TIMESTAMP_QUERY),
            timestamp_query_inside_passes: features
                .contains(wgpu::Features::TIMESTAMP_QUERY_INSIDE_PASSES),
            cooperative_matrices: if features
                .contains(wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX)
            {
                (adapter.cooperative_matrix_properties().iter())
                    .map(|p| {
                        format!(
                            "{}x{}x{} {:?}->{:?}",
                            p.m_size, p.n_size, p.k_size, p.ab_type, p.cr_type
                        )
                    })
                    .collect()
            } else {
                Vec::new()
            },
        }
    }
}

impl std::fmt::Display for AdapterReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let yes_no = |b: bool| if b { "yes" } else { "no" };
        let mib = |bytes: u64| bytes as f64 / (1024.0 * 1024.0);
        writeln!(f, "  adapter:        {}", self.name)?;
        writeln!(f, "  backend:        {}", self.backend)?;
        writeln!(f, "  device type:    {}", self.device_type)?;
        writeln!(f, "  driver:         {} {}", self.driver, self.driver_info)?;
        writeln!(
            f,
            "  storage buffers per stage:   {}",
            self.max_storage_buffers_per_shader_stage
        )?;
        writeln!(
            f,
            "  storage binding size:        {:.0} MiB",
            mib(self.max_storage_buffer_binding_size)
        )?;
        writeln!(
            f,
            "  max buffer size:             {:.0} MiB",
            mib(self.max_buffer_size)
        )?;
        writeln!(
            f,
            "  workgroup storage:           {} KiB",
            self.max_compute_workgroup_storage_size / 1024
        )?;
        writeln!(
            f,
            "  invocations per workgroup:   {}",
            self.max_compute_invocations_per_workgroup
        )?;
        writeln!(
            f,
            "  workgroups per dimension:    {}",
            self.max_compute_workgroups_per_dimension
        )?;
        match self.subgroup_size_range {
            Some((lo, hi)) => writeln!(f, "  subgroups:                   yes (size {lo}..={hi})")?,
            None => writeln!(f, "  subgroups:                   no")?,
        }
        writeln!(
            f,
            "  shader f16:                  {}",
            yes_no(self.shader_f16)
        )?;
        writeln!(
            f,
            "  timestamp queries:           {} (inside passes: {})",
            yes_no(self.timestamp_query),
            yes_no(self.timestamp_query_inside_passes)
        )?;
        match self.cooperative_matrices.as_slice() {
            [] => write!(f, "  cooperative matrices:        no"),
            shapes => write!(f, "  cooperative matrices:        {}", shapes.join(", ")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backend_names_parse_and_combine() {
        assert_eq!(parse_backends("vulkan").unwrap(), wgpu::Backends::VULKAN);
        assert_eq!(
            parse_backends("Metal, dx12").unwrap(),
            wgpu::Backends::METAL | wgpu::Backends::DX12
        );
        assert_eq!(parse_backends("gl").unwrap(), wgpu::Backends::GL);
        assert!(parse_backends("").is_err());
        assert!(
            parse_backends("cuda")
                .unwrap_err()
                .to_string()
                .contains("unknown wgpu backend 'cuda'")
        );
    }
}
