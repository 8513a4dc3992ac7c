//! Bookmarks (`ironpool bookmark POOL/DS@SNAP POOL/DS#NAME`), as OpenZFS's:
//! what an incremental send needs of a snapshot (its txg and guid), kept
//! after the snapshot is destroyed. A sender that keeps a bookmark of the
//! last snapshot it sent can destroy that snapshot at once, and still send
//! the next incremental from it (`send -i #NAME`): the stream holds the
//! blocks born after the bookmark's txg, and the receiver checks the guid
//! against its copy of the snapshot. A bookmark holds no blocks and no
//! space.

use crate::pool::dataset::split_bookmark_name;
use std::rc::Rc;

use serde::Serialize;

use crate::pool::dataset::directory::{valid_name, BookmarkRecord};
use crate::pool::{Pool, PoolError};

/// Bookmarks one dataset may have: each is a line of the directory, which
/// every commit of an administrative change writes whole (a daily
/// replication keeping a year of bookmarks stays well under it).
pub const BOOKMARKS_PER_DATASET_MAX: usize = 4096;

/// A bookmark, as `list -t bookmark` shows it.
#[derive(Clone, Debug, Serialize)]
pub struct BookmarkInfo {
    /// POOL/DATASET#NAME.
    pub name: String,
    /// The snapshot's creation txg and guid, and when it was made.
    pub txg: u64,
    pub guid: String,
    pub created_unix_seconds: u64,
}

impl Pool {
    /// Makes bookmark `bookmark` (POOL/DS#NAME, or #NAME) of `source`, a
    /// snapshot (POOL/DS@SNAP) or another bookmark (POOL/DS#OTHER) of the
    /// same dataset. Returns its full name.
    pub async fn bookmark(
        self: &Rc<Self>,
        source: &str,
        bookmark: &str,
    ) -> Result<String, PoolError> {
        let _admin = self.datasets.admin_lock.acquire(1).await;
        self.txg.ensure_writable()?;
        let (dataset, from) = if source.contains('#') {
            split_bookmark_name(&self.name, source, None)
        } else {
            crate::pool::dataset::split_snapshot_name(&self.name, source)
        }
        .filter(|(dataset, _)| !dataset.is_empty())
        .ok_or_else(|| {
            PoolError::InvalidArgument(format!(
                "'{source}': a bookmark is made of a snapshot (POOL/DS@SNAP) or a bookmark (POOL/DS#NAME)"
            ))
        })?;
        let (owner, name) =
            split_bookmark_name(&self.name, bookmark, Some(dataset)).ok_or_else(|| {
                PoolError::InvalidArgument(format!(
                    "'{bookmark}': bookmarks are named POOL/DATASET#NAME (or #NAME)"
                ))
            })?;
        if owner != dataset {
            return Err(PoolError::InvalidArgument(format!(
                "{bookmark}: a bookmark belongs to its snapshot's dataset ({}/{dataset})",
                self.name
            )));
        }
        if !valid_name(name) {
            return Err(PoolError::InvalidName(name.to_string()));
        }
        let full_name = format!("{}/{dataset}#{name}", self.name);
        let record = {
            let directory = self.datasets.directory.read();
            let lineage = directory
                .lineage(dataset)
                .ok_or_else(|| PoolError::NoSuchVolume(format!("{}/{dataset}", self.name)))?;
            if lineage.bookmark(name).is_some() {
                return Err(PoolError::VolumeExists(full_name));
            }
            if lineage.bookmarks.len() >= BOOKMARKS_PER_DATASET_MAX {
                return Err(PoolError::InvalidArgument(format!(
                    "{}/{dataset} has {BOOKMARKS_PER_DATASET_MAX} bookmarks, the most a dataset may have; destroy old ones first",
                    self.name
                )));
            }
            if source.contains('#') {
                let existing = lineage
                    .bookmark(from)
                    .ok_or_else(|| PoolError::NoSuchSnapshot(source.to_string()))?;
                BookmarkRecord {
                    name: name.to_string(),
                    ..existing.clone()
                }
            } else {
                let snapshot = lineage
                    .snapshot(from)
                    .ok_or_else(|| PoolError::NoSuchSnapshot(source.to_string()))?;
                BookmarkRecord {
                    name: name.to_string(),
                    txg: snapshot.txg,
                    guid: snapshot.guid,
                    created_unix_seconds: snapshot.created_unix_seconds,
                }
            }
        };
        self.datasets
            .directory
            .edit()
            .lineage_mut(dataset)
            .expect("read above, under the admin lock")
            .bookmarks
            .push(record);
        self.commit().await?;
        Ok(full_name)
    }

    /// Destroys bookmark `full_name` (POOL/DS#NAME): nothing else changes.
    pub async fn destroy_bookmark(self: &Rc<Self>, full_name: &str) -> Result<(), PoolError> {
        let _admin = self.datasets.admin_lock.acquire(1).await;
        self.txg.ensure_writable()?;
        let (dataset, name) = split_bookmark_name(&self.name, full_name, None)
            .filter(|(dataset, _)| !dataset.is_empty())
            .ok_or_else(|| {
                PoolError::InvalidArgument(format!(
                    "'{full_name}': bookmarks are named POOL/DATASET#NAME"
                ))
            })?;
        let found = self
            .datasets
            .directory
            .read()
            .lineage(dataset)
            .is_some_and(|lineage| lineage.bookmark(name).is_some());
        if !found {
            return Err(PoolError::NoSuchSnapshot(full_name.to_string()));
        }
        self.datasets
            .directory
            .edit()
            .lineage_mut(dataset)
            .expect("read above, under the admin lock")
            .bookmarks
            .retain(|bookmark| bookmark.name != name);
        self.commit().await
    }

    /// The bookmarks of dataset `dataset` (short or full name), or of
    /// every dataset, oldest first.
    pub fn bookmarks(&self, dataset: Option<&str>) -> Result<Vec<BookmarkInfo>, PoolError> {
        let directory = self.datasets.directory.read();
        let info = |owner: &str, record: &BookmarkRecord| BookmarkInfo {
            name: format!("{}/{owner}#{}", self.name, record.name),
            txg: record.txg,
            guid: format!("{:#x}", record.guid),
            created_unix_seconds: record.created_unix_seconds,
        };
        match dataset {
            Some(dataset) => {
                let short = dataset
                    .strip_prefix(&format!("{}/", self.name))
                    .unwrap_or(dataset);
                let lineage = directory
                    .lineage(short)
                    .ok_or_else(|| PoolError::NoSuchVolume(format!("{}/{short}", self.name)))?;
                Ok(lineage
                    .bookmarks
                    .iter()
                    .map(|record| info(short, record))
                    .collect())
            }
            None => Ok(directory
                .lineages()
                .flat_map(|(owner, lineage)| {
                    lineage
                        .bookmarks
                        .iter()
                        .map(|record| info(owner, record))
                        .collect::<Vec<_>>()
                })
                .collect()),
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::pool::dataset::split_bookmark_name;

    #[test]
    fn bookmark_names_split_in_every_form() {
        assert_eq!(
            split_bookmark_name("tank", "tank/v#b", None),
            Some(("v", "b"))
        );
        assert_eq!(split_bookmark_name("tank", "v#b", None), Some(("v", "b")));
        assert_eq!(
            split_bookmark_name("tank", "#b", Some("v")),
            Some(("v", "b"))
        );
        assert_eq!(split_bookmark_name("tank", "#b", None), None);
        assert_eq!(split_bookmark_name("tank", "tank/v@s", None), None);
    }
}
