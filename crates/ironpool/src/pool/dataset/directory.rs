//! The pool directory (object 1): volumes, the metaslab array of each top-level
//! vdev, pool properties and the last scrub's result.
//!
//! Stored as a JSON document in a metadata object: it changes only on
//! administrative operations (volume create/destroy, property changes, scrub
//! completion), is small, and a self-describing form lets later versions add
//! fields without a format break. Its integrity comes from the block checksums of
//! the object that holds it, like any metadata.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::pool::dataset::send::ResumeToken;

/// Object number of the directory.
pub const DIRECTORY_OBJECT: u64 = 1;
/// Directory documents larger than this are refused (it lists volumes and
/// properties; 16 MiB is thousands of volumes).
pub const DIRECTORY_BYTES_MAX: usize = 16 * 1024 * 1024;

/// One volume (a head: writable, with its snapshots).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeRecord {
    /// The object holding its data tree.
    pub object: u64,
    pub size_bytes: u64,
    pub block_bytes: u32,
    pub created_txg: u64,
    /// Properties set on the volume (`org:key` user properties included).
    #[serde(default)]
    pub properties: BTreeMap<String, String>,
    /// Properties received with it (`receive` of a `send -R` package): in
    /// force where none is set locally ([`own_properties`]).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub received: BTreeMap<String, String>,
    /// Identity across pools (send/receive match snapshots by guid).
    #[serde(default)]
    pub guid: u64,
    /// Its snapshots, dead list and origin.
    #[serde(flatten)]
    pub lineage: Lineage,
    /// A receive in progress into this (hidden) volume, resumable.
    #[serde(default)]
    pub receive: Option<ReceiveRecord>,
    /// Where the volume's intent log starts (see `pool::dataset::intent_log`):
    /// absent until the volume first logs a write, and in pools written
    /// before the log existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub intent_log: Option<LogHead>,
    /// Its encryption, when it is encrypted (format 5).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub crypt: Option<CryptRecord>,
}

/// An encrypted volume's key, as stored (docs/FORMAT.md, "Encryption").
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CryptRecord {
    /// Names its master key: volumes that share it (a clone and its
    /// origin) have the same, and load and unload together.
    pub key_guid: u64,
    /// The master key wrapped by the user's key
    /// (`crypto::WrappedKey::encode`), in hexadecimal.
    pub wrapped_key: String,
    /// Where `load-key` finds the user's key: `prompt` or `file:///PATH`.
    pub keylocation: String,
}

/// A dataset's own properties: those received with it (`receive` of a
/// `send -R` package) overridden by those set on it (`set`, `receive -o`),
/// as OpenZFS ranks `local` above `received`. Its settings follow these,
/// and its children inherit them.
pub fn own_properties(
    local: &BTreeMap<String, String>,
    received: &BTreeMap<String, String>,
) -> BTreeMap<String, String> {
    let mut own = received.clone();
    own.extend(
        local
            .iter()
            .map(|(name, value)| (name.clone(), value.clone())),
    );
    own
}

impl VolumeRecord {
    /// [`own_properties`] of the volume.
    pub fn own_properties(&self) -> BTreeMap<String, String> {
        own_properties(&self.properties, &self.received)
    }
}

/// What a dataset (a volume or a filesystem) has of snapshots: the same
/// for both, stored flattened into its record.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lineage {
    /// The object listing blocks the head stopped using that its latest
    /// snapshot still uses (0: none yet).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub dead_list: u64,
    /// For a clone: the snapshot it was cloned from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub origin: Option<SnapshotName>,
    /// Snapshots, oldest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub snapshots: Vec<SnapshotRecord>,
    /// Bookmarks (`ironpool bookmark`), oldest first: what an incremental
    /// send needs of a snapshot (its txg and guid) kept after the snapshot
    /// itself is destroyed. They hold no blocks.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub bookmarks: Vec<BookmarkRecord>,
}

