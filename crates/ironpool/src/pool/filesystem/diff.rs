//! `ironpool diff POOL/FS@SNAP [POOL/FS@LATER|POOL/FS]`: what changed in a
//! filesystem between a snapshot and a later one (or the filesystem now),
//! as `zfs diff` prints it: `+` created, `-` removed, `M` modified (data or
//! attributes; a directory whose entries changed), `R` renamed (`R OLD ->
//! NEW`), each with its path under the mountpoint.
//!
//! As the incremental send, it reads only what changed: the dnode table
//! blocks of the later snapshot born after the earlier one's txg (a dnode
//! that changed rewrote its block). Each object of those blocks is opened in
//! both snapshots and compared; object numbers are never reused, so one
//! number is one file across both. A path is found by walking up the
//! parents each object records, naming each step from its parent
//! directory's entries (read once per directory and remembered, within
//! [`DIFF_NAMES_CACHED_MAX`]). Against the filesystem itself, a temporary
//! snapshot is taken and destroyed afterwards, as `zfs diff` does: the
//! comparison is of one consistent state, with every write answered before
//! it.

use std::collections::HashMap;
use std::rc::Rc;

use serde::Serialize;

use crate::format::fsdir::COOKIE_FIRST;
use crate::format::znode::{Znode, S_IFMT};
use crate::format::ObjectType;
use crate::object::{BlockChange, Object, ObjectError};
use crate::pool::dataset::send::CHANGES_PER_WALK;
use crate::pool::filesystem::{dir, Filesystem, TABLE_BLOCK_SHIFT};
use crate::pool::{Pool, PoolError};

/// Changes one diff reports at most: the answer is one JSON document
/// (about 100 bytes a change), held whole by the server and the CLI. A diff
/// that finds more says it was cut short and which pair to narrow.
pub const DIFF_ENTRIES_MAX: usize = 200_000;
/// Directory entries the path lookup keeps in memory (about 64 bytes
/// each): past it, what it remembered is dropped and read again as needed,
/// so a diff over huge directories costs reads, not memory.
pub const DIFF_NAMES_CACHED_MAX: usize = 1 << 20;
/// Directory entries read per step of a directory's listing.
const DIFF_LIST_CHUNK: usize = 1024;
/// Deepest path the lookup follows: a loop of parents in a damaged
/// filesystem ends here with an error instead of never.
const DIFF_PATH_DEPTH_MAX: usize = 4096;
/// Dnodes in one block of a filesystem's dnode table.
const DNODES_PER_TABLE_BLOCK: u64 =
    (1 << TABLE_BLOCK_SHIFT) / crate::format::dnode::DNODE_BYTES as u64;

/// One change.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct DiffEntry {
    /// `+`, `-`, `M` or `R`.
    pub change: char,
    /// The path (under the mountpoint), as it was for `-` and `R`.
    pub path: String,
    /// For `R`: the new path.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub new_path: Option<String>,
    /// As `zfs diff -F`: `F` file, `/` directory, `@` symbolic link, `|`
    /// FIFO, `=` socket, `B` block device, `C` character device.
    pub file_type: char,
}

/// What `diff` answers.
#[derive(Clone, Debug, Serialize)]
pub struct DiffReport {
    pub from: String,
    pub to: String,
    pub entries: Vec<DiffEntry>,
    /// More than [`DIFF_ENTRIES_MAX`] changes: the rest were left out.
    pub truncated: bool,
}

/// `zfs diff -F`'s type character of a file of `mode`.
fn type_char(mode: u32) -> char {
    match mode & S_IFMT {
        0o040000 => '/',
        0o120000 => '@',
        0o010000 => '|',
        0o140000 => '=',
        0o060000 => 'B',
        0o020000 => 'C',
        _ => 'F',
    }
}

/// A name as `zfs diff` prints it: printable ASCII as is, `\` and every
/// other byte as `\ooo` (octal), so each line is one path whatever the name.
fn escape(name: &[u8], out: &mut String) {
    for &byte in name {
        if byte.is_ascii_graphic() && byte != b'\\' || byte == b' ' {
            out.push(byte as char);
        } else {
            out.push_str(&format!("\\{byte:03o}"));
        }
    }
}

/// One side of the comparison: a snapshot's filesystem and the names of
/// its directories read so far.
struct Side {
    fs: Rc<Filesystem>,
    mountpoint: String,
    /// Directory -> (object -> its name there).
    names: HashMap<u64, HashMap<u64, Vec<u8>>>,
    cached: usize,
}

/// An object of one side as the diff sees it: its znode and its data root.
struct Seen {
    object: Rc<Object>,
    znode: Znode,
}

