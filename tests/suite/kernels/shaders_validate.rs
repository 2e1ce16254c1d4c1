//! Every WGSL file parses and validates with naga (no GPU needed), the
//! binary embeds exactly the files in `shaders/`, and every kernel
//! translates to the languages of the backends the project names: SPIR-V
//! (Vulkan), MSL (Metal) and HLSL (DX12), with the same entry points and
//! bindings.

use std::path::Path;

fn validate(name: &str, source: &str) -> naga::Module {
    validate_with_info(name, source).0
}

fn validate_with_info(name: &str, source: &str) -> (naga::Module, naga::valid::ModuleInfo) {
    let module = naga::front::wgsl::parse_str(source)
        .unwrap_or_else(|e| panic!("{name}: {}", e.emit_to_string(source)));
    let mut validator = naga::valid::Validator::new(
        naga::valid::ValidationFlags::all(),
        naga::valid::Capabilities::empty(),
    );
    let info = validator
        .validate(&module)
        .unwrap_or_else(|e| panic!("{name}: {}", e.emit_to_string(source)));
    (module, info)
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
    // The GPU backend's family files name kernels as
    // `gpu.dispatch("family", "entry", ..)`, or `elementwise(gpu, "entry",
    // ..)` in the elementwise family's.
    let gpu = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/gpu");
    let mut files: Vec<_> = std::fs::read_dir(&gpu)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "rs"))
        .collect();
    files.sort();
    let sources: Vec<String> = files
        .iter()
        .map(|f| std::fs::read_to_string(f).unwrap())
        .collect();
    let mut kernels: Vec<(&str, &str)> = Vec::new();
    for rust in &sources {
        for (i, _) in rust.match_indices("gpu.dispatch(") {
            let call = &rust[i..i + rust[i..].find(';').unwrap()];
            // The elementwise helper passes its entry through a variable: its callers count below.
            if let [family, entry] = string_literals(call, 2)[..] {
                kernels.push((family, entry));
            }
        }
    }
    let elementwise = std::fs::read_to_string(gpu.join("elementwise.rs")).unwrap();
    for (i, _) in elementwise.match_indices("elementwise(") {
        if !elementwise[..i].ends_with("fn ") {
            kernels.push(("elementwise", string_literals(&elementwise[i..], 1)[0]));
        }
    }
    for &(family, entry) in &kernels {
        let module = naga::front::wgsl::parse_str(captune::shaders::source(family)).unwrap();
        assert!(
            module.entry_points.iter().any(|e| e.name == entry),
            "src/gpu/ dispatches {family}/{entry}, which shaders/{family}.wgsl does not define"
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
    // The matmul family's entry is chosen at run time, from the tiles of
    // src/gpu/matmul_plan.rs (each parity-tested); every one exists.
    let matmul = naga::front::wgsl::parse_str(captune::shaders::source("matmul")).unwrap();
    for tile in captune::gpu::MatmulTile::ALL {
        assert!(
            matmul.entry_points.iter().any(|e| e.name == tile.entry()),
            "{tile:?}: shaders/matmul.wgsl does not define {}",
            tile.entry()
        );
    }
    assert!(
        kernels.len() + captune::gpu::MatmulTile::ALL.len() >= entry_points,
        "found only {} dispatches of {entry_points} entry points",
        kernels.len()
    );
}

/// The (group, binding) pairs of a module's resources.
fn bindings(module: &naga::Module) -> std::collections::BTreeSet<(u32, u32)> {
    module
        .global_variables
        .iter()
        .filter_map(|(_, g)| g.binding.as_ref().map(|b| (b.group, b.binding)))
        .collect()
}

/// The entry point names and (set, binding) decorations of a SPIR-V module,
/// read from its instructions.
fn spirv_interface(words: &[u32]) -> (Vec<String>, std::collections::BTreeSet<(u32, u32)>) {
    const OP_ENTRY_POINT: u32 = 15;
    const OP_DECORATE: u32 = 71;
    const DESCRIPTOR_SET: u32 = 34;
    const BINDING: u32 = 33;
    assert_eq!(words[0], 0x0723_0203, "SPIR-V magic number");
    let (mut names, mut sets, mut slots) = (
        Vec::new(),
        std::collections::HashMap::new(),
        std::collections::HashMap::new(),
    );
    let mut at = 5;
    while at < words.len() {
        let (count, op) = ((words[at] >> 16) as usize, words[at] & 0xffff);
        let operands = &words[at + 1..at + count];
        if op == OP_ENTRY_POINT {
            // execution model, id, then the name as a nul-terminated string
            let bytes: Vec<u8> = operands[2..].iter().flat_map(|w| w.to_le_bytes()).collect();
            let end = bytes.iter().position(|&b| b == 0).unwrap();
            names.push(String::from_utf8(bytes[..end].to_vec()).unwrap());
        } else if op == OP_DECORATE && operands.len() == 3 {
            match operands[1] {
                DESCRIPTOR_SET => {
                    sets.insert(operands[0], operands[2]);
                }
                BINDING => {
                    slots.insert(operands[0], operands[2]);
                }
                _ => {}
            }
        }
        at += count;
    }
    let pairs = slots.iter().map(|(id, b)| (sets[id], *b)).collect();
    (names, pairs)
}

#[test]
fn every_kernel_translates_to_spirv_msl_and_hlsl() {
    for path in family_files() {
        let name = path.display().to_string();
        let source =
            captune::shaders::PRELUDE.to_string() + &std::fs::read_to_string(&path).unwrap();
        let (module, info) = validate_with_info(&name, &source);
        let mut entries: Vec<String> = module.entry_points.iter().map(|e| e.name.clone()).collect();
        entries.sort();
        let wanted = bindings(&module);

        // Vulkan: SPIR-V.
        let words = naga::back::spv::write_vec(&module, &info, &Default::default(), None)
            .unwrap_or_else(|e| panic!("{name}: SPIR-V: {e}"));
        let (mut names, pairs) = spirv_interface(&words);
        names.sort();
        assert_eq!(names, entries, "{name}: SPIR-V entry points");
        assert_eq!(pairs, wanted, "{name}: SPIR-V descriptor sets and bindings");

        // Metal: MSL, every entry point.
        let (msl, translated) =
            naga::back::msl::write_string(&module, &info, &Default::default(), &Default::default())
                .unwrap_or_else(|e| panic!("{name}: MSL: {e}"));
        for (entry, result) in module
            .entry_points
            .iter()
            .zip(&translated.entry_point_names)
        {
            let written = result
                .as_ref()
                .unwrap_or_else(|e| panic!("{name}: MSL entry point {}: {e}", entry.name));
            assert!(
                msl.contains(&format!("kernel void {written}(")),
                "{name}: MSL lacks kernel {written}"
            );
        }

        // DX12: HLSL, every entry point, each resource at its register space and slot.
        let mut hlsl = String::new();
        let options = naga::back::hlsl::Options::default();
        let pipeline = naga::back::hlsl::PipelineOptions::default();
        let reflection = naga::back::hlsl::Writer::new(&mut hlsl, &options, &pipeline)
            .write(&module, &info, None)
            .unwrap_or_else(|e| panic!("{name}: HLSL: {e}"));
        for (entry, result) in module
            .entry_points
            .iter()
            .zip(&reflection.entry_point_names)
        {
            let written = result
                .as_ref()
                .unwrap_or_else(|e| panic!("{name}: HLSL entry point {}: {e}", entry.name));
            assert!(
                hlsl.contains(&format!("void {written}(")),
                "{name}: HLSL lacks {written}"
            );
        }
        for (group, binding) in &wanted {
            // naga writes no space for space 0.
            let space = if *group == 0 {
                String::new()
            } else {
                format!(", space{group}")
            };
            assert!(
                ["t", "u", "b", "s"]
                    .iter()
                    .any(|r| hlsl.contains(&format!("register({r}{binding}{space})"))),
                "{name}: HLSL has no register for group {group} binding {binding}"
            );
        }
    }
}

/// The GPU backend drops wgpu's loop bounding (`gpu::shader_runtime_checks`),
/// which is sound only while every loop ends. So each loop must be a `for`
/// that steps a counter towards its bound, or a binary search over
/// `lo < hi` that raises `lo` to `mid` or lowers `hi` to `mid - 1u` (with
/// `mid` above `lo`); a bare `loop` or any other `while` fails here until
/// its ending is argued for in the code and this test learns its shape.
#[test]
fn every_shader_loop_ends() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("shaders");
    let mut loops = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let source = std::fs::read_to_string(&path).unwrap();
        let lines: Vec<&str> = source.lines().map(str::trim).collect();
        for (i, line) in lines.iter().enumerate() {
            let at = format!("{}:{}: {line}", path.display(), i + 1);
            let code = line.split("//").next().unwrap();
            // Every loop keyword, wherever it stands, must open its line,
            // where the shapes below are checked.
            let words: Vec<&str> = code
                .split(|c: char| !c.is_alphanumeric() && c != '_')
                .collect();
            assert!(!words.contains(&"loop"), "{at}: a bare loop");
            let keyword = |k: &str| words.contains(&k);
            if keyword("for") {
                loops += 1;
                let rest = code
                    .strip_prefix("for (")
                    .unwrap_or_else(|| panic!("{at}: a for loop opens its line"));
                let header = rest.split(") {").next().unwrap();
                let parts: Vec<&str> = header.split(';').map(str::trim).collect();
                assert_eq!(parts.len(), 3, "{at}");
                let counter = parts[0]
                    .strip_prefix("var ")
                    .and_then(|s| s.split([' ', ':']).next())
                    .unwrap_or_else(|| panic!("{at}: the loop declares its counter"));
                // Steps by one, or by a constant (upper-case name), never 0.
                let step_ok = parts[2] == format!("{counter}++")
                    || parts[2]
                        .strip_prefix(&format!("{counter} += "))
                        .is_some_and(|by| {
                            by == "1u" || by.chars().all(|c| c.is_ascii_uppercase() || c == '_')
                        });
                let counting_up = parts[1].starts_with(&format!("{counter} < ")) && step_ok;
                let halving =
                    parts[1] == format!("{counter} > 0u") && parts[2] == format!("{counter} /= 2u");
                assert!(
                    counting_up || halving,
                    "{at}: not a counter towards its bound"
                );
            } else if keyword("while") {
                loops += 1;
                assert_eq!(code, "while (lo < hi) {", "{at}");
                let body = lines[i + 1..i + 4].join(" ");
                assert!(
                    body.contains("let mid = hi - (hi - lo) / 2u;")
                        && body.contains("lo = mid;")
                        && body.contains("hi = mid - 1u;"),
                    "{at}: not a narrowing binary search: {body}"
                );
            }
        }
    }
    // 54 when this was written.
    assert!(loops >= 40, "only {loops} loops found: the scan is broken");
}

