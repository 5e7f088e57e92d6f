//! The floor plan (docs/architecture.md) as tests, read from the sources:
//! - no crate of the workspace has a module cycle: inside each module, its child modules use one
//!   another one way only (a parent and its own children may use each other: a path to an
//!   ancestor or a descendant is no arrow between rooms);
//! - every top-level module of the `gpreempt` library uses only the layers below its own.
//!
//! The arrows are the code's `crate::`, `super::` and `self::` paths (in `use`, grouped or plain,
//! and in expressions), resolved against the module tree its `mod` declarations build (`#[path]`
//! honoured). Test code is left out: a test may use helpers anywhere. Not seen: a sibling named
//! only through a glob import of the parent (`use super::*` outside a test module; none today).

use std::{
    collections::{BTreeMap, BTreeSet, VecDeque},
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

/// A module's path from its crate root (`["schedule", "online"]`); the root itself is `[]`.
type ModPath = Vec<String>;

/// One crate root's module tree: every module (test-only ones left out) and its file.
struct Tree {
    files: BTreeMap<ModPath, PathBuf>,
    /// The files of the test-only modules declared (`#[cfg(test)] mod tests;`), not read.
    test_only: BTreeSet<PathBuf>,
}

/// An arrow between two sibling modules, with the first file and path that make it.
type Arrows = BTreeMap<(ModPath, ModPath), (PathBuf, String)>;

fn workspace() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).parent().expect("gpreempt/ sits in the workspace").to_owned()
}

fn read(file: &Path) -> String {
    fs::read_to_string(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()))
}

/// The source without comments (a `//` inside a string cuts its line short, which loses no path
/// of this code base).
fn without_comments(text: &str) -> String {
    text.lines().map(|l| l.split("//").next().unwrap_or("")).collect::<Vec<_>>().join("\n")
}

/// The attributes on a line's front (`#[cfg(test)] mod tests;`) and what follows them.
fn split_attributes(line: &str) -> (Vec<&str>, &str) {
    let mut attrs = Vec::new();
    let mut rest = line.trim_start();
    while rest.starts_with("#[") {
        let Some(end) = rest.find(']') else { break };
        attrs.push(&rest[..=end]);
        rest = rest[end + 1..].trim_start();
    }
    (attrs, rest)
}

/// `mod NAME` after an optional visibility, and what follows the name (`;` or `{`).
fn mod_item(item: &str) -> Option<(&str, &str)> {
    let item = item.strip_prefix("pub").map_or(item, |rest| {
        let rest = rest.trim_start();
        rest.strip_prefix('(').and_then(|r| r.split_once(')')).map_or(rest, |(_, after)| after).trim_start()
    });
    let rest = item.strip_prefix("mod ")?.trim_start();
    let end = rest.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(rest.len());
    (end > 0).then(|| (&rest[..end], rest[end..].trim_start()))
}

fn is_test_only(attrs: &[&str]) -> bool {
    attrs.iter().any(|a| a.starts_with("#[cfg(") && a.contains("test"))
}

/// The code the arrows are read from: comments gone, and from an inline test module
/// (`#[cfg(test)] mod NAME {`, by house layout at the end of its file) on, nothing.
fn library_code(text: &str) -> String {
    let code = without_comments(text);
    let mut attrs: Vec<&str> = Vec::new();
    let mut kept = Vec::new();
    for line in code.lines() {
        let (front, item) = split_attributes(line);
        attrs.extend(front);
        if let Some((_, after)) = mod_item(item)
            && after.starts_with('{')
            && is_test_only(&attrs)
        {
            break;
        }
        if !item.is_empty() {
            attrs.clear();
        }
        kept.push(line);
    }
    kept.join("\n")
}

/// An out-of-line module a file declares (`mod NAME;`).
#[derive(Debug, PartialEq)]
struct Declared {
    name: String,
    /// Its `#[path]`, if any.
    path: Option<String>,
    test_only: bool,
}

fn declared_modules(code: &str) -> Vec<Declared> {
    let mut out = Vec::new();
    let mut attrs: Vec<&str> = Vec::new();
    for line in code.lines() {
        let (front, item) = split_attributes(line);
        attrs.extend(front);
        if let Some((name, after)) = mod_item(item)
            && after.starts_with(';')
        {
            let path = attrs.iter().find_map(|a| {
                let value = a.strip_prefix("#[path")?.trim_start().strip_prefix('=')?.trim();
                Some(value.trim_end_matches(']').trim().trim_matches('"').to_owned())
            });
            out.push(Declared { name: name.to_owned(), path, test_only: is_test_only(&attrs) });
        }
        if !item.is_empty() {
            attrs.clear();
        }
    }
    out
}

