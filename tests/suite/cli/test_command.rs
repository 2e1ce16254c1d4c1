//! The test command (`scripts/test.sh`) as a non-root user sees it, run
//! with stand-ins for `id`, `sudo`, `apt-get` and `cargo` on a PATH
//! without Xvfb or a browser: with sudo it installs through sudo; without
//! it, it prints the apt-get line to run, goes on, and the tests it could
//! not equip are told to skip. (Linux only: on macOS the script checks no
//! Linux packages.)
#![cfg(target_os = "linux")]

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The tools the script uses, taken from the real PATH.
const TOOLS: [&str; 14] = [
    "bash", "mktemp", "sort", "grep", "awk", "tee", "sed", "uname", "dirname", "basename", "rm",
    "cat", "env", "date",
];

fn script(dir: &Path, name: &str, body: &str) {
    let path = dir.join(name);
    std::fs::write(&path, format!("#!/bin/bash\n{body}\n")).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// A PATH folder with the script's tools, a non-root `id`, an `apt-get`
/// that must not run without root, and a `cargo` that writes the skip
/// variables it was given and one passing test result.
fn stand_ins(dir: &Path, log: &Path) -> PathBuf {
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let path = std::env::var_os("PATH").unwrap();
    for tool in TOOLS {
        if let Some(real) = std::env::split_paths(&path)
            .map(|d| d.join(tool))
            .find(|p| p.is_file())
        {
            std::os::unix::fs::symlink(real, bin.join(tool)).unwrap();
        }
    }
    let log = log.display();
    script(&bin, "id", "echo 1000");
    script(
        &bin,
        "apt-get",
        &format!("echo \"apt-get without root: $*\" >> {log}; exit 100"),
    );
    script(
        &bin,
        "cargo",
        &format!(
            "echo \"cargo $* window=${{CAPTUNE_SKIP_WINDOW_TEST:-}}\" >> {log}\n\
             echo 'test result: ok. 1 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out'"
        ),
    );
    bin
}

fn run(bin: &Path) -> (bool, String) {
    run_with(bin, &["--no-run"])
}

/// The script with `args`, from the stand-ins' PATH alone.
fn run_with(bin: &Path, args: &[&str]) -> (bool, String) {
    let out = Command::new(bin.join("bash"))
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/test.sh"))
        .args(args)
        .env_clear()
        .env("PATH", bin)
        .env("HOME", bin)
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text)
}

fn scratch(name: &str) -> PathBuf {
    let dir = crate::common::fresh_temp(&format!("test-command-{name}"));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn without_root_or_sudo_it_prints_the_apt_line_and_goes_on_with_skips() {
    let dir = scratch("no-sudo");
    let log = dir.join("log");
    let bin = stand_ins(&dir, &log);
    let (ok, text) = run(&bin);
    assert!(ok, "{text}");
    assert!(text.contains("sudo apt-get install xvfb"), "{text}");
    assert!(text.contains("sudo apt-get install chromium"), "{text}");
    assert!(
        text.contains("summary: 1 passed, 0 failed, 0 skipped"),
        "{text}"
    );
    let log = std::fs::read_to_string(&log).unwrap();
    assert!(!log.contains("apt-get without root"), "{log}");
    assert!(
        log.contains("cargo test --locked --no-fail-fast --no-run window=1"),
        "{log}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn with_sudo_it_installs_through_sudo() {
    let dir = scratch("sudo");
    let log = dir.join("log");
    let bin = stand_ins(&dir, &log);
    // A sudo that needs no password and records what it was asked to run.
    script(
        &bin,
        "sudo",
        &format!(
            "[ \"$*\" = \"-n true\" ] || echo \"sudo $*\" >> {}",
            log.display()
        ),
    );
    let (ok, text) = run(&bin);
    assert!(ok, "{text}");
    let log = std::fs::read_to_string(&log).unwrap();
    assert!(log.contains("sudo apt-get update -qq"), "{log}");
    assert!(
        log.contains("sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq xvfb"),
        "{log}"
    );
    assert!(log.contains("apt-get install -y -qq chromium"), "{log}");
    // Installed, so the window test is not told to skip.
    assert!(
        log.contains("cargo test --locked --no-fail-fast --no-run window=\n"),
        "{log}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Without arguments (as CI runs it): the build, the unit tests, each
/// area of tests/suite on its own with its filter, whatever lies outside
/// the areas, the fuzz and the doc tests, each timed, and one summary
/// over them all.
#[test]
fn without_arguments_it_runs_and_times_each_area() {
    let dir = scratch("areas");
    let log = dir.join("log");
    let bin = stand_ins(&dir, &log);
    script(&bin, "sudo", "true");
    let (ok, text) = run_with(&bin, &[]);
    assert!(ok, "{text}");
    let suite = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/suite");
    let mut areas: Vec<String> = std::fs::read_dir(&suite)
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| e.path().is_dir() && e.file_name() != "common")
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    areas.sort();
    assert!(areas.len() >= 8, "{areas:?}");
    let log = std::fs::read_to_string(&log).unwrap();
    let calls: Vec<&str> = log.lines().filter(|l| l.starts_with("cargo ")).collect();
    let mut want = vec![
        "cargo test --locked --no-fail-fast --no-run".to_string(),
        "cargo test --locked --no-fail-fast --lib --bins".to_string(),
    ];
    for area in &areas {
        want.push(format!(
            "cargo test --locked --no-fail-fast --test suite -- {area}::"
        ));
    }
    let skips: Vec<String> = areas.iter().map(|a| format!("--skip {a}::")).collect();
    want.push(format!(
        "cargo test --locked --no-fail-fast --test suite -- {}",
        skips.join(" ")
    ));
    want.push("cargo test --locked --no-fail-fast --test fuzz_loaders".to_string());
    want.push("cargo test --locked --no-fail-fast --doc".to_string());
    let got: Vec<&str> = calls
        .iter()
        .map(|c| c.split(" window=").next().unwrap())
        .collect();
    assert_eq!(got, want, "{log}");
    // Each step timed, and every step's one passing test summed.
    for label in areas
        .iter()
        .map(String::as_str)
        .chain(["build", "unit", "fuzz", "doc"])
    {
        assert!(
            text.lines()
                .any(|l| l.trim_start().starts_with(label) && l.ends_with(" s")),
            "no time for {label}: {text}"
        );
    }
    let summary = format!("summary: {} passed, 0 failed, 0 skipped", want.len());
    assert!(text.contains(&summary), "{summary}: {text}");
    std::fs::remove_dir_all(&dir).unwrap();
}
