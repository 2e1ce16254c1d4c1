//! Choosing what runs the ops: `--device auto|gpu|cpu` (or `CAPTUNE_DEVICE`).

use crate::cpu::CpuBackend;
use crate::gpu::{GpuBackend, adapter};
use anyhow::{Context, Result};

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, Default)]
pub enum DeviceChoice {
    /// A hardware GPU when there is one, else the CPU backend.
    #[default]
    Auto,
    /// A GPU adapter, software ones (lavapipe) included.
    Gpu,
    /// The CPU backend.
    Cpu,
}

/// Either backend, chosen at run time. Generic code runs on it through
/// [`with_backend!`](crate::with_backend).
#[allow(clippy::large_enum_variant)] // one per process: boxing would only add a deref
pub enum AnyBackend {
    Cpu(CpuBackend),
    Gpu(GpuBackend),
}

/// The chosen backend and why it was chosen.
pub struct Selection {
    pub backend: AnyBackend,
    pub reason: String,
}

/// Runs `$body` with `$b` bound to the backend inside an [`AnyBackend`].
#[macro_export]
macro_rules! with_backend {
    ($any:expr, $b:ident => $body:expr) => {
        match $any {
            $crate::device::AnyBackend::Cpu($b) => $body,
            $crate::device::AnyBackend::Gpu($b) => $body,
        }
    };
}

pub fn select(choice: DeviceChoice) -> Result<Selection> {
    let backends = adapter::backends_from_env()?;
    match choice {
        DeviceChoice::Cpu => Ok(cpu("--device cpu was asked for".into())),
        DeviceChoice::Gpu => {
            let backend = GpuBackend::best_available().context("--device gpu")?;
            let info = backend.info().clone();
            let kind = if adapter::is_hardware(&info) {
                "hardware"
            } else {
                "software"
            };
            Ok(Selection {
                reason: format!(
                    "--device gpu: best adapter is {kind}: {}",
                    crate::gpu::describe(&info)
                ),
                backend: AnyBackend::Gpu(backend),
            })
        }
        DeviceChoice::Auto => {
            let found = adapter::adapters(backends);
            match found.iter().find(|a| adapter::is_hardware(&a.get_info())) {
                Some(hw) => {
                    let info = hw.get_info();
                    match GpuBackend::new(hw) {
                        Ok(backend) => Ok(Selection {
                            reason: format!("hardware GPU found: {}", crate::gpu::describe(&info)),
                            backend: AnyBackend::Gpu(backend),
                        }),
                        Err(e) => Ok(cpu(format!(
                            "hardware GPU {} could not be opened ({e:#})",
                            info.name
                        ))),
                    }
                }
                None => match found.first() {
                    Some(sw) => Ok(cpu(format!(
                        "only a software GPU adapter was found ({}), which is much slower than the CPU backend; \
                         --device gpu uses it anyway",
                        sw.get_info().name
                    ))),
                    None => Ok(cpu("no GPU adapter was found".into())),
                },
            }
        }
    }
}

fn cpu(reason: String) -> Selection {
    Selection {
        backend: AnyBackend::Cpu(CpuBackend::new()),
        reason,
    }
}

impl std::fmt::Display for Selection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (kind, name) = crate::with_backend!(&self.backend, b => {
            use crate::backend::Backend;
            (b.kind(), b.adapter_name())
        });
        write!(f, "backend: {kind} on {name}\n  why: {}", self.reason)
    }
}
