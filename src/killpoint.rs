//! Named points where a test stops a real `captune` process, to kill it
//! there (tests/suite/training/runs.rs). `CAPTUNE_KILLPOINT=NAME:N` makes the N-th
//! pass through the point `NAME` run its setup (e.g. write half a record),
//! print `killpoint NAME reached` on standard error and wait to be
//! killed. Without the variable a point costs one comparison.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};

struct Target {
    name: String,
    pass: usize,
    seen: AtomicUsize,
}

fn target() -> Option<&'static Target> {
    static TARGET: OnceLock<Option<Target>> = OnceLock::new();
    TARGET
        .get_or_init(|| {
            let spec = std::env::var("CAPTUNE_KILLPOINT").ok()?;
            let (name, pass) = spec.split_once(':')?;
            Some(Target {
                name: name.to_string(),
                pass: pass.parse().ok()?,
                seen: AtomicUsize::new(0),
            })
        })
        .as_ref()
}

/// Passes the point `name`; `setup` runs only where the process is to stop.
pub fn here(name: &str, setup: impl FnOnce()) {
    let Some(t) = target() else { return };
    if t.name != name || t.seen.fetch_add(1, Ordering::SeqCst) + 1 != t.pass {
        return;
    }
    setup();
    eprintln!("killpoint {name} reached");
    loop {
        std::thread::sleep(std::time::Duration::from_secs(3600));
    }
}