impl Lineage {
    /// Snapshot `name` of the dataset.
    pub fn snapshot(&self, name: &str) -> Option<&SnapshotRecord> {
        self.snapshots.iter().find(|snapshot| snapshot.name == name)
    }

    /// Bookmark `name` of the dataset.
    pub fn bookmark(&self, name: &str) -> Option<&BookmarkRecord> {
        self.bookmarks.iter().find(|bookmark| bookmark.name == name)
    }
}

/// The head of a dataset's intent log chain: the first block replay reads
/// (written or not yet), the chain it belongs to and its sequence number.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogHead {
    pub chain_guid: u64,
    pub seq: u64,
    pub vdev: u32,
    pub offset: u64,
    pub asize: u32,
    /// Bytes of the block (what replay reads).
    pub bytes: u32,
    /// Copies in the chain that replay must not apply, as (the commit that
    /// wrote the copy, block number): a newer change to that block was
    /// linked in a txg this directory is part of.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cancelled: Vec<(u64, u64)>,
    /// A filesystem's copies in the chain that replay must not apply, as
    /// (commit, object, block number), for the same reason: a filesystem's
    /// copies name their file as well as the block.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cancelled_blocks: Vec<(u64, u64, u64)>,
    /// An encrypted filesystem's chain claimed at import, without its key:
    /// its blocks and the blocks its records link are allocated, and it is
    /// replayed when the key is loaded (docs/FORMAT.md, "Intent log").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claimed: Option<LogClaim>,
}

/// What an import claimed of a chain it could not replay (an encrypted
/// filesystem's, its key not loaded), so that every later reader (the
/// replay at `load-key`, a destroy, a scrub, the space check) finds the
/// same blocks and the same records, whatever was written since past them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogClaim {
    /// The txg durable at the claim: records of txgs after it apply.
    pub txg: u64,
    /// The sequence number of the last block claimed.
    pub seq: u64,
    /// How many records, from the head, the replay applies.
    pub records: u64,
}

impl LogHead {
    /// Where the head block is.
    pub fn pointer(&self) -> crate::format::intent_log::LogPointer {
        crate::format::intent_log::LogPointer {
            dva: crate::format::Dva {
                vdev: self.vdev,
                asize: self.asize,
                offset: self.offset,
            },
            bytes: self.bytes,
        }
    }

    /// The head at `pointer`, block `seq` of chain `chain_guid`.
    pub fn at(
        chain_guid: u64,
        seq: u64,
        pointer: crate::format::intent_log::LogPointer,
    ) -> LogHead {
        LogHead {
            chain_guid,
            seq,
            vdev: pointer.dva.vdev,
            offset: pointer.dva.offset,
            asize: pointer.dva.asize,
            bytes: pointer.bytes,
            cancelled: Vec::new(),
            cancelled_blocks: Vec::new(),
            claimed: None,
        }
    }
}

/// A snapshot, named by its volume and its own name.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct SnapshotName {
    pub volume: String,
    pub snapshot: String,
}

/// One snapshot: a frozen copy of a volume's tree at a txg.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotRecord {
    pub name: String,
    /// The object holding the frozen tree (its dnode; the blocks are shared).
    pub object: u64,
    /// The txg whose commit made it: blocks born at or before belong to it.
    pub txg: u64,
    pub guid: u64,
    /// Blocks the volume stopped using between the previous snapshot and this
    /// one that the previous snapshot still uses (0: none).
    #[serde(default)]
    pub dead_list: u64,
    #[serde(default)]
    pub created_unix_seconds: u64,
    /// Volumes cloned from this snapshot.
    #[serde(default)]
    pub clones: Vec<String>,
    /// User holds (`ironpool hold TAG SNAP`), by tag, with when each was
    /// placed (unix seconds): a held snapshot cannot be destroyed, so a
    /// replication tool can keep the base of its next incremental. Absent
    /// when there is none (and in directories written before holds).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub holds: BTreeMap<String, u64>,
}

