//! Real-data loaders, the vocabulary, and bad input: every problem names
//! the file and the item, and the rest of the data set still loads.

use crate::common;

use captune::data::vocab::{BOS, EOS, UNK, Vocab};
use captune::data::{Split, coco, images, karpathy};
use std::path::{Path, PathBuf};

fn temp_dir(name: &str) -> PathBuf {
    let dir = crate::common::fresh_temp(&format!("data-{name}"));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn png(path: &Path) {
    image::RgbImage::from_pixel(8, 8, image::Rgb([10, 200, 30]))
        .save(path)
        .unwrap();
}

#[test]
fn flickr8k_loads_with_its_splits_tokens_and_vocabulary() {
    let Some(flickr8k) = common::flickr8k() else {
        return;
    };
    let file = flickr8k.join("dataset_flickr8k.json");
    let data = karpathy::load(&file, None).unwrap();
    assert!(data.report.is_clean(), "{}", data.report);
    let count = |s| data.split(s).count();
    assert_eq!(
        (count(Split::Train), count(Split::Val), count(Split::Test)),
        (6000, 1000, 1000)
    );
    assert!(
        data.items
            .iter()
            .all(|i| i.captions.len() == 5 && i.image.is_file())
    );
    let tokens: usize = data
        .items
        .iter()
        .flat_map(|i| &i.captions)
        .map(|c| c.tokens.len())
        .sum();
    let mean = tokens as f64 / 40_000.0;
    assert!(
        (10.0..12.0).contains(&mean),
        "mean caption length {mean} (the README says about 10.8)"
    );
    assert!(data.items.iter().flat_map(|i| &i.captions).all(|c| {
        c.tokens
            .iter()
            .all(|t| t.chars().all(|ch| !ch.is_uppercase()) && t != "." && t != ",")
    }));

    let vocab = Vocab::build(&data, 5);
    assert!((2000..4000).contains(&vocab.len()), "{} words", vocab.len());
    assert!(vocab.id("dog") > UNK);
    let caption = &data.items[0].captions[0];
    let ids = vocab.encode(&caption.tokens, 6);
    assert_eq!(
        (ids.len(), ids[0], ids[5]),
        (6, BOS, EOS),
        "truncated to max_len with <bos> and <eos>"
    );

    // Decoding a few images at a smaller size.
    let mut few = data.only(Split::Test);
    few.items.truncate(3);
    let bar = indicatif::ProgressBar::hidden();
    let imgs = images::load(&mut few, 32, &bar).unwrap();
    assert_eq!(bar.position(), few.items.len() as u64, "one tick per image");
    assert_eq!((imgs.len(), imgs.pixels.len()), (3, 3 * 32 * 32 * 3));
}

#[test]
fn vocabulary_counts_training_words_only_and_maps_the_rest_to_unk() {
    let dir = temp_dir("vocab");
    png(&dir.join("a.png"));
    let json = r#"{"images": [
        {"filename": "a.png", "imgid": 0, "split": "train", "sentences": [{"raw": "A red dog."}, {"raw": "a red cat"}]},
        {"filename": "a.png", "imgid": 1, "split": "test", "sentences": [{"raw": "zebra zebra zebra"}]}]}"#;
    std::fs::write(dir.join("d.json"), json).unwrap();
    let data = karpathy::load(&dir.join("d.json"), Some(&dir)).unwrap();
    let vocab = Vocab::build(&data, 2);
    assert_eq!(vocab.words(), ["a", "red"]);
    assert_eq!(
        vocab.encode(&["red".into(), "zebra".into()], 10),
        vec![BOS, vocab.id("red"), UNK, EOS]
    );
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn bad_items_are_skipped_with_the_file_and_item_named() {
    let dir = temp_dir("bad");
    png(&dir.join("good.png"));
    png(&dir.join("one_caption.png"));
    png(&dir.join("no_tokens.png"));
    png(&dir.join("odd_split.png"));
    std::fs::write(dir.join("broken.png"), b"not a png").unwrap();
    let json = r#"{"dataset": "mini", "images": [
        {"filename": "good.png", "imgid": 0, "split": "train", "sentences": [{"raw": "A dog runs."}]},
        {"filename": "missing.png", "imgid": 1, "split": "train", "sentences": [{"raw": "A cat."}]},
        {"filename": "one_caption.png", "imgid": 2, "split": "val", "sentences": [{"raw": "?!"}, {"raw": "Two birds."}]},
        {"filename": "no_tokens.png", "imgid": 3, "split": "val", "sentences": [{"raw": "..."}]},
        {"imgid": 4, "split": "train", "sentences": []},
        {"filename": "odd_split.png", "imgid": 5, "split": "holdout", "sentences": [{"raw": "a man"}]},
        {"filename": "broken.png", "imgid": 6, "split": "test", "sentences": [{"raw": "a broken image"}]}
    ]}"#;
    let file = dir.join("dataset_mini.json");
    std::fs::write(&file, json).unwrap();
    let mut data = karpathy::load(&file, Some(&dir)).unwrap();
    let ids: Vec<&str> = data.items.iter().map(|i| i.id.as_str()).collect();
    assert_eq!(ids, ["0", "2", "6"]);
    assert_eq!(data.items[1].captions.len(), 1);
    assert_eq!(
        (data.report.skipped_items, data.report.skipped_captions),
        (4, 2)
    );
    let text = data.report.to_string();
    for needle in [
        "dataset_mini.json",
        "missing.png",
        "not found",
        "images[3]",
        "no caption with a token",
        "images[4]",
        "missing field `filename`",
        "\"holdout\"",
        "\"?!\"",
    ] {
        assert!(
            text.contains(needle),
            "the report names {needle:?}:\n{text}"
        );
    }
    // An unreadable image is found when decoding: that item goes, the rest stay.
    let imgs = images::load(&mut data, 16, &indicatif::ProgressBar::hidden()).unwrap();
    assert_eq!(imgs.len(), 2);
    assert_eq!(data.items.len(), 2);
    assert!(
        data.report.to_string().contains("broken.png"),
        "{}",
        data.report
    );

    // Malformed JSON: the file, line and column.
    let bad = dir.join("dataset_bad.json");
    std::fs::write(
        &bad,
        "{\"images\": [\n  {\"filename\": \"good.png\",\n   \"split\" \"train\"}\n]}",
    )
    .unwrap();
    let err = format!("{:#}", karpathy::load(&bad, Some(&dir)).unwrap_err());
    assert!(
        err.contains("dataset_bad.json") && err.contains("line 3"),
        "{err}"
    );
    // Nothing usable at all is an error, not an empty data set.
    std::fs::write(
        &bad,
        r#"{"images": [{"filename": "nope.png", "split": "train", "sentences": [{"raw": "a"}]}]}"#,
    )
    .unwrap();
    let err = format!("{:#}", karpathy::load(&bad, Some(&dir)).unwrap_err());
    assert!(
        err.contains("no usable image") && err.contains("nope.png"),
        "{err}"
    );
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn coco_annotation_files_load_with_the_split_from_the_file_name() {
    let dir = temp_dir("coco");
    png(&dir.join("COCO_val2014_1.jpg.png"));
    let json = r#"{"images": [{"id": 1, "file_name": "COCO_val2014_1.jpg.png"}, {"id": 2, "file_name": "gone.jpg"}],
        "annotations": [{"image_id": 1, "id": 10, "caption": "A Giraffe eating."}, {"image_id": 1, "id": 11, "caption": "tall animal"},
                        {"image_id": 2, "id": 12, "caption": "x"}, {"id": 13}]}"#;
    let file = dir.join("captions_val2014.json");
    std::fs::write(&file, json).unwrap();
    let data = coco::load(&file, &dir).unwrap();
    assert_eq!(data.items.len(), 1);
    assert_eq!(
        (data.items[0].id.as_str(), data.items[0].split),
        ("1", Split::Val)
    );
    assert_eq!(data.items[0].captions[0].tokens, ["a", "giraffe", "eating"]);
    assert_eq!(
        (data.report.skipped_items, data.report.skipped_captions),
        (1, 1)
    );
    let unnamed = dir.join("captions.json");
    std::fs::write(&unnamed, json).unwrap();
    let err = format!("{:#}", coco::load(&unnamed, &dir).unwrap_err());
    assert!(
        err.contains("captions.json") && err.contains("split"),
        "{err}"
    );
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn a_karpathy_entry_is_named_by_its_cocoid_then_its_imgid_then_its_file() {
    // COCO's Karpathy file gives both ids, and only cocoid names the image
    // in COCO's own annotations (and in features files made from them).
    let dir = temp_dir("karpathy-ids");
    let file = dir.join("dataset.json");
    let entry = |ids: &str, name: &str| {
        format!(
            r#"{{{ids} "filename": "{name}", "split": "test", "sentences": [{{"raw": "A dog."}}]}}"#
        )
    };
    let entries = [
        entry(r#""imgid": 0, "cocoid": 391895,"#, "a.jpg"),
        entry(r#""cocoid": "522418", "imgid": 1,"#, "b.jpg"),
        entry(r#""imgid": 2,"#, "c.jpg"),
        entry("", "d.jpg"),
    ];
    std::fs::write(&file, format!(r#"{{"images": [{}]}}"#, entries.join(","))).unwrap();
    let data = karpathy::load_references(&file).unwrap();
    let ids: Vec<&str> = data.items.iter().map(|i| i.id.as_str()).collect();
    assert_eq!(ids, ["391895", "522418", "2", "d.jpg"]);
    std::fs::remove_dir_all(&dir).unwrap();
}