impl Side {
    /// Object `id` if it is a file, directory or link with a name (not an
    /// attribute object, nor a file removed while open).
    async fn seen(&self, id: u64) -> Result<Option<Seen>, PoolError> {
        let object = match self.fs.objects.open(id).await {
            Ok(object) => object,
            Err(ObjectError::NoSuchObject(_)) => return Ok(None),
            Err(error) => return Err(error.into()),
        };
        let dnode = object.dnode();
        if !matches!(
            dnode.object_type,
            ObjectType::FsFile | ObjectType::FsDirectory
        ) {
            return Ok(None);
        }
        if crate::format::sealed_bonus::is_sealed(&dnode.bonus) {
            return Err(PoolError::KeyUnavailable(format!(
                "{}: its objects' attributes are sealed: load its key",
                self.fs.name()
            )));
        }
        let znode = Znode::decode(&dnode.bonus).map_err(|error| {
            PoolError::Corrupt(format!("{} object {id}: {error}", self.fs.name()))
        })?;
        if znode.nlink == 0 {
            return Ok(None);
        }
        Ok(Some(Seen { object, znode }))
    }

    /// The name of `child` in directory `dir`, if it has one there.
    async fn name_in(&mut self, dir_id: u64, child: u64) -> Result<Option<Vec<u8>>, PoolError> {
        if !self.names.contains_key(&dir_id) {
            let dir_object = self.fs.objects.open(dir_id).await?;
            let mut names = HashMap::new();
            let mut from = COOKIE_FIRST;
            loop {
                let entries = dir::list(&self.fs.objects, &dir_object, from, DIFF_LIST_CHUNK)
                    .await
                    .map_err(|error| PoolError::Corrupt(format!("{}: {error}", self.fs.name())))?;
                let Some(last) = entries.last() else {
                    break;
                };
                from = last.cookie + 1;
                let full = entries.len() < DIFF_LIST_CHUNK;
                for entry in entries {
                    names.entry(entry.object).or_insert(entry.name);
                }
                if full {
                    break;
                }
            }
            if self.cached + names.len() > DIFF_NAMES_CACHED_MAX {
                self.names.clear();
                self.cached = 0;
            }
            self.cached += names.len();
            self.names.insert(dir_id, names);
        }
        Ok(self.names[&dir_id].get(&child).cloned())
    }

    /// The path of `seen` (object `id`) under the mountpoint; an object no
    /// directory names (a damaged parent pointer) is shown by number.
    async fn path(&mut self, id: u64, seen: &Seen) -> Result<String, PoolError> {
        let root = self.fs.header.get().root;
        let mut steps: Vec<Vec<u8>> = Vec::new();
        let (mut current, mut parent) = (id, seen.znode.parent);
        while current != root {
            if steps.len() >= DIFF_PATH_DEPTH_MAX {
                return Err(PoolError::Corrupt(format!(
                    "{}: object {id}: its parents loop",
                    self.fs.name()
                )));
            }
            match self.name_in(parent, current).await? {
                Some(name) => steps.push(name),
                None => {
                    steps.push(format!("<object {current}>").into_bytes());
                    break;
                }
            }
            current = parent;
            if current == root {
                break;
            }
            parent = match self.seen(current).await? {
                Some(above) => above.znode.parent,
                None => {
                    steps.push(format!("<object {current}>").into_bytes());
                    break;
                }
            };
        }
        let mut path = self.mountpoint.trim_end_matches('/').to_string();
        for step in steps.iter().rev() {
            path.push('/');
            escape(step, &mut path);
        }
        if path.is_empty() {
            path.push('/');
        }
        Ok(path)
    }
}

impl Pool {
    /// The changes of filesystem snapshot `from` (POOL/FS@SNAP) up to
    /// `to`: a later snapshot of the same filesystem, or the filesystem
    /// itself (POOL/FS, through a temporary snapshot). See the module.
    pub async fn diff(self: &Rc<Self>, from: &str, to: &str) -> Result<DiffReport, PoolError> {
        let (short, _) = crate::pool::dataset::split_snapshot_name(&self.name, from)
            .filter(|(short, _)| self.filesystem(short).is_ok())
            .ok_or_else(|| {
                PoolError::InvalidArgument(format!(
                    "'{from}': diff compares a filesystem's snapshot (POOL/FS@SNAP) with a later one or the filesystem"
                ))
            })?;
        let short = short.to_string();
        if to.contains('@') {
            return self.diff_snapshots(&short, from, to).await;
        }
        let to_short = to.strip_prefix(&format!("{}/", self.name)).unwrap_or(to);
        if to_short != short {
            return Err(PoolError::InvalidArgument(format!(
                "{to} is not {}/{short}, the filesystem of {from}",
                self.name
            )));
        }
        let temporary = format!(
            "{}/{short}@ironpool-diff-{:016x}",
            self.name,
            crate::format::new_guid()
        );
        self.snapshot(std::slice::from_ref(&temporary)).await?;
        let report = self.diff_snapshots(&short, from, &temporary).await;
        let destroyed = self.destroy_snapshot(&temporary).await;
        let mut report = report?;
        destroyed?;
        report.to = format!("{}/{short}", self.name);
        Ok(report)
    }