/// A bookmark of a dataset: the snapshot it was made from, as an
/// incremental send starts from it (blocks born after `txg`; the receiver
/// matches `guid` against its own snapshot of the same guid).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BookmarkRecord {
    pub name: String,
    /// The snapshot's txg and guid, and when the snapshot was made.
    pub txg: u64,
    pub guid: u64,
    pub created_unix_seconds: u64,
}

/// A receive in progress into a hidden volume (see `pool::receive`): what the
/// stream is, and how far it got, so that an interrupted receive can resume.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReceiveRecord {
    /// The volume (short name) this receive will become or update.
    pub target: String,
    /// What is being received and how far it got (every block before
    /// `next_block` is received and committed with this record): exactly
    /// what `send -t` needs, so the token is this part as it stands. Its
    /// fields sit in this record's JSON object, as before.
    #[serde(flatten)]
    pub position: ResumeToken,
    /// Whether the receive keeps what it applied when it is interrupted
    /// (`receive -s`). One that does not is discarded at the next import:
    /// nothing can resume it, and its hidden volume would hold its space.
    /// Absent in directories written before this field: such a receive is
    /// kept, as it was then.
    #[serde(default = "resumable_default")]
    pub resumable: bool,
}

/// `ReceiveRecord::resumable` of a record written before the field existed.
fn resumable_default() -> bool {
    true
}

/// Outcome of the last finished scrub.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScrubRecord {
    pub started_unix_seconds: u64,
    pub finished_unix_seconds: u64,
    pub examined_bytes: u64,
    pub repaired_bytes: u64,
    pub errors: u64,
    /// False when the scrub was cancelled before the end.
    pub completed: bool,
}

/// A scrub running when the directory was written: the next import resumes
/// it from `next_object` (see `pool::scrub`). Its figures so far carry over.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScrubProgress {
    pub started_unix_seconds: u64,
    /// Every object numbered below this one was scrubbed (the bookmark).
    pub next_object: u64,
    /// Bytes allocated when the scrub started (its 100%).
    pub total_bytes: u64,
    pub examined_bytes: u64,
    pub bad_copies: u64,
    pub repaired_copies: u64,
    pub repaired_bytes: u64,
    pub errors: u64,
}

/// One object of the pool's space log: records of txgs from `first_txg` up to
/// the next log object's first txg.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SpaceLogRecord {
    pub object: u64,
    pub first_txg: u64,
}

/// The directory document.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Directory {
    pub version: u32,
    /// Per top-level vdev (by id): the object listing its space map objects.
    pub metaslab_arrays: Vec<u64>,
    /// Volumes by name within the pool.
    pub volumes: BTreeMap<String, VolumeRecord>,
    /// Pool properties.
    #[serde(default)]
    pub properties: BTreeMap<String, String>,
    #[serde(default)]
    pub last_scrub: Option<ScrubRecord>,
    /// The scrub in progress, to resume after a crash or export (absent when
    /// none runs; pools written before it have none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scrub_in_progress: Option<ScrubProgress>,
    /// The space log objects, oldest first.
    #[serde(default)]
    pub space_logs: Vec<SpaceLogRecord>,
    /// The object holding the command history (0: none yet; pools written
    /// before the history existed have none).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub history_object: u64,
    /// The block reference table's object (0: nothing was ever cloned; see
    /// `pool::clones`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub clone_table: u64,
    /// Filesystems by name within the pool (names are shared with volumes:
    /// one name is one dataset).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub filesystems: BTreeMap<String, FilesystemRecord>,
    /// The removal of a top-level vdev in progress, resumed at import (see
    /// `pool::removal`; format 4).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub removing: Option<RemovalRecord>,
    /// Top-level vdevs removed, each with the mapping that finds its
    /// blocks (format 4).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub indirect: Vec<RemovalRecord>,
}

