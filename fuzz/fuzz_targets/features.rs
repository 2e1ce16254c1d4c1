#![no_main]
#[path = "input.rs"]
mod input;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let path = input::file("features.safetensors", data);
    input::check(
        captune::data::features::Features::load(&path, None).map(|_| ()),
        &path,
    );
});
