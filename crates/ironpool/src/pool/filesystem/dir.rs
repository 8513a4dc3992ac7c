//! Directory objects: names hashed into leaves (`format::fsdir`), found,
//! added and removed in O(log n) leaf lookups, listed in cookie order.
//!
//! A directory's leaves are the data blocks of a metadata object of the
//! filesystem's object set; leaf (level L, prefix p) is block `2^L + p`.
//! Looking up a hash walks the levels from 0 down: every block on the way
//! is a hole (a leaf that split) until the leaf that holds the hash.

use crate::format::fsdir::{
    leaf_blkid, name_hash, next_hash_after, prefix_of, DirEntry, Leaf, LeafBlock, LEAF_BYTES,
    LEVEL_MAX,
};
use crate::object::{Object, ObjectSet};

use super::FsError;

/// The leaf that holds `hash`.
async fn find_leaf(objects: &ObjectSet, dir: &Object, hash: u32) -> Result<LeafBlock, FsError> {
    for level in 0..=LEVEL_MAX {
        let prefix = prefix_of(hash, level);
        let blkid = leaf_blkid(level, prefix);
        if !objects.data_block_present(dir, blkid).await? {
            continue;
        }
        // A leaf is checked whole once: when read in, or by the first lookup
        // after a change made some other way than through `LeafBlock`.
        let (bytes, checked) = objects.read_block_checked(dir, blkid).await?;
        let leaf = if checked {
            LeafBlock::parse_checked(bytes, level, prefix)
        } else {
            LeafBlock::parse(bytes, level, prefix)
        }
        .map_err(|error| FsError::Corrupt(format!("directory object {}: {error}", dir.id)))?;
        if !checked {
            objects.note_checked(dir, blkid)?;
        }
        return Ok(leaf);
    }
    Err(FsError::Corrupt(format!(
        "directory object {}: no leaf holds hash {hash:#x}",
        dir.id
    )))
}

async fn write_leaf(
    objects: &ObjectSet,
    dir: &Object,
    (level, prefix): (u8, u32),
    bytes: &[u8],
) -> Result<(), FsError> {
    let blkid = leaf_blkid(level, prefix);
    objects
        .write_bytes(dir, blkid * LEAF_BYTES as u64, bytes)
        .await?;
    Ok(())
}

/// Writes a leaf changed through `LeafBlock` (checked when read, and kept
/// sound by its methods): the next lookup need not check it again.
async fn write_block(objects: &ObjectSet, dir: &Object, leaf: &LeafBlock) -> Result<(), FsError> {
    let blkid = leaf_blkid(leaf.level(), leaf.prefix());
    objects
        .write_block_checked(dir, blkid, leaf.bytes())
        .await?;
    Ok(())
}

/// The empty directory's one leaf, written into a new directory object.
pub async fn init(objects: &ObjectSet, dir: &Object) -> Result<(), FsError> {
    write_leaf(objects, dir, (0, 0), &Leaf::new(0, 0).encode()).await
}

/// The entry named `name`, if any.
pub async fn lookup(
    objects: &ObjectSet,
    dir: &Object,
    salt: u64,
    name: &[u8],
) -> Result<Option<DirEntry>, FsError> {
    let hash = name_hash(salt, name);
    let leaf = find_leaf(objects, dir, hash).await?;
    Ok(leaf.find(hash, name).map(|entry| entry.to_entry()))
}

/// Adds `name` → `object` (the caller checked it is not there); returns
/// its cookie: `cookie` if given, of this name's hash and free (replay
/// gives the one the entry had), else the first free one. Splits the leaf,
/// as often as needed, when it no longer fits; refuses (no space) when a
/// leaf at the deepest level would have to split, before changing anything.
pub async fn insert(
    objects: &ObjectSet,
    dir: &Object,
    salt: u64,
    name: &[u8],
    target: (u64, u8),
    cookie: Option<u64>,
) -> Result<u64, FsError> {
    let hash = name_hash(salt, name);
    let mut block = find_leaf(objects, dir, hash).await?;
    let cookie = cookie
        .filter(|cookie| (cookie >> 32) as u32 == hash && !block.has_cookie(*cookie))
        .unwrap_or_else(|| block.free_cookie(hash));
    let entry = DirEntry {
        cookie,
        object: target.0,
        kind: target.1,
        name: name.to_vec(),
    };
    if block.insert(&entry) {
        write_block(objects, dir, &block).await?;
        return Ok(cookie);
    }
    let mut leaf = block.to_leaf();
    let at = leaf.position(entry.cookie).unwrap_or_else(|at| at);
    leaf.entries.insert(at, entry);
    let old = (leaf.level, leaf.prefix);
    let mut pending = vec![leaf];
    let mut done = Vec::new();
    while let Some(leaf) = pending.pop() {
        if leaf.fits() {
            done.push(leaf);
        } else if leaf.level == LEVEL_MAX {
            return Err(FsError::NoSpace);
        } else {
            let (low, high) = leaf.split();
            pending.push(low);
            pending.push(high);
        }
    }
    for leaf in &done {
        write_leaf(objects, dir, (leaf.level, leaf.prefix), &leaf.encode()).await?;
    }
    objects.punch(dir, leaf_blkid(old.0, old.1)).await?;
    Ok(cookie)
}

/// Removes `name`; returns its entry (None: not there).
pub async fn remove(
    objects: &ObjectSet,
    dir: &Object,
    salt: u64,
    name: &[u8],
) -> Result<Option<DirEntry>, FsError> {
    let hash = name_hash(salt, name);
    let mut leaf = find_leaf(objects, dir, hash).await?;
    let Some(entry) = leaf.remove(hash, name) else {
        return Ok(None);
    };
    write_block(objects, dir, &leaf).await?;
    Ok(Some(entry))
}

/// Points an existing entry `name` at `target` (object, type; keeps its
/// cookie, returned): the target of a rename that replaces, or an exchange.
pub async fn repoint(
    objects: &ObjectSet,
    dir: &Object,
    salt: u64,
    name: &[u8],
    target: (u64, u8),
) -> Result<u64, FsError> {
    let hash = name_hash(salt, name);
    let mut leaf = find_leaf(objects, dir, hash).await?;
    let cookie = leaf.repoint(hash, name, target).ok_or(FsError::NotFound)?;
    write_block(objects, dir, &leaf).await?;
    Ok(cookie)
}

/// Up to `max` entries with cookies at or after `from`, in cookie order.
pub async fn list(
    objects: &ObjectSet,
    dir: &Object,
    from: u64,
    max: usize,
) -> Result<Vec<DirEntry>, FsError> {
    let mut out = Vec::new();
    let mut hash = (from >> 32) as u32;
    loop {
        let leaf = find_leaf(objects, dir, hash).await?;
        for entry in leaf.entries_from(from) {
            if out.len() == max {
                return Ok(out);
            }
            out.push(entry.to_entry());
        }
        match next_hash_after(leaf.level(), leaf.prefix()) {
            Some(next) => hash = next,
            None => return Ok(out),
        }
    }
}