/// A top-level vdev being removed or removed, and its mapping.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemovalRecord {
    /// The vdev's id.
    pub vdev: u32,
    /// The mapping object (`format::remap`; 0 until the first block moves).
    pub mapping: u64,
    /// When the removal started and (once done) ended, seconds since the
    /// Unix epoch, for `status`.
    pub started_unix_seconds: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub finished_unix_seconds: u64,
    /// Blocks and bytes moved (once done).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub moved_blocks: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub moved_bytes: u64,
}

/// `skip_serializing_if` for fields whose zero means absent.
fn is_zero(value: &u64) -> bool {
    *value == 0
}

impl Directory {
    /// The encryption records of every volume whose master key is
    /// `key_guid` (a volume and its clones, or raw copies of it): what
    /// `change-key` and `set keylocation=` change together.
    pub fn crypts_sharing_key(&mut self, key_guid: u64) -> impl Iterator<Item = &mut CryptRecord> {
        self.volumes
            .values_mut()
            .filter_map(|record| record.crypt.as_mut())
            .chain(
                self.filesystems
                    .values_mut()
                    .filter_map(|record| record.crypt.as_mut()),
            )
            .filter(move |crypt| crypt.key_guid == key_guid)
    }

    /// The encryption record of the filesystem `short` is under: None when
    /// it is right under the pool or its parent is not encrypted (what a
    /// dataset made there inherits, and where one moved there must fit).
    pub fn parent_crypt(&self, short: &str) -> Option<&CryptRecord> {
        self.filesystems.get(parent_name(short)?)?.crypt.as_ref()
    }

    /// Whether dataset `short` (a volume or a filesystem) exists, and its
    /// encryption record: None for no such dataset, Some(None) for one
    /// that is not encrypted.
    pub fn crypt(&self, short: &str) -> Option<Option<&CryptRecord>> {
        match self.volumes.get(short) {
            Some(record) => Some(record.crypt.as_ref()),
            None => self
                .filesystems
                .get(short)
                .map(|record| record.crypt.as_ref()),
        }
    }

    /// Every encrypted dataset (volumes, then filesystems), by short name.
    pub fn crypts(&self) -> impl Iterator<Item = (&String, &CryptRecord)> {
        self.volumes
            .iter()
            .filter_map(|(name, record)| Some((name, record.crypt.as_ref()?)))
            .chain(
                self.filesystems
                    .iter()
                    .filter_map(|(name, record)| Some((name, record.crypt.as_ref()?))),
            )
    }

    /// The key guid of the encrypted dataset whose root object (its head,
    /// or one of its snapshots) is pool object `object`; None when no
    /// encrypted dataset's is.
    pub fn key_guid_of_object(&self, object: u64) -> Option<u64> {
        let holds = |head: u64, lineage: &Lineage| {
            head == object || lineage.snapshots.iter().any(|snap| snap.object == object)
        };
        self.volumes
            .values()
            .filter(|record| holds(record.object, &record.lineage))
            .find_map(|record| record.crypt.as_ref())
            .or_else(|| {
                self.filesystems
                    .values()
                    .filter(|record| holds(record.object, &record.lineage))
                    .find_map(|record| record.crypt.as_ref())
            })
            .map(|crypt| crypt.key_guid)
    }

    /// The root objects of the datasets encrypted under key `key_guid`:
    /// each head's and each snapshot's, with its name (`SHORT` or
    /// `SHORT@SNAP`).
    pub fn roots_under_key(&self, key_guid: u64) -> Vec<(String, u64)> {
        let heads = self
            .volumes
            .iter()
            .map(|(short, record)| (short, record.object, &record.lineage, &record.crypt))
            .chain(
                self.filesystems
                    .iter()
                    .map(|(short, record)| (short, record.object, &record.lineage, &record.crypt)),
            );
        let mut roots = Vec::new();
        for (short, object, lineage, crypt) in heads {
            if crypt.as_ref().map(|crypt| crypt.key_guid) != Some(key_guid) {
                continue;
            }
            roots.push((short.clone(), object));
            for snapshot in &lineage.snapshots {
                roots.push((format!("{short}@{}", snapshot.name), snapshot.object));
            }
        }
        roots
    }

