//! Shared by the fuzz targets: the loaders read files, so each input is
//! written to a file of this process first. An error must name the file.

use std::path::PathBuf;

/// Writes `data` to a file named `name` in a folder of this process and returns its path.
pub fn file(name: &str, data: &[u8]) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("captune-fuzz-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a scratch folder");
    let path = dir.join(name);
    std::fs::write(&path, data).expect("the input written");
    path
}

/// Panics (a finding) when a loader's error does not name its file.
pub fn check(result: anyhow::Result<()>, path: &std::path::Path) {
    if let Err(e) = result {
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let message = format!("{e:#}");
        assert!(message.contains(&name), "the error does not name the file: {message}");
    }
}
