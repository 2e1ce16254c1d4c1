//! Every WGSL file parses and validates with naga (no GPU needed), and the
//! binary embeds exactly the files in `shaders/`.

use std::path::Path;

fn validate(name: &str, source: &str) -> naga::Module {
    let module = naga::front::wgsl::parse_str(source)
        .unwrap_or_else(|e| panic!("{name}: {}", e.emit_to_string(source)));
    let mut validator = naga::valid::Validator::new(
        naga::valid::ValidationFlags::all(),
        naga::valid::Capabilities::empty(),
    );
    validator
        .validate(&module)
        .unwrap_or_else(|e| panic!("{name}: {}", e.emit_to_string(source)));
    module
}

/// Every `shaders/*.wgsl` file but the prelude: the kernel families.
fn family_files() -> Vec<std::path::PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("shaders");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().and_then(|e| e.to_str()) == Some("wgsl"))
        .filter(|p| p.file_stem().and_then(|s| s.to_str()) != Some("prelude"))
        .collect();
    files.sort();
    files
}

#[test]
fn every_shader_file_validates_with_naga() {
    let prelude = validate("shaders/prelude.wgsl", captune::shaders::PRELUDE);
    assert!(
        prelude.entry_points.is_empty(),
        "the prelude must not define kernels"
    );
    for path in family_files() {
        let source =
            captune::shaders::PRELUDE.to_string() + &std::fs::read_to_string(&path).unwrap();
        let module = validate(&format!("{} (after the prelude)", path.display()), &source);
        assert!(
            !module.entry_points.is_empty(),
            "{}: no entry points",
            path.display()
        );
    }
}

#[test]
fn embedded_shaders_are_the_files_on_disk() {
    let names: Vec<String> = family_files()
        .iter()
        .map(|p| p.file_stem().unwrap().to_string_lossy().into_owned())
        .collect();
    let embedded: Vec<&str> = captune::shaders::SHADERS.iter().map(|(n, _)| *n).collect();
    assert_eq!(
        names, embedded,
        "shaders/ and src/shaders.rs list different families"
    );
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("shaders");
    for (name, source) in captune::shaders::SHADERS {
        let on_disk = captune::shaders::PRELUDE.to_string()
            + &std::fs::read_to_string(dir.join(format!("{name}.wgsl"))).unwrap();
        assert_eq!(
            &on_disk, source,
            "shaders/{name}.wgsl differs from the embedded copy"
        );
    }
}

/// The first `count` string literals in `text`.
fn string_literals(text: &str, count: usize) -> Vec<&str> {
    text.split('"').skip(1).step_by(2).take(count).collect()
}

#[test]
fn every_entry_point_the_gpu_backend_dispatches_exists() {
    // The GPU backend names kernels as `dispatch("family", "entry", ..)`, or
    // `elementwise("entry", ..)` for the elementwise family.
    let rust =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("src/gpu/ops.rs"))
            .unwrap();
    let mut kernels: Vec<(&str, &str)> = Vec::new();
    for (i, _) in rust.match_indices("self.dispatch(") {
        let call = &rust[i..i + rust[i..].find(';').unwrap()];
        // The elementwise helper passes its entry through a variable: its callers count below.
        if let [family, entry] = string_literals(call, 2)[..] {
            kernels.push((family, entry));
        }
    }
    for (i, _) in rust.match_indices("self.elementwise(") {
        kernels.push(("elementwise", string_literals(&rust[i..], 1)[0]));
    }
    for &(family, entry) in &kernels {
        let module = naga::front::wgsl::parse_str(captune::shaders::source(family)).unwrap();
        assert!(
            module.entry_points.iter().any(|e| e.name == entry),
            "src/gpu/ops.rs dispatches {family}/{entry}, which shaders/{family}.wgsl does not define"
        );
    }
    let entry_points: usize = captune::shaders::SHADERS
        .iter()
        .map(|(_, src)| {
            naga::front::wgsl::parse_str(src)
                .unwrap()
                .entry_points
                .len()
        })
        .sum();
    // The matmul family's entry is chosen at run time (both are parity-tested).
    assert!(
        kernels.len() + 2 >= entry_points,
        "found only {} dispatches of {entry_points} entry points",
        kernels.len()
    );
}