/// The module tree below a crate root file (`src/lib.rs`, `src/main.rs`, `src/bin/x.rs`, …).
fn tree(root: &Path) -> Tree {
    fn add(file: &Path, at: ModPath, owns_dir: bool, tree: &mut Tree) {
        let code = without_comments(&read(file));
        let here = file.parent().unwrap();
        // `a/b.rs` declares its children in `a/b/`; `mod.rs`, `lib.rs`, `main.rs` and a
        // `#[path]` file in their own directory.
        let children = if owns_dir { here.to_owned() } else { file.with_extension("") };
        for Declared { name, path, test_only } in declared_modules(&code) {
            let (child, owns) = match path {
                Some(path) => (here.join(path), true),
                None if children.join(format!("{name}.rs")).exists() => (children.join(format!("{name}.rs")), false),
                None => (children.join(&name).join("mod.rs"), true),
            };
            if test_only {
                tree.test_only.insert(child);
                continue;
            }
            let mut child_at = at.clone();
            child_at.push(name);
            add(&child, child_at, owns, tree);
        }
        tree.files.insert(at, file.to_owned());
    }
    let mut tree = Tree { files: BTreeMap::new(), test_only: BTreeSet::new() };
    add(root, Vec::new(), true, &mut tree);
    tree
}

fn skip_space(s: &[u8], i: &mut usize) {
    while s.get(*i).is_some_and(u8::is_ascii_whitespace) {
        *i += 1;
    }
}

fn is_ident_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

fn ident(s: &[u8], i: &mut usize) -> String {
    let start = *i;
    while s.get(*i).copied().is_some_and(is_ident_byte) {
        *i += 1;
    }
    String::from_utf8_lossy(&s[start..*i]).into_owned()
}

/// The paths of one use tree or expression path from `i` on: `a::{b::{C, D}, e as f}` gives
/// `a::b::C`, `a::b::D`, `a::e`.
fn use_tree(s: &[u8], i: &mut usize) -> Vec<Vec<String>> {
    let mut segments = Vec::new();
    loop {
        skip_space(s, i);
        if s.get(*i) == Some(&b'{') {
            *i += 1;
            let mut out = Vec::new();
            loop {
                skip_space(s, i);
                match s.get(*i) {
                    None => break,
                    Some(b'}') => {
                        *i += 1;
                        break;
                    }
                    Some(b',' | b'*') => *i += 1,
                    _ => {
                        let before = *i;
                        for tail in use_tree(s, i) {
                            out.push(segments.iter().cloned().chain(tail).collect());
                        }
                        if *i == before {
                            *i += 1;
                        }
                    }
                }
            }
            return out;
        }
        let name = ident(s, i);
        if name.is_empty() {
            break;
        }
        segments.push(name);
        skip_space(s, i);
        if s[*i..].starts_with(b"::") {
            *i += 2;
        } else {
            break;
        }
    }
    // `… as name`: the new name is no path.
    let mut j = *i;
    if ident(s, &mut j) == "as" {
        skip_space(s, &mut j);
        ident(s, &mut j);
        *i = j;
    }
    vec![segments]
}

/// Every path the code names from `crate::`, `super::` or `self::`, as written.
fn paths(code: &str) -> Vec<Vec<String>> {
    let s = code.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < s.len() {
        let starts = ["crate::", "super::", "self::"].iter().any(|p| s[i..].starts_with(p.as_bytes()));
        let after_ident = i > 0 && (is_ident_byte(s[i - 1]) || s[i - 1] == b':');
        if starts && !after_ident {
            out.extend(use_tree(s, &mut i));
        } else {
            i += 1;
        }
    }
    out
}

/// The module a path written in module `at` names: its longest prefix that is a module.
fn resolve(tree: &Tree, at: &ModPath, path: &[String]) -> ModPath {
    let mut module = at.clone();
    for (n, segment) in path.iter().enumerate() {
        match segment.as_str() {
            "crate" if n == 0 => module.clear(),
            "super" => {
                module.pop();
            }
            "self" => {}
            _ => {
                module.push(segment.clone());
                if !tree.files.contains_key(&module) {
                    module.pop();
                    break;
                }
            }
        }
    }
    module
}

