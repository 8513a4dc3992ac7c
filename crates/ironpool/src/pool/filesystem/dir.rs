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
use crate::object::{Lent, Object, ObjectSet};

use super::FsError;

/// Where the leaf that holds `hash` is: its (level, prefix). A hash's
/// path has a leaf at exactly one level (a split writes the halves one
/// level down and punches the leaf it replaces), so the levels beside the
/// last one found (`Object::leaf_level_hint`) are tried first, then every
/// level from the top.
async fn find_leaf(objects: &ObjectSet, dir: &Object, hash: u32) -> Result<(u8, u32), FsError> {
    let hint = dir.leaf_level_hint.get().min(LEVEL_MAX);
    let near = [hint, (hint + 1).min(LEVEL_MAX), hint.saturating_sub(1)];
    for level in near.into_iter().chain(0..=LEVEL_MAX) {
        let prefix = prefix_of(hash, level);
        if objects
            .data_block_present(dir, leaf_blkid(level, prefix))
            .await?
        {
            dir.leaf_level_hint.set(level);
            return Ok((level, prefix));
        }
    }
    Err(FsError::Corrupt(format!(
        "directory object {}: no leaf holds hash {hash:#x}",
        dir.id
    )))
}

/// Runs `visit` on the leaf that holds `hash`, lent in place (no copy:
/// `ObjectSet::lend_block`); `visit` returns its result and whether it
/// changed the leaf (then written at the next txg). A leaf is checked
/// whole once: when read in, or by the first visit after a change made
/// some other way than through `LeafBlock`.
async fn with_leaf<R>(
    objects: &ObjectSet,
    dir: &Object,
    hash: u32,
    visit: impl FnOnce(&mut LeafBlock) -> (R, bool),
) -> Result<R, FsError> {
    let (level, prefix) = find_leaf(objects, dir, hash).await?;
    let found = objects
        .lend_block(
            dir,
            leaf_blkid(level, prefix),
            |bytes, checked| match LeafBlock::open(bytes, level, prefix, checked) {
                Ok(mut leaf) => {
                    let (result, changed) = visit(&mut leaf);
                    Lent {
                        bytes: leaf.into_bytes(),
                        changed,
                        checked: true,
                        result: Ok(result),
                    }
                }
                Err((bytes, error)) => Lent {
                    bytes,
                    changed: false,
                    checked: false,
                    result: Err(error),
                },
            },
        )
        .await?;
    found.map_err(|error| FsError::Corrupt(format!("directory object {}: {error}", dir.id)))
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
    with_leaf(objects, dir, hash, |leaf| {
        (leaf.find(hash, name).map(|entry| entry.to_entry()), false)
    })
    .await
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
    let placed = with_leaf(objects, dir, hash, |block| {
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
            (Ok(cookie), true)
        } else {
            // It must split: decoded, the leaf is written again as two.
            (Err((block.to_leaf(), entry)), false)
        }
    })
    .await?;
    let (mut leaf, entry) = match placed {
        Ok(cookie) => return Ok(cookie),
        Err(split) => split,
    };
    let cookie = entry.cookie;
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
    with_leaf(objects, dir, hash, |leaf| {
        let entry = leaf.remove(hash, name);
        let changed = entry.is_some();
        (entry, changed)
    })
    .await
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
    with_leaf(objects, dir, hash, |leaf| {
        let cookie = leaf.repoint(hash, name, target);
        let changed = cookie.is_some();
        (cookie, changed)
    })
    .await?
    .ok_or(FsError::NotFound)
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
        let next = with_leaf(objects, dir, hash, |leaf| {
            for entry in leaf.entries_from(from) {
                if out.len() == max {
                    return (None, false);
                }
                out.push(entry.to_entry());
            }
            (next_hash_after(leaf.level(), leaf.prefix()), false)
        })
        .await?;
        match next {
            Some(next) => hash = next,
            None => return Ok(out),
        }
    }
}