    async fn diff_snapshots(
        self: &Rc<Self>,
        short: &str,
        from: &str,
        to: &str,
    ) -> Result<DiffReport, PoolError> {
        let (from_name, to_name, from_txg) = {
            let directory = self.datasets.directory.read();
            let lineage = directory
                .lineage(short)
                .ok_or_else(|| PoolError::NoSuchVolume(format!("{}/{short}", self.name)))?;
            let find = |name: &str| {
                crate::pool::dataset::split_snapshot_name(&self.name, name)
                    .filter(|(owner, _)| *owner == short)
                    .and_then(|(_, snapshot)| lineage.snapshot(snapshot))
                    .map(|record| (format!("{}/{short}@{}", self.name, record.name), record.txg))
                    .ok_or_else(|| PoolError::NoSuchSnapshot(name.to_string()))
            };
            let (from_name, from_txg) = find(from)?;
            let (to_name, to_txg) = find(to)?;
            if from_txg >= to_txg {
                return Err(PoolError::InvalidArgument(format!(
                    "{from} is not earlier than {to}"
                )));
            }
            (from_name, to_name, from_txg)
        };
        let _holds = (self.hold_snapshot(&from_name), self.hold_snapshot(&to_name));
        let mountpoint = self
            .filesystem_mountpoint(short)
            .unwrap_or_else(|| format!("{}/{short}", self.name));
        let side = |fs: Rc<Filesystem>| Side {
            fs,
            mountpoint: mountpoint.clone(),
            names: HashMap::new(),
            cached: 0,
        };
        let mut old = side(self.snapshot_filesystem(&from_name).await?);
        let mut new = side(self.snapshot_filesystem(&to_name).await?);
        let end_object = old
            .fs
            .header
            .get()
            .next_object
            .max(new.fs.header.get().next_object);
        let mut report = DiffReport {
            from: from_name,
            to: to_name,
            entries: Vec::new(),
            truncated: false,
        };
        let table = new.fs.table.clone();
        let mut walk =
            self.objects
                .walk_changed_blocks(&table, from_txg, 0, CHANGES_PER_WALK, false);
        'walk: while let Some(changes) = walk.next_batch().await? {
            for change in changes {
                let (first, count) = match change {
                    BlockChange::Data { blkid, .. } => (blkid, 1),
                    BlockChange::Holes { first, count } => (first, count),
                };
                let start = first.saturating_mul(DNODES_PER_TABLE_BLOCK);
                let end = first
                    .saturating_add(count)
                    .saturating_mul(DNODES_PER_TABLE_BLOCK)
                    .min(end_object);
                for id in start..end {
                    if let Some(entry) = diff_object(&mut old, &mut new, id).await? {
                        if report.entries.len() == DIFF_ENTRIES_MAX {
                            report.truncated = true;
                            break 'walk;
                        }
                        report.entries.push(entry);
                    }
                }
            }
        }
        Ok(report)
    }
}

/// The change of object `id` between the two sides, if any.
async fn diff_object(
    old: &mut Side,
    new: &mut Side,
    id: u64,
) -> Result<Option<DiffEntry>, PoolError> {
    let (before, after) = (old.seen(id).await?, new.seen(id).await?);
    let entry = |change, path, new_path, mode| DiffEntry {
        change,
        path,
        new_path,
        file_type: type_char(mode),
    };
    Ok(match (before, after) {
        (None, None) => None,
        (None, Some(after)) => Some(entry(
            '+',
            new.path(id, &after).await?,
            None,
            after.znode.mode,
        )),
        (Some(before), None) => Some(entry(
            '-',
            old.path(id, &before).await?,
            None,
            before.znode.mode,
        )),
        (Some(before), Some(after)) => {
            // Only an object that changed itself is reported (its ctime
            // moves with any change of its data, attributes or names, as
            // `zfs diff` judges): one whose path changed through a renamed
            // directory above it is not.
            let (old_dnode, new_dnode) = (before.object.dnode(), after.object.dnode());
            let changed = before.znode.ctime != after.znode.ctime
                || before.znode.mtime != after.znode.mtime
                || old_dnode.length_bytes != new_dnode.length_bytes
                || old_dnode.root != new_dnode.root;
            if !changed {
                return Ok(None);
            }
            let (old_path, new_path) = (old.path(id, &before).await?, new.path(id, &after).await?);
            if old_path != new_path {
                Some(entry('R', old_path, Some(new_path), after.znode.mode))
            } else {
                Some(entry('M', new_path, None, after.znode.mode))
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_print_one_line_each() {
        let mut out = String::new();
        escape(b"a b\\c\n\xff", &mut out);
        assert_eq!(out, "a b\\134c\\012\\377");
        assert_eq!(type_char(0o100644), 'F');
        assert_eq!(type_char(0o040755), '/');
        assert_eq!(type_char(0o120777), '@');
    }
}
