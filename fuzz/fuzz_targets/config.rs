#![no_main]
#[path = "input.rs"]
mod input;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let path = input::file("config.toml", data);
    input::check(
        captune::captioner::run::RunConfig::load(&path).map(|_| ()),
        &path,
    );
});
