//! Directory objects: names hashed into leaves (`format::fsdir`), found,
//! added and removed in O(log n) leaf lookups, listed in cookie order.
//!
//! A directory's leaves are the data blocks of a metadata object of the
//! filesystem's object set; leaf (level L >= 1, prefix p) is block
//! `2^L + p`, the root leaf block 0 (block 1 in directories made before
//! version 2 of the layout, see `format::fsdir`). Looking up a hash walks
//! the levels from 0 down: every block on the way is a hole (a leaf that
//! split) until the leaf that holds the hash. A new directory's root leaf
//! is small and grows to the full leaf size before it splits.

use crate::format::fsdir::{
    leaf_blkid, name_hash, next_hash_after, prefix_of, DirEntry, Leaf, LeafBlock, LEAF_BYTES,
    LEAF_SHIFT, LEVEL_MAX, ROOT_LEAF_BLKID, ROOT_LEAF_BLKID_V1, ROOT_LEAF_BYTES_MIN,
};
use crate::format::BlockPointer;
use crate::object::{Lent, Object, ObjectSet};

use super::FsError;

/// Where a leaf is: its level, prefix and block.
#[derive(Clone, Copy, Debug)]
struct LeafAt {
    level: u8,
    prefix: u32,
    blkid: u64,
}

/// The block of the root leaf of `dir`, if it has one (None: it split).
async fn root_blkid(objects: &ObjectSet, dir: &Object) -> Result<Option<u64>, FsError> {
    for blkid in [ROOT_LEAF_BLKID, ROOT_LEAF_BLKID_V1] {
        if objects.data_block_present(dir, blkid).await? {
            return Ok(Some(blkid));
        }
    }
    Ok(None)
}

/// Where the leaf that holds `hash` is. A hash's path has a leaf at
/// exactly one level (a split writes the halves one level down and punches
/// the leaf it replaces), so the levels beside the last one found
/// (`Object::leaf_level_hint`) are tried first, then every level from the
/// top.
async fn find_leaf(objects: &ObjectSet, dir: &Object, hash: u32) -> Result<LeafAt, FsError> {
    let hint = dir.leaf_level_hint.get().min(LEVEL_MAX);
    let near = [hint, (hint + 1).min(LEVEL_MAX), hint.saturating_sub(1)];
    for level in near.into_iter().chain(0..=LEVEL_MAX) {
        let prefix = prefix_of(hash, level);
        let blkid = if level == 0 {
            root_blkid(objects, dir).await?
        } else {
            let blkid = leaf_blkid(level, prefix);
            objects
                .data_block_present(dir, blkid)
                .await?
                .then_some(blkid)
        };
        if let Some(blkid) = blkid {
            dir.leaf_level_hint.set(level);
            return Ok(LeafAt {
                level,
                prefix,
                blkid,
            });
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
    Ok(with_leaf_at(objects, dir, hash, visit).await?.1)
}

/// [`with_leaf`], which also says where the leaf it visited is (a split
/// punches that block).
async fn with_leaf_at<R>(
    objects: &ObjectSet,
    dir: &Object,
    hash: u32,
    visit: impl FnOnce(&mut LeafBlock) -> (R, bool),
) -> Result<(LeafAt, R), FsError> {
    let at = find_leaf(objects, dir, hash).await?;
    let LeafAt {
        level,
        prefix,
        blkid,
    } = at;
    let found = objects
        .lend_block(dir, blkid, |bytes, checked| {
            match LeafBlock::open(bytes, level, prefix, checked) {
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
            }
        })
        .await?;
    found
        .map(|result| (at, result))
        .map_err(|error| FsError::Corrupt(format!("directory object {}: {error}", dir.id)))
}

/// Writes leaf `bytes` as block `blkid` of `dir` (of the directory's block
/// size).
async fn write_leaf(
    objects: &ObjectSet,
    dir: &Object,
    blkid: u64,
    bytes: &[u8],
) -> Result<(), FsError> {
    debug_assert_eq!(bytes.len() as u64, dir.data_block_bytes());
    objects
        .write_bytes(dir, blkid * bytes.len() as u64, bytes)
        .await?;
    Ok(())
}

/// The block size (shift) of a new directory object: its root leaf's.
pub const NEW_DIRECTORY_BLOCK_SHIFT: u8 = crate::format::fsdir::ROOT_LEAF_SHIFT_MIN;

/// The empty directory's one leaf, written into a new directory object
/// (made with [`NEW_DIRECTORY_BLOCK_SHIFT`]): a small root leaf, block 0.
pub async fn init(objects: &ObjectSet, dir: &Object) -> Result<(), FsError> {
    let leaf = Leaf::of_size(0, 0, ROOT_LEAF_BYTES_MIN);
    write_leaf(objects, dir, ROOT_LEAF_BLKID, &leaf.encode()).await
}

/// Grows the root leaf of `dir`, block 0 and the object's only block, to
/// [`LEAF_BYTES`] holding `leaf`'s entries: the object's block size changes
/// with it, its old block let go and the new one written in one step, with
/// no await between (the caller holds txg builds off).
fn grow_root(objects: &ObjectSet, dir: &Object, mut leaf: Leaf) -> Result<(), FsError> {
    let mut dnode = dir.dnode();
    // A small root leaf is the object's only block (this code makes no
    // other); damage, or a received directory that says otherwise, is
    // refused rather than grown over.
    if dnode.levels != 1 || dnode.data_block_shift >= LEAF_SHIFT {
        return Err(FsError::Corrupt(format!(
            "directory object {}: a small root leaf with blocks of {} bytes in {} levels",
            dir.id,
            dnode.data_block_bytes(),
            dnode.levels
        )));
    }
    objects.kill(dir, &dnode.root);
    dnode.data_block_shift = LEAF_SHIFT;
    dnode.root = BlockPointer::hole(0, dnode.object_type, 0);
    dnode.length_bytes = 0;
    dnode.used_bytes = 0;
    dnode.logical_bytes = 0;
    dnode.physical_bytes = 0;
    objects.reset_tree(dir, dnode);
    leaf.bytes = LEAF_BYTES;
    objects.write_bytes_cached(dir, ROOT_LEAF_BLKID, &leaf.encode())?;
    Ok(())
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
    let (old, placed) = with_leaf_at(objects, dir, hash, |block| {
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
            // It must grow or split: decoded, it is written again.
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
    if leaf.bytes < LEAF_BYTES {
        // A small root leaf grows to the full size first (it holds one
        // entry more than it did, far less than a full leaf).
        grow_root(objects, dir, leaf)?;
        return Ok(cookie);
    }
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
        let blkid = leaf_blkid(leaf.level, leaf.prefix);
        write_leaf(objects, dir, blkid, &leaf.encode()).await?;
    }
    objects.punch(dir, old.blkid).await?;
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