    /// The record of snapshot `name` (volume and snapshot), if it exists:
    /// a clone's origin, a send's source.
    pub fn snapshot(&self, name: &SnapshotName) -> Option<&SnapshotRecord> {
        self.lineage(&name.volume)?.snapshot(&name.snapshot)
    }

    /// The snapshots, dead list and origin of dataset `short` (a volume or
    /// a filesystem).
    pub fn lineage(&self, short: &str) -> Option<&Lineage> {
        match self.volumes.get(short) {
            Some(record) => Some(&record.lineage),
            None => self.filesystems.get(short).map(|record| &record.lineage),
        }
    }

    /// The receive record of a hidden dataset (a volume's or a
    /// filesystem's): None if there is no such dataset; Some(None) if it
    /// has no record (left before its record was written).
    pub fn receive(&self, short: &str) -> Option<Option<&ReceiveRecord>> {
        match self.volumes.get(short) {
            Some(record) => Some(record.receive.as_ref()),
            None => self
                .filesystems
                .get(short)
                .map(|record| record.receive.as_ref()),
        }
    }

    /// [`Directory::receive`], to change.
    pub fn receive_mut(&mut self, short: &str) -> Option<&mut Option<ReceiveRecord>> {
        match self.volumes.get_mut(short) {
            Some(record) => Some(&mut record.receive),
            None => self
                .filesystems
                .get_mut(short)
                .map(|record| &mut record.receive),
        }
    }

    /// [`Directory::lineage`], to change.
    pub fn lineage_mut(&mut self, short: &str) -> Option<&mut Lineage> {
        match self.volumes.get_mut(short) {
            Some(record) => Some(&mut record.lineage),
            None => self
                .filesystems
                .get_mut(short)
                .map(|record| &mut record.lineage),
        }
    }

    /// Every dataset's lineage, volumes first, by short name.
    pub fn lineages(&self) -> impl Iterator<Item = (&String, &Lineage)> {
        self.volumes
            .iter()
            .map(|(name, record)| (name, &record.lineage))
            .chain(
                self.filesystems
                    .iter()
                    .map(|(name, record)| (name, &record.lineage)),
            )
    }

    /// [`Directory::lineages`], to change (without the names).
    pub fn lineages_mut(&mut self) -> impl Iterator<Item = &mut Lineage> {
        self.volumes
            .values_mut()
            .map(|record| &mut record.lineage)
            .chain(
                self.filesystems
                    .values_mut()
                    .map(|record| &mut record.lineage),
            )
    }

    pub fn encode(&self) -> Vec<u8> {
        // Serialising plain owned data to a Vec cannot fail.
        serde_json::to_vec(self).expect("directory serialises")
    }

    pub fn decode(bytes: &[u8]) -> Result<Directory, String> {
        if bytes.len() > DIRECTORY_BYTES_MAX {
            return Err(format!("directory of {} bytes", bytes.len()));
        }
        serde_json::from_slice(bytes).map_err(|error| format!("directory: {error}"))
    }
}

/// The directory held in memory, and whether it changed since the txg build
/// last wrote it. Every change goes through [`DirectoryCell::edit`], which
/// marks it, so no room of the pool (datasets, scans, the txg build, device
/// changes, history) can change the directory and leave the change unwritten.
pub struct DirectoryCell {
    document: std::cell::RefCell<Directory>,
    dirty: std::cell::Cell<bool>,
}

impl DirectoryCell {
    /// `dirty`: a new pool's directory must be written by its first commit;
    /// an imported one is already on disk.
    pub fn new(directory: Directory, dirty: bool) -> DirectoryCell {
        DirectoryCell {
            document: std::cell::RefCell::new(directory),
            dirty: std::cell::Cell::new(dirty),
        }
    }

