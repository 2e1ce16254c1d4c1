//! The real window: `captune app` under a virtual X server (Xvfb) trains
//! a tiny run for 120 frames, saves a screenshot and its frame
//! statistics; the screenshot must show the UI, not a blank frame.
//!
//! Needs Xvfb (scripts/test.sh installs it). Without it the test fails
//! with that advice, unless CAPTUNE_SKIP_WINDOW_TEST=1 says to skip.

use crate::common;

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

struct VirtualDisplay {
    server: Child,
    name: String,
}

impl Drop for VirtualDisplay {
    fn drop(&mut self) {
        // SIGTERM, so that Xvfb removes its lock file and socket.
        let terminated = Command::new("kill")
            .arg(self.server.id().to_string())
            .status()
            .is_ok_and(|s| s.success());
        if !terminated {
            let _ = self.server.kill();
        }
        let _ = self.server.wait();
    }
}

fn virtual_display() -> Option<VirtualDisplay> {
    // A display number no server holds: a killed Xvfb leaves its lock
    // file and socket behind, and a new one refuses a display that has
    // them (and the wait below would find the old socket).
    let number = (0..400)
        .map(|n| 90 + (std::process::id() + n) % 400)
        .find(|n| {
            !PathBuf::from(format!("/tmp/.X{n}-lock")).exists()
                && !PathBuf::from(format!("/tmp/.X11-unix/X{n}")).exists()
        })
        .expect("a free X display number");
    let name = format!(":{number}");
    let server = match Command::new("Xvfb")
        .args([
            name.as_str(),
            "-screen",
            "0",
            "1280x800x24",
            "-nolisten",
            "tcp",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
    {
        Ok(s) => s,
        Err(e) => {
            if std::env::var("CAPTUNE_SKIP_WINDOW_TEST").as_deref() == Ok("1") {
                common::skip(&format!(
                    "no Xvfb ({e}), and CAPTUNE_SKIP_WINDOW_TEST=1 is set"
                ));
                return None;
            }
            panic!(
                "cannot start Xvfb ({e}): install it (Debian: apt-get install xvfb; scripts/test.sh \
                 does so as root) or set CAPTUNE_SKIP_WINDOW_TEST=1"
            );
        }
    };
    let mut display = VirtualDisplay { server, name };
    // Xvfb opens its socket when it is ready; on a loaded 2-core machine
    // (the rest of the suite beside it) that has taken over 5 s.
    let socket = PathBuf::from(format!("/tmp/.X11-unix/X{number}"));
    let started = std::time::Instant::now();
    while !socket.exists() {
        if let Ok(Some(status)) = display.server.try_wait() {
            panic!("Xvfb {} exited at start ({status})", display.name);
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "Xvfb {} opened no socket ({}) within 60 s",
            display.name,
            socket.display()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    Some(display)
}

#[test]
fn the_window_trains_and_its_screenshot_is_not_blank() {
    let Some(display) = virtual_display() else {
        return;
    };
    let dir = crate::common::fresh_temp("window");
    std::fs::create_dir_all(&dir).unwrap();
    let (shot, stats) = (dir.join("app.png"), dir.join("stats.json"));
    let run = Command::new(env!("CARGO_BIN_EXE_captune"))
        .args(["--device", "cpu", "app", "--preset", "tiny", "--start"])
        .args([
            "--shapes-train",
            "400",
            "--shapes-val",
            "50",
            "--shapes-test",
            "50",
        ])
        .args(["--frames", "120", "--size", "1000x700", "--out"])
        .arg(dir.join("run"))
        .arg("--screenshot")
        .arg(&shot)
        .arg("--stats")
        .arg(&stats)
        .env("DISPLAY", &display.name)
        // A cache of its own: the world is generated and embedded while the window shows it.
        .env("CAPTUNE_CACHE", dir.join("cache"))
        .env_remove("WAYLAND_DISPLAY")
        .output()
        .unwrap();
    assert!(
        run.status.success(),
        "captune app failed:\n{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let image = image::open(&shot).unwrap().to_rgb8();
    assert!(
        image.width() >= 900 && image.height() >= 600,
        "{:?}",
        image.dimensions()
    );
    let mut colours = std::collections::HashSet::new();
    let mut bright = 0usize;
    for p in image.pixels() {
        colours.insert(p.0);
        bright += usize::from(p.0.iter().any(|&c| c > 150));
    }
    // A blank or single-colour frame has a handful of colours; the UI has
    // anti-aliased text, plots and widgets.
    assert!(
        colours.len() > 50,
        "{} colours: a blank frame",
        colours.len()
    );
    assert!(
        bright > 500,
        "{bright} bright pixels: no text or curves drawn"
    );
    let stats: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&stats).unwrap()).unwrap();
    assert!(stats["frames"].as_u64().unwrap() >= 120, "{stats}");
    assert!(stats["frames_per_s"].as_f64().unwrap() > 0.0, "{stats}");
    assert!(
        stats["loading_frames"].as_u64().unwrap() >= 1,
        "the window opens before the data is loaded: {stats}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
