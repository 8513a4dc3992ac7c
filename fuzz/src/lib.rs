//! The checks behind ironpool's fuzz targets, one module per target.
//!
//! Each `check(data)` feeds `data` to one decoder and asserts a property, not
//! only that nothing panics:
//! - on-disk structures: whatever decodes re-encodes, and the re-encoding decodes
//!   to the same value (round trip); the accessors the engine calls on a decoded
//!   value do not panic either;
//! - NBD and FUSE parsers: what parses is exactly what the wire bytes say (re-encoding the
//!   parsed request gives back the bytes), and a refusal is the expected kind.
//!
//! A failed assertion panics; libFuzzer reports the panic as a crash and saves
//! the input. Structures protected by their own checksum (labels, uberblocks)
//! are checked twice: as given, and, when only the checksum is wrong, with the
//! checksum recomputed, so that mutated fields reach the validation behind it.
//!
//! The modules hold the logic rather than the files in `fuzz_targets/`, so the
//! replay test below runs every committed seed and saved regression through
//! exactly what the fuzzer runs, with plain `cargo test` and no libFuzzer.

pub mod block_pointer;
pub mod clone_table;
pub mod directory;
pub mod dnode;
pub mod fs_metadata;
pub mod fuse_request;
pub mod indirect_mapping;
pub mod intent_log;
pub mod label;
pub mod nbd_handshake;
pub mod nbd_request;
pub mod replication_package;
pub mod send_stream;
pub mod spacemap;
pub mod tree_node;
pub mod uberblock;

/// A target's check: panics when `data` shows a bug.
pub type Check = fn(data: &[u8]);

/// Every target by name (the name of its binary and of its corpus directory),
/// with its check.
pub const TARGETS: [(&str, Check); 16] = [
    ("nbd_handshake", nbd_handshake::check),
    ("nbd_request", nbd_request::check),
    ("label", label::check),
    ("uberblock", uberblock::check),
    ("block_pointer", block_pointer::check),
    ("tree_node", tree_node::check),
    ("dnode", dnode::check),
    ("spacemap", spacemap::check),
    ("clone_table", clone_table::check),
    ("indirect_mapping", indirect_mapping::check),
    ("directory", directory::check),
    ("send_stream", send_stream::check),
    ("replication_package", replication_package::check),
    ("intent_log", intent_log::check),
    ("fs_metadata", fs_metadata::check),
    ("fuse_request", fuse_request::check),
];

#[cfg(test)]
mod tests {
    use std::path::Path;

    /// Runs every file of `corpus/<target>/` and `regressions/<target>/` through
    /// its target's check: a crash saved under `regressions/` fails here until
    /// the engine is fixed, and stays a regression test afterwards.
    #[test]
    fn replays_corpora_and_regressions() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let mut replayed_count = 0usize;
        for (name, check) in super::TARGETS {
            for folder in ["corpus", "regressions"] {
                let Ok(entries) = std::fs::read_dir(root.join(folder).join(name)) else { continue };
                for entry in entries {
                    let path = entry.expect("readable directory entry").path();
                    let file_name = path.file_name().unwrap_or_default().to_string_lossy();
                    if file_name.starts_with('.') || file_name.ends_with(".md") {
                        continue;
                    }
                    let data = std::fs::read(&path).expect("readable input");
                    eprintln!("replaying {}", path.display());
                    check(&data);
                    replayed_count += 1;
                }
            }
        }
        assert!(replayed_count > 0, "no corpus found under {}", root.display());
    }
}
