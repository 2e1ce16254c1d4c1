#![no_main]
#[path = "input.rs"]
mod input;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let path = input::file("captions_val2014.json", data);
    input::check(captune::data::coco::load_references(&path).map(|_| ()), &path);
});