/// The arrows between sibling modules: a path from inside `a::b::…` to `a::c::…` is an arrow
/// `a::b → a::c`; a path to an ancestor or a descendant is none.
fn arrows(tree: &Tree) -> Arrows {
    let mut out = Arrows::new();
    for (at, file) in &tree.files {
        for path in paths(&library_code(&read(file))) {
            let to = resolve(tree, at, &path);
            let common = at.iter().zip(&to).take_while(|(a, b)| a == b).count();
            if common < at.len() && common < to.len() {
                let written = path.join("::");
                let written = written.strip_suffix("::self").unwrap_or(&written).to_owned();
                out.entry((at[..=common].to_vec(), to[..=common].to_vec())).or_insert_with(|| (file.clone(), written));
            }
        }
    }
    out
}

fn name(module: &[String]) -> String {
    if module.is_empty() { "crate".to_owned() } else { module.join("::") }
}

/// One message per module cycle (a strongly connected set of more than one module): the cycle
/// and, for each of its arrows, the file and path that make it.
fn cycles(arrows: &Arrows) -> Vec<String> {
    let mut next: BTreeMap<&ModPath, BTreeSet<&ModPath>> = BTreeMap::new();
    for (from, to) in arrows.keys() {
        next.entry(from).or_default().insert(to);
    }
    let reach = |start: &ModPath| {
        let mut seen = BTreeSet::new();
        let mut todo = vec![start];
        while let Some(m) = todo.pop() {
            for n in next.get(m).into_iter().flatten() {
                if seen.insert(*n) {
                    todo.push(n);
                }
            }
        }
        seen
    };
    let mut reported = BTreeSet::new();
    let mut out = Vec::new();
    for &start in next.keys() {
        if reported.contains(start) || !reach(start).contains(start) {
            continue;
        }
        // The shortest way back to `start`, breadth first.
        let mut came_from: BTreeMap<&ModPath, &ModPath> = BTreeMap::new();
        let mut queue = VecDeque::from([start]);
        'search: while let Some(m) = queue.pop_front() {
            for &n in next.get(m).into_iter().flatten() {
                if n == start {
                    came_from.insert(start, m);
                    break 'search;
                }
                if !came_from.contains_key(n) {
                    came_from.insert(n, m);
                    queue.push_back(n);
                }
            }
        }
        let mut cycle = vec![start];
        let mut m = came_from[start];
        while m != start {
            cycle.push(m);
            m = came_from[m];
        }
        cycle.push(start);
        let last = cycle.len() - 1;
        cycle[1..last].reverse();
        let members: BTreeSet<&ModPath> = reach(start).into_iter().filter(|m| reach(m).contains(start)).collect();
        reported.extend(members.iter().copied());
        let mut message = cycle.iter().map(|m| name(m)).collect::<Vec<_>>().join(" → ");
        for pair in cycle.windows(2) {
            let (file, path) = &arrows[&(pair[0].clone(), pair[1].clone())];
            let file = file.strip_prefix(workspace()).unwrap_or(file);
            message += &format!("\n    {} → {}: {} names {path}", name(pair[0]), name(pair[1]), file.display());
        }
        if members.len() > cycle.len() - 1 {
            let names: Vec<String> = members.iter().map(|m| name(m)).collect();
            message += &format!("\n    (one cycle of the tangle {})", names.join(", "));
        }
        out.push(message);
    }
    out
}

/// The crates the cycle tests read (`emu-workload`, a binary of the tests crate, on its own), and
/// the directories whose every `.rs` file one of their trees must reach.
const CRATES: &[&str] =
    &["gpreempt", "xtask", "gpreempt-tests", "emu-workload", "gpreempt-common", "gpreempt-ebpf", "harness"];
const SOURCE_DIRS: &[&str] = &[
    "gpreempt/src",
    "gpreempt/tests",
    "xtask/src",
    "tests/src",
    "tests/tests",
    "gpreempt-common/src",
    "gpreempt-ebpf/src",
    "harness/src",
    "harness/tests",
];

