//! The layer rule of the engine (see docs/ARCHITECTURE.md): every top-level
//! module of the library is a layer, and code imports only from its own layer
//! or the layers below it. This test reads the sources and fails on any path
//! (`crate::x`, `super::` that climbs into another module) that points up.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// The engine's layers, bottom to top. A module may use the modules of its own
/// row and of the rows above it in this list.
const LAYERS: &[&[&str]] = &[
    &["rt", "units", "events"],
    &["format", "crypto"],
    &["dev"],
    &["queue"],
    &["vdev"],
    &["alloc"],
    &["cache"],
    &["block"],
    &["object"],
    &["pool"],
    &["nbd", "fuse"],
    &["control"],
];

fn rank(module: &str) -> Option<usize> {
    LAYERS.iter().position(|row| row.contains(&module))
}

fn source_files(dir: &Path, files: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read source directory") {
        let path = entry.expect("directory entry").path();
        if path.is_dir() {
            source_files(&path, files);
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            files.push(path);
        }
    }
}

/// The module path of a source file: `src/pool/volume/mod.rs` is
/// `[pool, volume]`, `src/queue/stats.rs` is `[queue, stats]`.
fn module_path(src: &Path, file: &Path) -> Vec<String> {
    let relative = file.strip_prefix(src).expect("file under src");
    let mut parts: Vec<String> = relative
        .iter()
        .map(|part| part.to_string_lossy().into_owned())
        .collect();
    let last = parts.pop().expect("file name");
    let stem = last.trim_end_matches(".rs");
    if stem != "mod" && stem != "lib" {
        parts.push(stem.to_string());
    }
    parts
}

/// Every module a line names by path, as the top-level module it lies in.
/// `path` is the line's module path (one deeper inside an inline `mod`).
fn named_top_modules(line: &str, path: &[String]) -> Vec<String> {
    let mut found = Vec::new();
    let code = line.split("//").next().unwrap_or("");
    let mut rest = code;
    while let Some(at) = rest.find("crate::") {
        let before = &rest[..at];
        let after = &rest[at + "crate::".len()..];
        // `$crate::` (macros) counts as the crate; `foo_crate::` does not.
        if !before.ends_with(|c: char| c.is_alphanumeric() || c == '_') {
            if let Some(group) = after.strip_prefix('{') {
                for item in group.split('}').next().unwrap_or("").split(',') {
                    let name = item.trim().split("::").next().unwrap_or("").trim();
                    if !name.is_empty() {
                        found.push(name.to_string());
                    }
                }
            } else {
                let name: String = after
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                found.push(name);
            }
        }
        rest = after;
    }
    // `super::super::x` climbs out of the file's module: resolve it.
    let mut rest = code;
    while let Some(at) = rest.find("super::") {
        let before = &rest[..at];
        let mut after = &rest[at..];
        if before.ends_with(|c: char| c.is_alphanumeric() || c == '_' || c == ':') {
            rest = &rest[at + "super::".len()..];
            continue;
        }
        let mut climbs = 0;
        while let Some(next) = after.strip_prefix("super::") {
            climbs += 1;
            after = next;
        }
        if climbs >= path.len() {
            let name: String = after
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            found.push(name);
        }
        rest = after;
    }
    found
}

#[test]
fn imports_point_down_only() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    source_files(&src, &mut files);
    files.sort();
    let mut top_modules = BTreeSet::new();
    let mut violations = Vec::new();
    for file in &files {
        let path = module_path(&src, file);
        let Some(own) = path.first() else {
            continue; // lib.rs declares the layers
        };
        top_modules.insert(own.clone());
        let own_rank =
            rank(own).unwrap_or_else(|| panic!("module {own} is in no layer: add it to LAYERS"));
        let text = std::fs::read_to_string(file).expect("read source");
        let mut inline_depth = path.clone();
        for (number, line) in text.lines().enumerate() {
            if line.trim_start().starts_with("mod tests {") {
                inline_depth.push("tests".into());
            }
            for named in named_top_modules(line, &inline_depth) {
                let Some(named_rank) = rank(&named) else {
                    continue; // an item of the crate root, not a layer
                };
                if named_rank > own_rank {
                    violations.push(format!(
                        "{}:{}: {own} (layer {own_rank}) uses {named} (layer {named_rank}): {}",
                        file.strip_prefix(&src).unwrap().display(),
                        number + 1,
                        line.trim()
                    ));
                }
            }
        }
    }
    // The rule must see every layer, or a renamed folder would pass unseen.
    for row in LAYERS {
        for module in *row {
            assert!(
                top_modules.contains(*module),
                "layer {module} has no source files: update LAYERS"
            );
        }
    }
    assert!(
        violations.is_empty(),
        "imports that point up a layer:\n{}",
        violations.join("\n")
    );
}

#[test]
fn the_rule_sees_upward_paths() {
    let path = vec!["format".to_string(), "label".to_string()];
    assert_eq!(
        named_top_modules("use crate::vdev::raidz::CHILDREN_MAX;", &path),
        ["vdev"]
    );
    assert_eq!(
        named_top_modules("use crate::{pool::Pool, rt::now};", &path),
        ["pool", "rt"]
    );
    assert_eq!(
        named_top_modules("use super::super::pool::Pool;", &path),
        ["pool"]
    );
    assert!(named_top_modules("use super::Label; // crate::pool", &path).is_empty());
    assert!(named_top_modules("let x = ironpool_crate::pool;", &path).is_empty());
}
