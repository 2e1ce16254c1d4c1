#![no_main]
#[path = "input.rs"]
mod input;

use captune::cpu::CpuBackend;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let path = input::file("checkpoint.safetensors", data);
    let b = CpuBackend::new();
    input::check(
        captune::captioner::Checkpoint::load(&b, &path, 1).map(|_| ()),
        &path,
    );
    input::check(
        captune::retriever::Checkpoint::load(&b, &path, 1).map(|_| ()),
        &path,
    );
});
