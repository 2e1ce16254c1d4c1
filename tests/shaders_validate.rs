//! Every WGSL file parses and validates with naga (no GPU needed), and the
//! binary embeds exactly the files in `shaders/`.

use std::path::Path;

#[test]
fn every_shader_file_validates_with_naga() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("shaders");
    let mut checked = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().and_then(|e| e.to_str()) != Some("wgsl") {
            continue;
        }
        let source = std::fs::read_to_string(&path).unwrap();
        let module = naga::front::wgsl::parse_str(&source)
            .unwrap_or_else(|e| panic!("{}: {}", path.display(), e.emit_to_string(&source)));
        let mut validator = naga::valid::Validator::new(
            naga::valid::ValidationFlags::all(),
            naga::valid::Capabilities::empty(),
        );
        validator
            .validate(&module)
            .unwrap_or_else(|e| panic!("{}: {}", path.display(), e.emit_to_string(&source)));
        assert!(
            !module.entry_points.is_empty(),
            "{}: no entry points",
            path.display()
        );
        checked += 1;
    }
    assert_eq!(
        checked,
        captune::shaders::SHADERS.len(),
        "validated files vs embedded shader families"
    );
}

#[test]
fn embedded_shaders_are_the_files_on_disk() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("shaders");
    for (name, source) in captune::shaders::SHADERS {
        let on_disk = std::fs::read_to_string(dir.join(format!("{name}.wgsl")))
            .unwrap_or_else(|e| panic!("shaders/{name}.wgsl: {e}"));
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
