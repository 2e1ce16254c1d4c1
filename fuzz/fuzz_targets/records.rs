#![no_main]
#[path = "input.rs"]
mod input;

use captune::app::follow::RunFiles;
use captune::app::history::History;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    for name in ["log.jsonl", "samples.jsonl", "metrics.jsonl"] {
        let path = input::file(name, data);
        let dir = path.parent().unwrap();
        let result = RunFiles::new(dir).poll(&mut History::default()).map(|_| ());
        input::check(result, &path);
        // Resuming's repair of the records never panics on a damaged line.
        let _ = captune::captioner::run_folder::RunFolder::new(dir).recover();
        std::fs::remove_file(&path).unwrap();
    }
});
