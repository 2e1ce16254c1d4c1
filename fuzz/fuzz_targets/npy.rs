#![no_main]
#[path = "input.rs"]
mod input;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let path = input::file("features.npy", data);
    let ids = input::file("ids.txt", b"1\n2\n3\n");
    input::check(
        captune::data::features::Features::load(&path, Some(&ids)).map(|_| ()),
        &path,
    );
});