/// A crate's roots: its library, binaries and integration tests.
fn crate_roots(krate: &str) -> Vec<PathBuf> {
    let mut roots = match krate {
        "gpreempt" => vec![at("gpreempt/src/lib.rs"), at("gpreempt/src/main.rs")],
        "xtask" => vec![at("xtask/src/main.rs")],
        "gpreempt-tests" => {
            let mut roots = vec![at("tests/src/lib.rs")];
            roots.extend(rust_files("tests/src/bin").into_iter().filter(|p| !p.ends_with("emu-workload.rs")));
            roots
        }
        "emu-workload" => vec![at("tests/src/bin/emu-workload.rs")],
        "gpreempt-common" => vec![at("gpreempt-common/src/lib.rs")],
        "gpreempt-ebpf" => vec![
            at("gpreempt-ebpf/src/main.rs"),
            at("gpreempt-ebpf/src/doorbell.rs"),
            at("gpreempt-ebpf/src/arrival.rs"),
        ],
        "harness" => vec![at("harness/src/lib.rs"), at("harness/src/main.rs")],
        other => panic!("{other} is no crate of CRATES"),
    };
    let tests = match krate {
        "gpreempt" => "gpreempt/tests",
        "gpreempt-tests" => "tests/tests",
        "harness" => "harness/tests",
        _ => "",
    };
    roots.extend(rust_files(tests));
    // A test binary of several files: its directory's main.rs (cargo's auto-discovery).
    roots.extend(test_dirs(tests));
    roots
}

/// `DIR/*/main.rs`: the roots of the test binaries that are directories.
fn test_dirs(dir: &str) -> Vec<PathBuf> {
    let Ok(entries) = fs::read_dir(workspace().join(dir)) else { return Vec::new() };
    let mut mains: Vec<PathBuf> =
        entries.map(|e| e.unwrap().path().join("main.rs")).filter(|main| main.is_file()).collect();
    mains.sort();
    mains
}

/// Fails naming every module cycle of the crate: the modules, and the file and path behind each
/// arrow.
fn assert_no_cycle(krate: &str) {
    let mut found = Vec::new();
    for root in crate_roots(krate) {
        let rel = root.strip_prefix(workspace()).unwrap_or(&root).display().to_string();
        found.extend(cycles(&arrows(&tree(&root))).into_iter().map(|c| format!("{rel}: {c}")));
    }
    assert!(
        found.is_empty(),
        "{krate}: module cycles (make each arrow go one way: move what both sides need to one of them or \
         below both):\n{}",
        found.join("\n")
    );
}

/// `dir/*.rs` of the workspace, sorted; empty when `dir` is empty or does not exist.
fn rust_files(dir: &str) -> Vec<PathBuf> {
    let Ok(entries) = fs::read_dir(workspace().join(dir)) else { return Vec::new() };
    let mut files: Vec<PathBuf> =
        entries.map(|e| e.unwrap().path()).filter(|p| p.extension().is_some_and(|e| e == "rs")).collect();
    files.sort();
    files
}

