#![no_main]
#[path = "input.rs"]
mod input;

use captune::data::{Dataset, Item, Split, images};

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let path = input::file("image.png", data);
    let mut set = Dataset {
        name: "fuzzed".into(),
        items: vec![Item {
            id: "1".into(),
            split: Split::Test,
            image: path.clone(),
            captions: Vec::new(),
            scene: None,
        }],
        report: Default::default(),
    };
    let hidden = indicatif::ProgressBar::hidden();
    input::check(images::load(&mut set, 16, &hidden).map(|_| ()), &path);
});