/// Every entry point fits the smallest limits captune targets (WebGPU's
/// defaults, which Metal and DX12 adapters meet): at most 8 storage
/// buffers and 16 KiB of workgroup memory. (Validating with no
/// capabilities, above, already refuses f16 and subgroup operations.)
#[test]
fn every_entry_point_fits_the_portable_limits() {
    for (name, source) in captune::shaders::SHADERS {
        let (module, info) = validate_with_info(name, source);
        let ctx = module.to_ctx();
        for (index, entry) in module.entry_points.iter().enumerate() {
            let uses = info.get_entry_point(index);
            let (mut storage, mut workgroup_bytes) = (0, 0);
            for (handle, var) in module.global_variables.iter() {
                if uses[handle].is_empty() {
                    continue;
                }
                match var.space {
                    naga::AddressSpace::Storage { .. } => storage += 1,
                    naga::AddressSpace::WorkGroup => {
                        workgroup_bytes += module.types[var.ty].inner.size(ctx)
                    }
                    _ => {}
                }
            }
            assert!(
                storage <= 8,
                "{name}/{}: {storage} storage buffers",
                entry.name
            );
            assert!(
                workgroup_bytes <= 16 * 1024,
                "{name}/{}: {workgroup_bytes} bytes of workgroup memory",
                entry.name
            );
        }
    }
}
