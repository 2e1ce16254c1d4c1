//! Models written once against the ops: parameters, layers, the shared
//! transformer, and the retriever built from them.

pub mod blip;
pub mod blip_original;
pub mod checkpoint;
pub mod clip;
pub mod gpt2;
pub mod gpt2_lm;
pub mod hf;
pub mod kv_cache;
pub mod layers;
pub mod params;
pub mod retriever;
pub mod token_tower;
pub mod transformer;
pub mod vision;