    /// The directory, to read (not across an await).
    pub fn read(&self) -> std::cell::Ref<'_, Directory> {
        self.document.borrow()
    }

    /// The directory, to change: marked for the next txg build's write.
    pub fn edit(&self) -> std::cell::RefMut<'_, Directory> {
        self.dirty.set(true);
        self.document.borrow_mut()
    }

    /// Whether a change waits for the next txg build.
    pub fn is_dirty(&self) -> bool {
        self.dirty.get()
    }

    /// For the txg build: whether a change waited (the build writes it now).
    pub fn take_dirty(&self) -> bool {
        self.dirty.replace(false)
    }
}

pub use crate::format::valid_name;

/// A dataset's depth (the `/`s in `POOL/A/B`: 2) stays under this, as
/// OpenZFS's `zfs_max_dataset_nesting`: each level is a lookup on every
/// walk up the tree (inheritance, mountpoints), so the tree stays shallow
/// enough to walk on every property change.
pub const DATASET_DEPTH_MAX: usize = 50;
/// Longest full dataset name, `POOL/A/B`, in bytes (OpenZFS's
/// `ZFS_MAX_DATASET_NAME_LEN` less its NUL): mount sources, stream headers
/// and the control protocol carry it whole.
pub const DATASET_NAME_BYTES_MAX: usize = 255;

/// Checks the name of a dataset within pool `pool`: `A`, or `A/B/C` for a
/// nested one, each component a valid name, less than
/// [`DATASET_DEPTH_MAX`] deep and [`DATASET_NAME_BYTES_MAX`] long in all.
pub fn valid_dataset_name(pool: &str, short: &str) -> bool {
    pool.len() + 1 + short.len() <= DATASET_NAME_BYTES_MAX
        && short.split('/').count() < DATASET_DEPTH_MAX
        && short.split('/').all(valid_name)
}

/// The parent of nested dataset `short` within its pool (`A/B` of
/// `A/B/C`); None for a dataset right under the pool.
pub fn parent_name(short: &str) -> Option<&str> {
    short.rsplit_once('/').map(|(parent, _)| parent)
}

/// The datasets above `short` within its pool, nearest first (`a/b`, then
/// `a`, for `a/b/c`).
pub fn ancestors(short: &str) -> impl Iterator<Item = &str> {
    std::iter::successors(parent_name(short), |name| parent_name(name))
}

/// Whether `short` is `ancestor` or lies below it.
pub fn is_within(short: &str, ancestor: &str) -> bool {
    short == ancestor
        || short
            .strip_prefix(ancestor)
            .is_some_and(|rest| rest.starts_with('/'))
}

/// A filesystem in the pool directory.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FilesystemRecord {
    /// The pool-level object holding its dnode table.
    pub object: u64,
    pub created_txg: u64,
    pub guid: u64,
    /// Properties set on it (`recordsize`, `mountpoint`, the dataset
    /// properties volumes have, `org:key` user properties).
    #[serde(default)]
    pub properties: BTreeMap<String, String>,
    /// Properties received with it (`receive` of a `send -R` package): in
    /// force where none is set locally.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub received: BTreeMap<String, String>,
    /// Its snapshots, dead list and origin (a clone's).
    #[serde(flatten)]
    pub lineage: Lineage,
    /// A receive in progress into this (hidden) filesystem.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub receive: Option<ReceiveRecord>,
    /// Where the filesystem's intent log starts (`fsync` writes it): absent
    /// until its first `fsync` through the log, and in pools written before
    /// filesystems had one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub intent_log: Option<LogHead>,
    /// An encrypted filesystem's key, wrapped (as a volume's record holds
    /// it; docs/FORMAT.md, "Encryption"); absent for one that is not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub crypt: Option<CryptRecord>,
    /// Times of files that its intent log's replay could not set: the
    /// import found their attributes or the times sealed and the key not
    /// loaded. Set
    /// when the key is next loaded, then dropped (a rollback to a snapshot
    /// taken before the replay drops them).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub replayed_times: Vec<ReplayedTimes>,
}