fn all_rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.unwrap().path();
        if path.is_dir() {
            all_rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

fn at(rel: &str) -> PathBuf {
    workspace().join(rel)
}

#[test]
fn gpreempt_has_no_module_cycle() {
    assert_no_cycle("gpreempt");
}

#[test]
fn xtask_has_no_module_cycle() {
    assert_no_cycle("xtask");
}

#[test]
fn the_tests_crate_has_no_module_cycle() {
    assert_no_cycle("gpreempt-tests");
}

#[test]
fn emu_workload_has_no_module_cycle() {
    assert_no_cycle("emu-workload");
}

#[test]
fn the_other_crates_have_no_module_cycle() {
    for krate in ["gpreempt-common", "gpreempt-ebpf", "harness"] {
        assert_no_cycle(krate);
    }
}

/// A module the reader misses would hide its arrows: every source file is a module of some tree
/// (or a test-only module, which is left out on purpose).
#[test]
fn the_trees_reach_every_source_file() {
    let mut reached = BTreeSet::new();
    for krate in CRATES {
        for root in crate_roots(krate) {
            let tree = tree(&root);
            reached.extend(tree.files.into_values());
            reached.extend(tree.test_only);
        }
    }
    let mut files = Vec::new();
    for dir in SOURCE_DIRS {
        all_rust_files(&at(dir), &mut files);
    }
    let missed: Vec<String> = files
        .iter()
        .filter(|f| !reached.contains(*f))
        .map(|f| f.strip_prefix(workspace()).unwrap_or(f).display().to_string())
        .collect();
    assert!(missed.is_empty(), "source files in no module tree (a crate root missing from crate_roots?): {missed:?}");
}

#[test]
fn every_module_uses_only_the_layers_below_its_own() {
    let layer: BTreeMap<&str, u32> = LAYERS.iter().copied().collect();
    let tree = tree(&at("gpreempt/src/lib.rs"));
    let unplaced: Vec<String> =
        tree.files.keys().filter(|m| m.len() == 1 && !layer.contains_key(m[0].as_str())).map(|m| name(m)).collect();
    assert!(unplaced.is_empty(), "modules without a layer in LAYERS (and docs/architecture.md): {unplaced:?}");
    let mut upward = Vec::new();
    for ((module, used), (file, path)) in arrows(&tree) {
        let [module, used] = [&module, &used].map(|m| m.first().map(String::as_str));
        let (Some(module), Some(used)) = (module, used) else { continue };
        if module == used {
            continue;
        }
        let (from, to) = (layer[module], layer[used]);
        if to >= from {
            let file = file.strip_prefix(workspace()).unwrap_or(&file).display().to_string();
            upward.push(format!("{module} (layer {from}) uses {used} (layer {to}): {file} names {path}"));
        }
    }
    assert!(upward.is_empty(), "arrows that do not point down:\n{}", upward.join("\n"));
}

fn strings(paths: &[&str]) -> Vec<Vec<String>> {
    paths.iter().map(|p| p.split("::").map(String::from).collect()).collect()
}

#[test]
fn the_reader_sees_grouped_plain_and_relative_paths() {
    let code = "use crate::{\n    domain::{HostPid, QueueId as Q},\n    kfd::{self, uapi::X},\n};\n\
                use super::{seams::Occupancy, *};\nfn f() { crate::clock::now(); self::g(); $crate::x::y!(); }";
    assert_eq!(
        paths(code),
        strings(&[
            "crate::domain::HostPid",
            "crate::domain::QueueId",
            "crate::kfd::self",
            "crate::kfd::uapi::X",
            "super::seams::Occupancy",
            "crate::clock::now",
            "self::g",
            "crate::x::y",
        ])
    );
    // Test code is left out: an inline test module to the end of its file; a test module in its
    // own file is not declared into the tree, and the code after its declaration still counts.
    let with_tests =
        "#[cfg(test)]\nmod tests;\nuse crate::kfd::Device;\n#[cfg(test)]\nmod tests {\n    use crate::agent::X;\n}\n";
    assert_eq!(paths(&library_code(with_tests)), strings(&["crate::kfd::Device"]));
    let decls =
        "pub mod a;\n/// doc\n#[cfg(test)]\npub(crate) mod test_support;\n#[path = \"w/b.rs\"]\nmod b;\nmod c {}\n";
    let declared = |name: &str, path: Option<&str>, test_only| Declared {
        name: name.to_owned(),
        path: path.map(String::from),
        test_only,
    };
    assert_eq!(
        declared_modules(&without_comments(decls)),
        [declared("a", None, false), declared("test_support", None, true), declared("b", Some("w/b.rs"), false)]
    );
}

#[test]
fn a_cycle_is_named_with_the_paths_that_make_it() {
    let m = |s: &str| -> ModPath { s.split("::").map(String::from).collect() };
    let arrow =
        |from: &str, to: &str, file: &str, path: &str| ((m(from), m(to)), (PathBuf::from(file), path.to_owned()));
    let arrows: Arrows = [
        arrow("kernels", "util", "kernels.rs", "crate::util::run"),
        arrow("util", "rocm6", "util.rs", "crate::rocm6::present"),
        arrow("rocm6", "kernels", "rocm6.rs", "crate::kernels::unpack_debs"),
        arrow("test", "util", "test.rs", "crate::util::cargo"),
    ]
    .into_iter()
    .collect();
    assert_eq!(
        cycles(&arrows),
        ["kernels → util → rocm6 → kernels\n    kernels → util: kernels.rs names crate::util::run\n    \
          util → rocm6: util.rs names crate::rocm6::present\n    rocm6 → kernels: rocm6.rs names crate::kernels::unpack_debs"]
    );
    assert!(cycles(&arrows.into_iter().filter(|((from, _), _)| from != &m("rocm6")).collect()).is_empty());
}
