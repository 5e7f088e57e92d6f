//! The library's floor plan (docs/architecture.md) as a test: every top-level module of
//! `gpreempt/src` may use only the layers below its own, so no dependency cycle can form. Read
//! from the sources' `crate::` paths, test code left out (a test may use helpers anywhere).

use std::{
    collections::{BTreeMap, BTreeSet},
    fs,
    path::{Path, PathBuf},
};

/// Each library module's layer, bottom up; a module may use modules of lower layers only.
const LAYERS: &[(&str, u32)] = &[
    ("domain", 0),
    ("deploy", 0),
    ("clock", 0),
    ("duration", 0),
    ("stats", 0),
    ("output", 0),
    ("kfd", 1),
    ("host", 2),
    ("event", 3),
    ("trace", 4),
    ("model", 5),
    ("report", 6),
    ("pipeline", 7),
    ("views", 8),
    ("controller", 8),
    ("doctor", 9),
    ("analyze", 9),
    ("schedule", 9),
    ("evaluate", 10),
    ("metrics", 10),
    ("agent", 11),
];

/// The binary's files and test-only modules are not part of the library's floor plan.
const NOT_LIBRARY: &[&str] = &["main", "cli", "commands", "test_support"];

fn src() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The source without comments and without its test module (by house layout, a
/// `#[cfg(test)] mod NAME {` runs to the end of the file).
fn library_code(text: &str) -> String {
    let code: String = text.lines().map(|l| l.split("//").next().unwrap_or("")).collect::<Vec<_>>().join("\n");
    let mut cut = code.len();
    let mut from = 0;
    while let Some(at) = code[from..].find("#[cfg(") {
        let at = from + at;
        let rest = &code[at..];
        let attr_end = rest.find(']').map_or(rest.len(), |i| i + 1);
        let after = rest[attr_end..].trim_start();
        if rest[..attr_end].contains("test") && (after.starts_with("mod ") || after.starts_with("pub(crate) mod ")) {
            cut = at;
            break;
        }
        from = at + attr_end;
    }
    code[..cut].to_owned()
}

/// The top-level modules a file names through `crate::` paths (`crate::a::b`, `crate::{a, b::c}`).
fn uses(code: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = code;
    while let Some(at) = rest.find("crate::") {
        rest = &rest[at + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let mut depth = 0;
            let mut item = String::new();
            for c in group.chars() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        out.extend(first_ident(&item));
                        item.clear();
                        continue;
                    }
                    _ => {}
                }
                if depth == 0 || !item.contains("::") {
                    item.push(c);
                }
            }
            out.extend(first_ident(&item));
        } else {
            out.extend(first_ident(rest));
        }
    }
    out
}

fn first_ident(s: &str) -> Option<String> {
    let s = s.trim_start();
    let ident: String = s.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
    (!ident.is_empty() && ident != "self").then_some(ident)
}

/// `module → modules it uses`, library modules only.
fn graph() -> BTreeMap<String, BTreeSet<String>> {
    let root = src();
    let mut files = Vec::new();
    rust_files(&root, &mut files);
    let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in files {
        let rel = file.strip_prefix(&root).unwrap();
        let top = rel.components().next().unwrap().as_os_str().to_string_lossy().trim_end_matches(".rs").to_owned();
        if top == "lib" || NOT_LIBRARY.contains(&top.as_str()) || file.ends_with("tests.rs") {
            continue;
        }
        let code = library_code(&fs::read_to_string(&file).unwrap());
        let used = g.entry(top.clone()).or_default();
        used.extend(uses(&code).into_iter().filter(|m| *m != top));
    }
    g
}

#[test]
fn every_module_uses_only_the_layers_below_its_own() {
    let layer: BTreeMap<&str, u32> = LAYERS.iter().copied().collect();
    let g = graph();
    let unplaced: Vec<&String> = g.keys().filter(|m| !layer.contains_key(m.as_str())).collect();
    assert!(unplaced.is_empty(), "modules without a layer in LAYERS (and docs/architecture.md): {unplaced:?}");
    let mut upward = Vec::new();
    for (module, used) in &g {
        for u in used {
            let (Some(&from), Some(&to)) = (layer.get(module.as_str()), layer.get(u.as_str())) else {
                panic!("{module} uses {u}, which is not a library module with a layer");
            };
            if to >= from {
                upward.push(format!("{module} (layer {from}) uses {u} (layer {to})"));
            }
        }
    }
    assert!(upward.is_empty(), "arrows that do not point down:\n{}", upward.join("\n"));
}

#[test]
fn the_reader_sees_grouped_and_plain_paths() {
    let code =
        "use crate::{\n    domain::{HostPid, QueueId},\n    kfd::{self, uapi::X},\n};\nfn f() { crate::clock::now(); }";
    assert_eq!(uses(code), ["clock", "domain", "kfd"].into_iter().map(String::from).collect());
    let with_tests = "use crate::kfd::Device;\n#[cfg(test)]\nmod tests {\n    use crate::agent::X;\n}\n";
    assert_eq!(uses(&library_code(with_tests)), ["kfd"].into_iter().map(String::from).collect());
}
