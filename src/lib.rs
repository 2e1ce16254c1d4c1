//! captune: train and inspect image-caption decoders on WGSL compute
//! shaders (wgpu) or the CPU reference backend.

pub mod app;
pub mod backend;
pub mod bench;
pub mod cache;
pub mod captioner;
pub mod cpu;
pub mod data;
pub mod device;
pub mod gpu;
pub mod index;
pub mod kernel_profile;
pub mod killpoint;
pub mod metrics;
pub mod model;
pub mod ops;
pub mod optim;
pub mod progress;
pub mod report;
pub mod retriever;
pub mod shaders;
pub mod shapes;
pub mod source;
pub mod tensorfile;
pub mod torch_checkpoint;
pub mod zip;