/// A file's modification and change times from its filesystem's intent
/// log, kept until its attributes can be opened ([`FilesystemRecord::replayed_times`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplayedTimes {
    pub object: u64,
    /// The txg of the replay: a snapshot of it or later holds the sizes
    /// these times go with (absent: any rollback drops them).
    #[serde(default = "txg_unknown")]
    pub txg: u64,
    /// The attribute record's txg (what its sealed times are bound to).
    #[serde(default)]
    pub log_txg: u64,
    /// The size the record set (the same).
    #[serde(default)]
    pub length: u64,
    /// The times as seconds and nanoseconds, when the record held them in
    /// the clear (a log written before they were sealed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtime: Option<(i64, u32)>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ctime: Option<(i64, u32)>,
    /// Else the record's sealed times as its body holds them after the
    /// size (ciphertext, salt, IV, 4 zero bytes, MAC), in hexadecimal.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sealed: Option<String>,
}

/// A kept time's replay txg when the record does not say: later than any
/// snapshot.
fn txg_unknown() -> u64 {
    u64::MAX
}

impl FilesystemRecord {
    /// Its own properties, received ones overridden by local ones
    /// ([`own_properties`]).
    pub fn own_properties(&self) -> BTreeMap<String, String> {
        own_properties(&self.properties, &self.received)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips() {
        let mut directory = Directory {
            version: 1,
            metaslab_arrays: vec![2, 3],
            ..Directory::default()
        };
        directory.volumes.insert(
            "vol".into(),
            crate::pool::volume::record(9, 1 << 30, 16384, 3, BTreeMap::new()),
        );
        assert_eq!(Directory::decode(&directory.encode()).unwrap(), directory);
        directory.scrub_in_progress = Some(ScrubProgress {
            started_unix_seconds: 7,
            next_object: 12,
            total_bytes: 1 << 20,
            ..ScrubProgress::default()
        });
        assert_eq!(Directory::decode(&directory.encode()).unwrap(), directory);
        assert!(Directory::decode(b"{not json").is_err());
    }

    #[test]
    fn reads_a_directory_without_a_scrub_in_progress() {
        let old = br#"{"version":1,"metaslab_arrays":[2],"volumes":{},"last_scrub":null}"#;
        assert_eq!(Directory::decode(old).unwrap().scrub_in_progress, None);
    }

    #[test]
    fn names() {
        assert!(valid_name("tank"));
        assert!(valid_name("vol-1.a_b"));
        assert!(!valid_name(""));
        assert!(!valid_name("-x"));
        assert!(!valid_name("a/b"));
        assert!(!valid_name("a@b"));
        assert!(!valid_name("a b"));
        assert!(!valid_name(&"x".repeat(201)));
    }

    #[test]
    fn nested_names() {
        assert!(valid_dataset_name("tank", "a"));
        assert!(valid_dataset_name("tank", "a/b-1/c.d"));
        assert!(!valid_dataset_name("tank", "a//b"));
        assert!(!valid_dataset_name("tank", "a/"));
        assert!(!valid_dataset_name("tank", "/a"));
        assert!(!valid_dataset_name("tank", "a/b@c"));
        assert!(!valid_dataset_name("tank", "a/%recv"));
        let deep = vec!["d"; DATASET_DEPTH_MAX - 1].join("/");
        assert!(valid_dataset_name("tank", &deep));
        assert!(!valid_dataset_name("tank", &format!("{deep}/d")));
        assert!(!valid_dataset_name(
            "tank",
            &["x".repeat(200), "y".repeat(60)].join("/")
        ));
        assert_eq!(parent_name("a/b/c"), Some("a/b"));
        assert_eq!(parent_name("a"), None);
        assert_eq!(ancestors("a/b/c").collect::<Vec<_>>(), ["a/b", "a"]);
        assert_eq!(ancestors("a").count(), 0);
        assert!(is_within("a/b", "a"));
        assert!(is_within("a", "a"));
        assert!(!is_within("ab", "a"));
        assert!(!is_within("a", "a/b"));
    }
}
