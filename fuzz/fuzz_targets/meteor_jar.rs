#![no_main]
#[path = "input.rs"]
mod input;

use captune::metrics::meteor::{Meteor, MeteorData};

// METEOR's jar (its deflated resources) beside the tiny data folder's
// paraphrase table, read and used to score a caption.
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let jar = input::file("meteor-1.5.jar", data);
    let dir = jar.parent().unwrap();
    static TABLE: std::sync::Once = std::sync::Once::new();
    TABLE.call_once(|| {
        let table = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/data/meteor/tiny/data/paraphrase-en.gz");
        std::fs::create_dir_all(dir.join("data")).unwrap();
        std::fs::copy(table, dir.join("data/paraphrase-en.gz")).unwrap();
    });
    let scored = MeteorData::at(dir).and_then(|d| {
        let mut meteor = Meteor::load(&d)?;
        meteor
            .score(&["a big dog".to_string()], &[vec!["a large hound".to_string()]])
            .map(|_| ())
    });
    input::check(scored, &jar);
});
