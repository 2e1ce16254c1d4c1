//! The WGSL kernel families, embedded in the binary. One file per family in
//! `shaders/`; `tests/shaders_validate.rs` checks that this list and the
//! folder agree and that naga accepts every file.

pub const SHADERS: &[(&str, &str)] = &[
    ("adamw", include_str!("../shaders/adamw.wgsl")),
    ("elementwise", include_str!("../shaders/elementwise.wgsl")),
    ("embedding", include_str!("../shaders/embedding.wgsl")),
    ("heads", include_str!("../shaders/heads.wgsl")),
    ("layernorm", include_str!("../shaders/layernorm.wgsl")),
    ("logprob", include_str!("../shaders/logprob.wgsl")),
    ("matmul", include_str!("../shaders/matmul.wgsl")),
    ("reduce", include_str!("../shaders/reduce.wgsl")),
    ("softmax", include_str!("../shaders/softmax.wgsl")),
];

/// The source of the family `name`.
pub fn source(name: &str) -> &'static str {
    SHADERS
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, src)| *src)
        .unwrap_or_else(|| panic!("no shader family named {name}"))
}
