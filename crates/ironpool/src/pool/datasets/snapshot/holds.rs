//! User holds on snapshots (`ironpool hold TAG SNAP`, `release`, `holds`),
//! as OpenZFS's: a tag kept in the snapshot's record; a snapshot with any
//! hold cannot be destroyed (alone, with its dataset, or by a rollback
//! past it), so a replication tool keeps the base of its next incremental
//! whatever an operator or a retention script destroys meanwhile.

use std::rc::Rc;

use serde::Serialize;

use super::split_snapshot_name;
use crate::pool::{Pool, PoolError};

/// Longest tag: OpenZFS allows a name's length (255 bytes less its
/// prefix); tags are written into the directory per snapshot, so they are
/// kept short enough that thousands fit its size limit.
pub const HOLD_TAG_BYTES_MAX: usize = 200;
/// Holds one snapshot may carry: each is a line of the directory, which
/// every commit of an administrative change writes whole.
pub const HOLDS_PER_SNAPSHOT_MAX: usize = 64;

/// One hold, as `holds` lists it.
#[derive(Clone, Debug, Serialize)]
pub struct HoldInfo {
    /// The snapshot, POOL/DATASET@SNAP.
    pub snapshot: String,
    pub tag: String,
    /// When the hold was placed (unix seconds).
    pub created_unix_seconds: u64,
}

/// Whether `tag` may name a hold: not empty, printable, at most
/// [`HOLD_TAG_BYTES_MAX`] bytes.
fn check_tag(tag: &str) -> Result<(), PoolError> {
    if tag.is_empty() || tag.len() > HOLD_TAG_BYTES_MAX || tag.chars().any(char::is_control) {
        return Err(PoolError::InvalidArgument(format!(
            "'{tag}' is not a hold tag: use 1 to {HOLD_TAG_BYTES_MAX} printable characters"
        )));
    }
    Ok(())
}

impl Pool {
    /// The tags of the user holds on snapshot `full_name` (none if it does
    /// not exist).
    pub(crate) fn user_holds(&self, full_name: &str) -> Vec<String> {
        let Some((dataset, snapshot)) = split_snapshot_name(&self.name, full_name) else {
            return Vec::new();
        };
        self.datasets
            .directory
            .read()
            .lineage(dataset)
            .and_then(|lineage| lineage.snapshot(snapshot))
            .map(|record| record.holds.keys().cloned().collect())
            .unwrap_or_default()
    }

    /// Places hold `tag` on every snapshot of `snapshots` (POOL/DATASET@SNAP),
    /// all or none, in one commit. A snapshot that already has the tag, or
    /// does not exist, fails the whole call.
    pub async fn hold(self: &Rc<Self>, tag: &str, snapshots: &[String]) -> Result<(), PoolError> {
        self.change_holds(tag, snapshots, true).await
    }

    /// Takes hold `tag` off every snapshot of `snapshots`, all or none; a
    /// snapshot without that tag fails the whole call.
    pub async fn release(
        self: &Rc<Self>,
        tag: &str,
        snapshots: &[String],
    ) -> Result<(), PoolError> {
        self.change_holds(tag, snapshots, false).await
    }

    async fn change_holds(
        self: &Rc<Self>,
        tag: &str,
        snapshots: &[String],
        place: bool,
    ) -> Result<(), PoolError> {
        check_tag(tag)?;
        if snapshots.is_empty() {
            return Err(PoolError::InvalidArgument("name a snapshot".into()));
        }
        let _admin = self.datasets.admin_lock.acquire(1).await;
        self.txg.ensure_writable()?;
        // Every snapshot is checked before anything changes.
        let mut targets = Vec::with_capacity(snapshots.len());
        for full_name in snapshots {
            let (dataset, snapshot) = split_snapshot_name(&self.name, full_name)
                .filter(|(dataset, _)| !dataset.is_empty())
                .ok_or_else(|| {
                    PoolError::InvalidArgument(format!(
                        "'{full_name}': holds are on snapshots, POOL/DATASET@SNAP"
                    ))
                })?;
            let directory = self.datasets.directory.read();
            let record = directory
                .lineage(dataset)
                .and_then(|lineage| lineage.snapshot(snapshot))
                .ok_or_else(|| PoolError::NoSuchSnapshot(full_name.clone()))?;
            let has = record.holds.contains_key(tag);
            if place && has {
                return Err(PoolError::InvalidArgument(format!(
                    "{full_name} already has a hold tagged '{tag}'"
                )));
            }
            if place && record.holds.len() >= HOLDS_PER_SNAPSHOT_MAX {
                return Err(PoolError::InvalidArgument(format!(
                    "{full_name} has {HOLDS_PER_SNAPSHOT_MAX} holds, the most one snapshot may have"
                )));
            }
            if !place && !has {
                return Err(PoolError::InvalidArgument(format!(
                    "{full_name} has no hold tagged '{tag}'"
                )));
            }
            if targets.contains(&(dataset, snapshot)) {
                return Err(PoolError::InvalidArgument(format!(
                    "{full_name} is named twice"
                )));
            }
            targets.push((dataset, snapshot));
        }
        let now = crate::rt::wall_clock_ns() / 1_000_000_000;
        {
            let mut directory = self.datasets.directory.edit();
            for (dataset, snapshot) in &targets {
                let record = directory
                    .lineage_mut(dataset)
                    .and_then(|lineage| {
                        lineage
                            .snapshots
                            .iter_mut()
                            .find(|record| record.name == *snapshot)
                    })
                    .expect("checked above, under the admin lock");
                if place {
                    record.holds.insert(tag.to_string(), now);
                } else {
                    record.holds.remove(tag);
                }
            }
        }
        self.commit().await
    }

    /// The user holds of `snapshots` (POOL/DATASET@SNAP), by snapshot then
    /// tag.
    pub fn holds(&self, snapshots: &[String]) -> Result<Vec<HoldInfo>, PoolError> {
        let directory = self.datasets.directory.read();
        let mut out = Vec::new();
        for full_name in snapshots {
            let record = split_snapshot_name(&self.name, full_name)
                .and_then(|(dataset, snapshot)| directory.lineage(dataset)?.snapshot(snapshot))
                .ok_or_else(|| PoolError::NoSuchSnapshot(full_name.clone()))?;
            let (dataset, snapshot) =
                split_snapshot_name(&self.name, full_name).expect("found above");
            let snapshot = format!("{}/{dataset}@{snapshot}", self.name);
            out.extend(record.holds.iter().map(|(tag, created)| HoldInfo {
                snapshot: snapshot.clone(),
                tag: tag.clone(),
                created_unix_seconds: *created,
            }));
        }
        Ok(out)
    }
}
