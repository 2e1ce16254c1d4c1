#![no_main]
#[path = "input.rs"]
mod input;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let path = input::file("checkpoint.pt", data);
    input::check(
        captune::torch_checkpoint::read_state_dict(&path, None).map(|_| ()),
        &path,
    );
});
