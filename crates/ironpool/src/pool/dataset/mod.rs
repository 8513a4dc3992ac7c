//! One dataset: what the pool stores for it, and the formats it is moved in.
//!
//! - [`directory`]: the pool directory (object 1) naming every dataset,
//!   and each one's record in it.
//! - [`dead_space`]: the space on dead lists, summed by birth txg.
//! - [`intent_log`]: a dataset's log, the state a FLUSH or an `fsync`
//!   writes into, and its records.
//! - [`keys`]: the key records of encrypted datasets, their wrapping and
//!   the keys loaded now.
//! - [`props`]: property values, what each sets, and what passes down.
//! - [`quota`]: the figures and limits of a dataset's space.
//! - [`send`]: a snapshot as a stream, through [`stream_io`]'s ends (a
//!   descriptor or memory).
//!
//! This room names no data path: each dataset kind's is a room above it
//! ([`super::volume`], [`super::filesystem`]), and what acts on several
//! datasets at once (snapshots, clones, receive, renames, quotas over a
//! tree, loading keys, committing and replaying logs) is the room above
//! both, [`super::datasets`].

pub mod dead_space;
pub mod directory;
pub mod intent_log;
pub mod keys;
pub mod props;
pub mod quota;
pub mod send;
pub mod stream_io;

/// Splits `[POOL/]DATASET@SNAP` into the dataset's short name and the
/// snapshot's.
pub fn split_snapshot_name<'a>(pool: &str, name: &'a str) -> Option<(&'a str, &'a str)> {
    let (volume, snapshot) = name.split_once('@')?;
    let volume = volume
        .strip_prefix(pool)
        .and_then(|rest| rest.strip_prefix('/'))
        .unwrap_or(volume);
    Some((volume, snapshot))
}

/// Splits "POOL/DS#NAME", "DS#NAME" or "#NAME" (of `dataset`, when given)
/// into (dataset, bookmark).
pub fn split_bookmark_name<'a>(
    pool: &str,
    name: &'a str,
    dataset: Option<&'a str>,
) -> Option<(&'a str, &'a str)> {
    let (owner, bookmark) = name.split_once('#')?;
    let owner = match owner {
        "" => dataset?,
        owner => owner
            .strip_prefix(pool)
            .and_then(|rest| rest.strip_prefix('/'))
            .unwrap_or(owner),
    };
    Some((owner, bookmark))
}
