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

/// What follows each path of `code` that starts with `prefix` (`crate::`,
/// `crate::pool::`), skipping the prefix inside a longer name
/// (`foo_crate::`; `$crate::` of a macro counts as the crate).
fn paths_after<'a>(code: &'a str, prefix: &str) -> Vec<&'a str> {
    let mut found = Vec::new();
    let mut rest = code;
    while let Some(at) = rest.find(prefix) {
        let before = &rest[..at];
        rest = &rest[at + prefix.len()..];
        if !before.ends_with(|c: char| c.is_alphanumeric() || c == '_') {
            found.push(rest);
        }
    }
    found
}

/// Each `super::` chain of `code` (not one inside a longer path): how many
/// modules it climbs, and what follows it.
fn super_chains(code: &str) -> Vec<(usize, &str)> {
    let mut found = Vec::new();
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
        found.push((climbs, after));
        rest = after;
    }
    found
}

/// Every module a line names by path, as the top-level module it lies in.
/// `path` is the line's module path (one deeper inside an inline `mod`).
fn named_top_modules(line: &str, path: &[String]) -> Vec<String> {
    let code = line.split("//").next().unwrap_or("");
    let mut found: Vec<String> = paths_after(code, "crate::")
        .into_iter()
        .flat_map(first_names)
        .collect();
    // `super::super::x` climbs out of the file's module: resolve it.
    for (climbs, after) in super_chains(code) {
        if climbs >= path.len() {
            found.extend(first_names(after));
        }
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

/// The rooms of `pool/`: its files and folders below `pool/mod.rs` (which
/// holds the `Pool` façade every room uses, and is left out).
fn pool_room(path: &[String]) -> Option<String> {
    match path {
        [pool, room, ..] if pool == "pool" => Some(room.clone()),
        _ => None,
    }
}

/// The identifiers a path continues with after `rest`'s start: one name, or
/// each item's first name of a `{a::b, c}` group.
fn first_names(rest: &str) -> Vec<String> {
    let rest = rest.trim_start();
    if let Some(group) = rest.strip_prefix('{') {
        let mut depth = 0usize;
        let mut item = String::new();
        let mut names = Vec::new();
        for c in group.chars() {
            match c {
                '{' => depth += 1,
                '}' if depth == 0 => break,
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    names.extend(first_names(&item));
                    item.clear();
                    continue;
                }
                _ => {}
            }
            if depth == 0 || c != '{' {
                item.push(c);
            }
        }
        names.extend(first_names(&item));
        return names;
    }
    let name: String = rest
        .chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect();
    if name.is_empty() || name == "self" {
        Vec::new()
    } else {
        vec![name]
    }
}

/// The rooms of `pool/` that `code` (a file of module `path`, comments
/// removed) names: through `crate::pool::ROOM` and through `super::`
/// chains that climb into `pool/` and back down into a room.
fn rooms_named(code: &str, path: &[String], rooms: &BTreeSet<String>) -> BTreeSet<String> {
    let mut found: BTreeSet<String> = paths_after(code, "crate::pool::")
        .into_iter()
        .flat_map(first_names)
        .filter(|name| rooms.contains(name))
        .collect();
    for (climbs, after) in super_chains(code) {
        // `super::` of module [pool, a, b] is [pool, a].
        if climbs < path.len() {
            let target = &path[..path.len() - climbs];
            if target.len() == 1 && target[0] == "pool" {
                found.extend(first_names(after).into_iter().filter(|n| rooms.contains(n)));
            } else if let Some(room) = pool_room(target) {
                found.insert(room);
            }
        }
    }
    found
}

/// Which rooms of `pool/` import which: every arrow, room to room.
fn pool_room_arrows() -> BTreeSet<(String, String)> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    source_files(&src.join("pool"), &mut files);
    files.sort();
    let rooms: BTreeSet<String> = files
        .iter()
        .filter_map(|file| pool_room(&module_path(&src, file)))
        .collect();
    let mut arrows = BTreeSet::new();
    for file in &files {
        let path = module_path(&src, file);
        let Some(own) = pool_room(&path) else {
            continue; // pool/mod.rs, the façade
        };
        let text = std::fs::read_to_string(file).expect("read source");
        // Unit tests may reach anywhere.
        let text = text.split("#[cfg(test)]\nmod tests").next().unwrap_or("");
        let code: String = text
            .lines()
            .map(|line| line.split("//").next().unwrap_or(""))
            .collect::<Vec<_>>()
            .join("\n");
        for named in rooms_named(&code, &path, &rooms) {
            if named != own {
                arrows.insert((own.clone(), named));
            }
        }
    }
    arrows
}

/// The arrows that lie on a circle: from a room that the room it points at
/// reaches back.
fn arrows_on_circles(arrows: &BTreeSet<(String, String)>) -> BTreeSet<(String, String)> {
    let reaches = |from: &str, to: &str| {
        let mut seen = BTreeSet::new();
        let mut stack = vec![from.to_string()];
        while let Some(room) = stack.pop() {
            if room == to {
                return true;
            }
            if seen.insert(room.clone()) {
                stack.extend(
                    arrows
                        .iter()
                        .filter(|(a, _)| *a == room)
                        .map(|(_, b)| b.clone()),
                );
            }
        }
        false
    };
    arrows
        .iter()
        .filter(|(a, b)| reaches(b, a))
        .cloned()
        .collect()
}

/// No import circle among the rooms of `pool/` (issue 69): each room's
/// imports point at rooms that do not import it back, directly or through
/// others, so a room can be read, tested and changed knowing only the rooms
/// below it. One dataset's records, settings, log state and stream formats
/// (`dataset`) lie below the two data paths (`volume`, `filesystem`); what
/// acts on several datasets at once or on them from above (`datasets`:
/// the registry of those open, snapshots, clones, receive, renames, quotas
/// over the tree, keys, the intent logs' commits and replay) lies above
/// both.
#[test]
fn pool_rooms_import_no_circle() {
    let arrows = pool_room_arrows();
    let found = arrows_on_circles(&arrows);
    assert!(
        found.is_empty(),
        "arrows between rooms of pool/ that lie on an import circle: {found:?}"
    );
    // The rule sees the rooms' arrows at all (a change of how paths are
    // written must not blind it): the data paths use `dataset`.
    assert!(
        arrows.contains(&("volume".to_string(), "dataset".to_string()))
            && arrows.contains(&("datasets".to_string(), "filesystem".to_string())),
        "the rooms' arrows were not found: {arrows:?}"
    );
}

/// A circle is found where there is one.
#[test]
fn a_circle_among_rooms_is_found() {
    let arrows: BTreeSet<(String, String)> = [("a", "b"), ("b", "c"), ("c", "a"), ("c", "d")]
        .iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect();
    let found = arrows_on_circles(&arrows);
    assert_eq!(found.len(), 3);
    assert!(!found.contains(&("c".to_string(), "d".to_string())));
}

#[test]
fn the_room_rule_resolves_paths() {
    let rooms: BTreeSet<String> = ["dataset", "volume", "txg"].map(String::from).into();
    let path: Vec<String> = ["pool", "dataset", "intent_log", "commit"]
        .map(String::from)
        .into();
    let code = "use crate::pool::{volume::Volume, Pool};\nuse super::super::super::txg::Txg;\nuse super::EntryKey;";
    assert_eq!(
        rooms_named(code, &path, &rooms),
        ["dataset", "txg", "volume"].map(String::from).into()
    );
    assert_eq!(
        first_names("{a::{b, c}, d::e, self}"),
        ["a", "d"].map(String::from)
    );
}
