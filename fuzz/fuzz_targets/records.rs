#![no_main]
#[path = "input.rs"]
mod input;

use captune::app::follow::RunFiles;
use captune::app::history::History;
use captune::captioner::run_folder::RunFolder;
use std::collections::HashMap;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    for name in ["log.jsonl", "samples.jsonl", "metrics.jsonl"] {
        let path = input::file(name, data);
        let dir = path.parent().unwrap();
        let result = RunFiles::new(dir).poll(&mut History::default()).map(|_| ());
        input::check(result, &path);
        // Resuming's repair of the records (it needs a saved state: two
        // state files whose metadata put the run at step 1).
        let position = HashMap::from([
            ("step".to_string(), "1".to_string()),
            ("epoch".to_string(), "1".to_string()),
            ("adamw_step".to_string(), "1".to_string()),
        ]);
        for state in ["checkpoint.safetensors", "optimizer.safetensors"] {
            captune::tensorfile::write(&dir.join(state), &[], position.clone()).unwrap();
        }
        input::check(RunFolder::new(dir).recover().map(|_| ()), &path);
        std::fs::remove_file(&path).unwrap();
    }
});
