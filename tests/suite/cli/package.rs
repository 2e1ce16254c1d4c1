//! captune as a user receives it: `cargo package` makes a crate within
//! crates.io's size limit, and that crate, unpacked and installed with
//! `cargo install`, gives a `captune` that runs a small demo from an
//! empty folder (its assets embedded, nothing read from the source tree).
//!
//! The install builds the packaged sources in the dev profile into this
//! build's target folder, so the dependencies already built are reused.
//! Its binary is renamed `captune-packaged` first: under its own name
//! cargo would put it where the other tests run `captune` from, replacing
//! this build's binary while they run it.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;

/// crates.io refuses a crate file larger than this.
const CRATES_IO_LIMIT: u64 = 10 * 1024 * 1024;

fn cargo() -> Command {
    Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
}

fn run(cmd: &mut Command, what: &str) {
    let out = cmd.output().unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(
        out.status.success(),
        "{what} failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Sets every file under `dir` to have been modified now.
fn touch_all(dir: &Path) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            touch_all(&path);
        } else {
            let file = std::fs::File::options().write(true).open(&path).unwrap();
            file.set_modified(std::time::SystemTime::now()).unwrap();
        }
    }
}

/// The name the packaged crate's binary is built under here.
const PACKAGED_BINARY: &str = "captune-packaged";

/// Renames the binary target of a packaged manifest, where cargo package
/// lists it as `[[bin]] name = "captune"`.
fn rename_binary(manifest: &Path) {
    let text = std::fs::read_to_string(manifest).unwrap();
    let target = "[[bin]]\nname = \"captune\"\n";
    assert_eq!(
        text.matches(target).count(),
        1,
        "{}: expected exactly one `[[bin]] name = \"captune\"`:\n{text}",
        manifest.display()
    );
    let renamed = text.replace(target, &format!("[[bin]]\nname = \"{PACKAGED_BINARY}\"\n"));
    std::fs::write(manifest, renamed).unwrap();
}

#[test]
fn the_packaged_crate_installs_and_runs_the_demo_from_an_empty_folder() {
    let source = Path::new(env!("CARGO_MANIFEST_DIR"));
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| source.join("target"));
    let scratch = crate::common::fresh_temp("package");
    std::fs::create_dir_all(&scratch).unwrap();

    // A working tree may hold uncommitted changes; the crate is made from
    // what is there.
    run(
        cargo()
            .current_dir(source)
            .args(["package", "--no-verify", "--allow-dirty", "--offline"])
            .arg("--target-dir")
            .arg(&target),
        "cargo package",
    );
    let version = env!("CARGO_PKG_VERSION");
    let crate_file = target.join(format!("package/captune-{version}.crate"));
    let size = std::fs::metadata(&crate_file).unwrap().len();
    assert!(
        size < CRATES_IO_LIMIT,
        "{}: {size} bytes, over crates.io's limit",
        crate_file.display()
    );

    run(
        Command::new("tar")
            .arg("xzf")
            .arg(&crate_file)
            .arg("-C")
            .arg(&scratch),
        "unpacking the crate",
    );
    let unpacked = scratch.join(format!("captune-{version}"));
    // The crate's files keep the times they were packed with, which can
    // be older than this target folder's build of an earlier crate: cargo
    // would then install that build (and put it where the other tests
    // find captune). New times make it build these sources.
    touch_all(&unpacked);
    rename_binary(&unpacked.join("Cargo.toml"));
    let root = scratch.join("root");
    run(
        cargo()
            .args(["install", "--debug", "--locked", "--offline", "--path"])
            .arg(&unpacked)
            // The crate itself unoptimised (this test then takes a quarter
            // of the time; its demo is small). The dependencies keep the
            // profile's settings, and so their builds.
            .args(["--config", "profile.dev.opt-level=0"])
            .arg("--root")
            .arg(&root)
            .env("CARGO_TARGET_DIR", &target),
        "cargo install",
    );

    let empty = scratch.join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    let mut demo = Command::new(root.join(format!("bin/{PACKAGED_BINARY}")));
    demo.current_dir(&empty)
        .env("CAPTUNE_CACHE", scratch.join("cache"))
        .env_remove("CAPTUNE_DEVICE")
        .args(["--device", "cpu", "demo", "--preset", "tiny"])
        .args([
            "--mle-epochs",
            "1",
            "--smile-epochs",
            "1",
            "--eval-images",
            "16",
        ])
        .args(common::TINY_WORLD_ARGS);
    let out = demo.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("MLE") && stdout.contains("SMILE") && stdout.contains("fact recall"),
        "{stdout}"
    );
    // The runs go under the folder the command ran in.
    assert!(empty.join("runs/demo/smile").is_dir());
    std::fs::remove_dir_all(&scratch).unwrap();
}
