#![no_main]
#[path = "input.rs"]
mod input;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let path = input::file("dataset_fuzz.json", data);
    input::check(captune::data::karpathy::load_references(&path).map(|_| ()), &path);
});
