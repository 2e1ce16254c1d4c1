//! The WGSL kernel families, embedded in the binary. One file per family in
//! `shaders/`, each with `shaders/prelude.wgsl` (shared helpers) prepended,
//! since WGSL has no imports. `tests/suite/kernels/shaders_validate.rs` checks that this
//! list and the folder agree and that naga accepts every family.

/// `(family, prelude + shaders/<family>.wgsl)`.
macro_rules! family {
    ($name:literal) => {
        (
            $name,
            concat!(
                include_str!("../shaders/prelude.wgsl"),
                include_str!(concat!("../shaders/", $name, ".wgsl"))
            ),
        )
    };
}

pub const SHADERS: &[(&str, &str)] = &[
    family!("adamw"),
    family!("attention"),
    family!("beam"),
    family!("choose"),
    family!("elementwise"),
    family!("embedding"),
    family!("heads"),
    family!("layernorm"),
    family!("logprob"),
    family!("lstm"),
    family!("matmul"),
    family!("normalize"),
    family!("pool"),
    family!("reduce"),
    family!("sequence"),
    family!("softmax"),
];

/// The file every family's source starts with.
pub const PRELUDE: &str = include_str!("../shaders/prelude.wgsl");

/// The source of the family `name`, prelude included.
pub fn source(name: &str) -> &'static str {
    SHADERS
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, src)| *src)
        .unwrap_or_else(|| panic!("no shader family named {name}"))
}
