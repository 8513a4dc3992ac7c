//! `receive`: applies a send stream, all or nothing.
//!
//! The stream is written into a hidden dataset (`TARGET%recv`, a name no user
//! dataset can have) of the stream's kind, volume or filesystem: a new one for
//! a full stream, a clone of the earlier snapshot for an incremental one. Only
//! when the END record has checked out does the hidden dataset become the
//! target in one txg — renamed for a full stream; for an incremental one, its
//! tree (a volume's data, a filesystem's dnode table) takes the place of the
//! target's — and the stream's snapshot is taken in that same txg. A damaged,
//! truncated or mismatched stream therefore never changes the target.
//!
//! With `-s`, an interrupted receive keeps what it applied (committed together
//! with the position reached: a block, or a filesystem's object and block),
//! and its resume token lets `send -t` continue the stream from there.
//! Without it, a failed receive discards the hidden dataset.
//!
//! This file applies the stream; `finish.rs` makes the hidden dataset the
//! target.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;

use serde::Serialize;

use crate::format::stream::{
    self, Record, RecordHeader, StreamBegin, StreamChecker, StreamError, RECORD_HEADER_BYTES,
};
use crate::format::ObjectType;
use crate::object::Object;
use crate::pool::dataset::directory::{valid_name, ReceiveRecord};
use crate::pool::dataset::send::ResumeToken;
use crate::pool::dataset::stream_io::{Failure, StreamSource};
use crate::pool::filesystem::Filesystem;
use crate::pool::volume::Volume;
use crate::pool::{Pool, PoolError};
use crate::rt::buf::{AlignedBuf, BufSlice};
use crate::rt::sync::Semaphore;

mod finish;

/// WRITE records applied at once: their data (up to 1 MiB each) is the memory a
/// receive holds, and 16 keep the devices busy.
pub const RECEIVE_RECORDS_IN_FLIGHT: u64 = 16;
/// Data received between two saves of the resume position (each waits for the
/// writes before it): bounds what an interrupted receive sends again.
const RECEIVE_CHECKPOINT_BYTES: u64 = 256 << 20;
/// Suffix of the hidden volume a receive writes into ('%' is not allowed in
/// names, so it cannot collide with a user's volume).
pub const RECEIVE_SUFFIX: &str = "%recv";

/// How to receive.
#[derive(Clone, Debug, Default)]
pub struct ReceiveOptions {
    /// "POOL/VOL" (or "VOL"): the volume to create (full stream) or update
    /// (incremental stream).
    pub target: String,
    /// Incremental: roll the target back to the stream's source snapshot first,
    /// destroying later snapshots and changes.
    pub force: bool,
    /// Keep a partial receive for resuming when the stream breaks.
    pub save_partial: bool,
    /// Properties to set on the target (`receive -o`): a full stream's
    /// dataset is created with them; an incremental one's target takes
    /// them when the stream is in.
    pub properties: BTreeMap<String, String>,
    /// Properties received with the stream (a `send -R` package's, of the
    /// sender's dataset): they become the target's received properties
    /// (what applies where none is set locally), replacing any it had.
    /// None: a lone stream, which leaves them as they are.
    pub received: Option<BTreeMap<String, String>>,
}

/// What a receive did.
#[derive(Clone, Debug, Serialize)]
pub struct ReceiveSummary {
    pub snapshot: String,
    pub records: u64,
    pub written_blocks: u64,
    pub freed_blocks: u64,
    pub resumed_from_block: Option<u64>,
    /// A filesystem's resumed receive: the object it resumed at.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resumed_from_object: Option<u64>,
}

/// A receive's position for messages: a volume's block, a filesystem's
/// object and block.
fn position_text((object, block): (u64, u64)) -> String {
    if object == 0 {
        format!("block {block}")
    } else {
        format!("object {object} block {block}")
    }
}

/// The hidden dataset a receive writes into.
enum Hidden {
    Volume(Rc<Volume>),
    Filesystem(Rc<crate::pool::filesystem::Filesystem>),
}

impl From<StreamError> for Failure {
    fn from(error: StreamError) -> Failure {
        Failure::Stream(error.to_string())
    }
}

/// Reads the next record from `input`; None at a clean end of input.
async fn next_record(
    input: &dyn StreamSource,
    checker: &mut StreamChecker,
) -> Result<Option<(RecordHeader, Record, Option<AlignedBuf>)>, Failure> {
    let (read, header_bytes) = input
        .read_exact(AlignedBuf::zeroed(RECORD_HEADER_BYTES))
        .await;
    let count = read.map_err(|error| Failure::Stream(format!("reading the stream: {error}")))?;
    if count == 0 {
        return Ok(None);
    }
    if count < RECORD_HEADER_BYTES {
        return Err(StreamError::Truncated {
            records: checker.records(),
        }
        .into());
    }
    let header = checker.header(header_bytes[..].try_into().expect("header size"))?;
    let head_length = StreamChecker::head_bytes(&header);
    let tail_length = header.payload_bytes as usize - head_length;
    let (read, head) = input.read_exact(AlignedBuf::zeroed(head_length)).await;
    if read.map_err(|error| Failure::Stream(format!("reading the stream: {error}")))? < head_length
    {
        return Err(StreamError::Truncated {
            records: checker.records(),
        }
        .into());
    }
    let tail = if tail_length > 0 {
        let (read, tail) = input
            .read_exact(AlignedBuf::for_overwrite(tail_length))
            .await;
        if read.map_err(|error| Failure::Stream(format!("reading the stream: {error}")))?
            < tail_length
        {
            return Err(StreamError::Truncated {
                records: checker.records(),
            }
            .into());
        }
        Some(tail)
    } else {
        None
    };
    let record = checker.accept(&header, &head, tail.as_deref().unwrap_or(&[]))?;
    Ok(Some((header, record, tail)))
}

/// A receive being applied: its hidden dataset, whether it is kept for
/// resuming (`-s`), its writes in flight and the first error among them.
struct Applier {
    hidden_short: String,
    save_partial: bool,
    slots: Rc<Semaphore>,
    error: Rc<RefCell<Option<PoolError>>>,
}

impl Applier {
    fn new(hidden_short: &str, save_partial: bool) -> Applier {
        Applier {
            hidden_short: hidden_short.to_string(),
            save_partial,
            slots: Semaphore::new(RECEIVE_RECORDS_IN_FLIGHT),
            error: Rc::new(RefCell::new(None)),
        }
    }

    fn failed(&self) -> Result<(), PoolError> {
        match self.error.borrow_mut().take() {
            Some(error) => Err(error),
            None => Ok(()),
        }
    }

    /// Runs `work` (a record's writes) beside the records that follow, at
    /// most [`RECEIVE_RECORDS_IN_FLIGHT`] at once; its error, if it is the
    /// first, fails the receive at the next record ([`Applier::failed`]).
    async fn spawn(&self, work: impl std::future::Future<Output = Result<(), Failure>> + 'static) {
        let permit = self.slots.acquire(1).await;
        let error = self.error.clone();
        crate::rt::spawn(async move {
            if let Err(failure) = work.await {
                let failure = match failure {
                    Failure::Pool(error) => error,
                    Failure::Stream(message) => PoolError::InvalidArgument(message),
                };
                error.borrow_mut().get_or_insert(failure);
            }
            drop(permit);
        });
    }

    /// Waits for every write in flight; returns the first error.
    async fn drain(&self) -> Result<(), PoolError> {
        drop(self.slots.acquire(RECEIVE_RECORDS_IN_FLIGHT).await);
        self.failed()
    }
}

impl Pool {
    fn hidden_name(target_short: &str) -> String {
        format!("{target_short}{RECEIVE_SUFFIX}")
    }

    /// The resume token of an interrupted receive into `target`, if any (a
    /// receive without `-s` has none: nothing may resume it).
    pub fn receive_resume_token(&self, target: &str) -> Option<String> {
        let short = target
            .strip_prefix(&format!("{}/", self.name))
            .unwrap_or(target);
        let directory = self.datasets.directory.read();
        let record = directory.receive(&Self::hidden_name(short))??;
        record.resumable.then(|| record.position.encode())
    }

    /// Destroys the hidden dataset of a receive (a volume or a filesystem).
    async fn destroy_hidden(self: &Rc<Self>, hidden_short: &str) -> Result<(), PoolError> {
        if self.datasets.filesystems.contains(hidden_short) {
            self.destroy_filesystem(hidden_short, true).await
        } else {
            self.destroy_volume(hidden_short, true).await
        }
    }

    /// The hidden volumes of receives that cannot be resumed (started
    /// without `-s`, or left before their receive record was written): what
    /// import discards. Short names, with the target each was for.
    pub(crate) fn unresumable_receives(&self) -> Vec<(String, String)> {
        let directory = self.datasets.directory.read();
        let volumes = directory
            .volumes
            .iter()
            .map(|(short, record)| (short, record.receive.as_ref()));
        let filesystems = directory
            .filesystems
            .iter()
            .map(|(short, record)| (short, record.receive.as_ref()));
        volumes
            .chain(filesystems)
            .filter(|(short, receive)| {
                crate::pool::is_hidden_dataset(short)
                    && receive.is_none_or(|receive| !receive.resumable)
            })
            .map(|(short, receive)| {
                let target = receive.map_or_else(
                    || short.trim_end_matches(RECEIVE_SUFFIX).to_string(),
                    |receive| receive.target.clone(),
                );
                (short.clone(), target)
            })
            .collect()
    }

    /// Discards the receives a crash or kill interrupted that cannot be
    /// resumed (see `unresumable_receives`), freeing their space: run once
    /// at import, when no receive can be running. Returns a note per
    /// receive for `status`.
    pub(crate) async fn discard_unresumable_receives(self: &Rc<Self>) -> Vec<String> {
        let mut notes = Vec::new();
        for (hidden, target) in self.unresumable_receives() {
            match self.destroy_hidden(&hidden).await {
                Ok(()) => notes.push(format!("discarded the interrupted receive into {}/{target} (it was not started with -s, so it could not be resumed)", self.name)),
                Err(error) => notes.push(format!(
                    "could not discard the interrupted receive into {}/{target}: {error}; retry with `ironpool receive -A {}/{target}`",
                    self.name, self.name
                )),
            }
        }
        notes
    }

    /// Discards an interrupted receive into `target`.
    pub async fn receive_abort(self: &Rc<Self>, target: &str) -> Result<(), PoolError> {
        let short = target
            .strip_prefix(&format!("{}/", self.name))
            .unwrap_or(target)
            .to_string();
        let hidden = Self::hidden_name(&short);
        if self.datasets.directory.read().receive(&hidden).is_none() {
            return Err(PoolError::InvalidArgument(format!(
                "no interrupted receive into {}/{short}",
                self.name
            )));
        }
        self.destroy_hidden(&hidden).await
    }

    /// Receives a stream from `input` (see the module documentation).
    pub async fn receive(
        self: &Rc<Self>,
        options: ReceiveOptions,
        input: &dyn StreamSource,
    ) -> Result<ReceiveSummary, PoolError> {
        self.txg.ensure_writable()?;
        let short = options
            .target
            .strip_prefix(&format!("{}/", self.name))
            .unwrap_or(&options.target)
            .to_string();
        if !crate::pool::dataset::directory::valid_dataset_name(&self.name, &short) {
            return Err(PoolError::InvalidName(short));
        }
        self.check_parent(&short)?;
        let hidden_short = Self::hidden_name(&short);
        let mut checker = StreamChecker::new();
        let begin = match next_record(input, &mut checker).await {
            Ok(Some((_, Record::Begin(begin), _))) => begin,
            Ok(_) => return Err(PoolError::InvalidArgument("the stream is empty".into())),
            Err(Failure::Stream(message)) => {
                return Err(PoolError::InvalidArgument(format!(
                    "stream refused: {message}\nnothing was received; {}/{short} is unchanged",
                    self.name
                )))
            }
            Err(Failure::Pool(error)) => return Err(error),
        };
        let (_, snapshot_name) = begin.snapshot.split_once('@').ok_or_else(|| {
            PoolError::InvalidArgument(format!("stream names no snapshot ({})", begin.snapshot))
        })?;
        if !valid_name(snapshot_name) {
            return Err(PoolError::InvalidName(snapshot_name.to_string()));
        }
        // A received dataset keeps the sender's encryption: only where its
        // key is found may be given (for a raw stream's new dataset).
        let mut requested = options.properties.clone();
        let keylocation = requested.remove("keylocation");
        if let Some(name) = ["encryption", "keyformat", "pbkdf2iters"]
            .into_iter()
            .find(|name| requested.contains_key(*name))
        {
            return Err(PoolError::InvalidArgument(format!(
                "{name} cannot be given to a receive: the received dataset is encrypted as its stream says (a raw stream keeps the sender's key; any other is stored as the target is)"
            )));
        }
        let received_key = match (&begin.raw, keylocation) {
            (Some(raw), keylocation) if begin.from_guid == 0 => Some(
                crate::pool::dataset::keys::received_crypt(raw, keylocation)?,
            ),
            (_, Some(_)) => {
                return Err(PoolError::InvalidArgument(
                    "keylocation can be given to the receive of a full raw stream only (send -w); change it later with `ironpool change-key -o keylocation=...`".into(),
                ))
            }
            _ => None,
        };
        let properties = self.receive_properties(&begin, &requested)?;
        let received = match &options.received {
            Some(received) => Some(self.receive_properties(&begin, received)?),
            None => None,
        };
        let hidden = self
            .prepare_receive(
                &short,
                &hidden_short,
                &begin,
                &options,
                &properties,
                received_key,
            )
            .await?;
        let resumed_from_block = begin.resume_block;
        let applier = Applier::new(&hidden_short, options.save_partial);
        let applied = match &hidden {
            Hidden::Volume(volume) => {
                self.apply_stream(volume, input, &mut checker, &applier)
                    .await
            }
            Hidden::Filesystem(fs) => {
                self.apply_fs_stream(fs, &begin, input, &mut checker, &applier)
                    .await
            }
        };
        if applied.is_err() {
            // Writes still in flight would link blocks into the hidden
            // dataset after the failure path destroyed it: they end first.
            let _ = applier.drain().await;
        }
        match applied {
            Ok(()) => {}
            Err(failure) => {
                let message = match failure {
                    Failure::Stream(message) => format!("stream refused: {message}"),
                    Failure::Pool(error) => error.to_string(),
                };
                return Err(self
                    .fail_receive(&short, &hidden_short, options.save_partial, message)
                    .await);
            }
        }
        if let Err(error) = self
            .finish_receive(&short, &hidden_short, &begin, snapshot_name, options.force)
            .await
        {
            return Err(self
                .fail_receive(
                    &short,
                    &hidden_short,
                    options.save_partial,
                    error.to_string(),
                )
                .await);
        }
        if begin.from_guid != 0 && !properties.is_empty() {
            self.set_properties(&format!("{}/{short}", self.name), &properties)
                .await?;
        }
        if let Some(received) = received {
            self.set_received(&short, received).await?;
        }
        let (written_blocks, freed_blocks) = checker.counts();
        Ok(ReceiveSummary {
            snapshot: format!("{}/{short}@{snapshot_name}", self.name),
            records: checker.records(),
            written_blocks,
            freed_blocks,
            resumed_from_block,
            resumed_from_object: begin.resume_object,
        })
    }

    /// Makes `received` the received properties of dataset `short` (they
    /// apply where it sets none itself, and pass down to its children),
    /// durably.
    async fn set_received(
        self: &Rc<Self>,
        short: &str,
        received: BTreeMap<String, String>,
    ) -> Result<(), PoolError> {
        {
            let mut directory = self.datasets.directory.edit();
            if let Some(record) = directory.volumes.get_mut(short) {
                record.received = received;
            } else if let Some(record) = directory.filesystems.get_mut(short) {
                record.received = received;
            }
        }
        self.refresh_settings();
        self.datasets.filesystems_changed.notify_all();
        self.commit().await
    }

    /// Checks that the stream applies here and sets up the hidden dataset.
    async fn prepare_receive(
        self: &Rc<Self>,
        short: &str,
        hidden_short: &str,
        begin: &StreamBegin,
        options: &ReceiveOptions,
        properties: &BTreeMap<String, String>,
        received_key: Option<crate::pool::dataset::directory::CryptRecord>,
    ) -> Result<Hidden, PoolError> {
        let _admin = self.datasets.admin_lock.acquire(1).await;
        let filesystem = begin.filesystem.is_some();
        let existing_hidden = self
            .datasets
            .directory
            .read()
            .receive(hidden_short)
            .map(|receive| receive.cloned());
        let hidden_of = |pool: &Pool| -> Result<Hidden, PoolError> {
            if filesystem {
                pool.filesystem(hidden_short).map(Hidden::Filesystem)
            } else {
                pool.volume(hidden_short).map(Hidden::Volume)
            }
        };
        if begin.resume_block.is_some() || begin.resume_object.is_some() {
            let record = existing_hidden
                .flatten()
                .filter(|receive| receive.resumable)
                .ok_or_else(|| {
                    PoolError::InvalidArgument(format!(
                        "the stream resumes a receive, but none into {}/{short} was interrupted",
                        self.name
                    ))
                })?;
            if record.position.to_guid != begin.to_guid
                || record.position.from_guid != begin.from_guid
            {
                return Err(PoolError::InvalidArgument(format!(
                    "the stream resumes {}, not the interrupted receive of {}",
                    begin.snapshot, record.position.snapshot
                )));
            }
            // The rest of a raw receive is raw, and of a plain one plain:
            // its blocks are stored as the first part's were.
            if record.position.raw != begin.raw.is_some() {
                let kind = |raw: bool| if raw { "raw (send -w)" } else { "not raw" };
                return Err(PoolError::InvalidArgument(format!(
                    "the interrupted receive of {} was {}, the stream resuming it is {}: resume it with `ironpool send -t` and its token",
                    record.position.snapshot,
                    kind(record.position.raw),
                    kind(begin.raw.is_some())
                )));
            }
            let resumes_at = (
                begin.resume_object.unwrap_or(0),
                begin.resume_block.unwrap_or(0),
            );
            let received = (record.position.next_object, record.position.next_block);
            if resumes_at > received {
                return Err(PoolError::InvalidArgument(format!(
                    "the stream resumes at {}, but only what comes before {} was received",
                    position_text(resumes_at),
                    position_text(received)
                )));
            }
            // A resumed incremental stream writes into the target's hidden
            // clone as the first part did: what it needs of the target's
            // key is checked again (the pool may have been imported since,
            // its keys not loaded).
            if begin.from_guid != 0 {
                self.check_raw_target(short, begin)?;
            }
            // Resumed without -s, a failure discards it (`fail_receive`), and
            // so does the import after a crash.
            if record.resumable != options.save_partial {
                if let Some(Some(receive)) =
                    self.datasets.directory.edit().receive_mut(hidden_short)
                {
                    receive.resumable = options.save_partial;
                }
            }
            return hidden_of(self);
        }
        if let Some(receive) = existing_hidden {
            if !receive.as_ref().is_some_and(|receive| receive.resumable) {
                return Err(PoolError::InvalidArgument(format!(
                    "a receive into {}/{short} is in progress; wait for it to end",
                    self.name
                )));
            }
            let token = self.receive_resume_token(short).unwrap_or_default();
            let what = receive
                .map(|receive| receive.position.snapshot)
                .unwrap_or_default();
            return Err(PoolError::InvalidArgument(format!(
                "an interrupted receive of {what} into {}/{short} exists: resume it with `ironpool send -t {token}` piped into `ironpool receive -s`, or discard it with `ironpool receive -A {}/{short}`",
                self.name, self.name
            )));
        }
        let receive = ReceiveRecord {
            target: short.to_string(),
            position: ResumeToken {
                snapshot: begin.snapshot.clone(),
                to_guid: begin.to_guid,
                from: begin.from.clone(),
                from_guid: begin.from_guid,
                next_block: 0,
                next_object: if filesystem { 1 } else { 0 },
                raw: begin.raw.is_some(),
            },
            resumable: options.save_partial,
        };
        let hidden = if begin.from_guid == 0 {
            // A volume or a filesystem: names are shared.
            if self.datasets.directory.read().lineage(short).is_some() {
                return Err(PoolError::VolumeExists(format!("{}/{short} (a full stream creates a new dataset; receive into another name, or send incrementally)", self.name)));
            }
            match &begin.filesystem {
                Some(info) => Hidden::Filesystem(
                    self.create_receive_filesystem(
                        hidden_short,
                        info,
                        properties.clone(),
                        received_key,
                        begin.version == crate::format::stream::STREAM_VERSION_RAW,
                    )
                    .await?,
                ),
                None => {
                    drop(_admin);
                    Hidden::Volume(
                        self.create_volume_named(
                            hidden_short.to_string(),
                            begin.size_bytes,
                            begin.block_bytes,
                            properties.clone(),
                            received_key.map(crate::pool::dataset::keys::CreateKey::Received),
                        )
                        .await?,
                    )
                }
            }
        } else {
            let from = self.incremental_source(short, begin, options.force)?;
            self.check_raw_target(short, begin)?;
            let origin = format!("{}/{short}@{from}", self.name);
            if filesystem {
                Hidden::Filesystem(
                    self.clone_filesystem_locked(&origin, hidden_short, BTreeMap::new())
                        .await?,
                )
            } else {
                let hidden = self.clone_locked(&origin, hidden_short).await?;
                if begin.size_bytes > hidden.size_bytes.get() {
                    hidden.size_bytes.set(begin.size_bytes);
                    hidden.object.dnode.borrow_mut().length_bytes = begin.size_bytes;
                    hidden.object.dirty.set(true);
                    if let Some(record) =
                        self.datasets.directory.edit().volumes.get_mut(hidden_short)
                    {
                        record.size_bytes = begin.size_bytes;
                    }
                }
                Hidden::Volume(hidden)
            }
        };
        if let Some(slot) = self.datasets.directory.edit().receive_mut(hidden_short) {
            *slot = Some(receive);
        }
        Ok(hidden)
    }

    /// The target's snapshot an incremental stream applies to (by guid), after
    /// checking that the target has nothing newer (or, with `force`, that it may
    /// be rolled back).
    fn incremental_source(
        &self,
        short: &str,
        begin: &StreamBegin,
        force: bool,
    ) -> Result<String, PoolError> {
        let is_filesystem = self.datasets.filesystems.contains(short);
        if let Some(fs) = self.datasets.filesystems.get(short) {
            self.check_log_not_claimed(&fs)?;
        }
        let exists = self.datasets.directory.read().lineage(short).is_some();
        if exists && is_filesystem != begin.filesystem.is_some() {
            let (what, stream) = if is_filesystem {
                ("a filesystem", "a volume's")
            } else {
                ("a volume", "a filesystem's")
            };
            return Err(PoolError::InvalidArgument(format!(
                "{}/{short} is {what}: {stream} stream cannot be received into it",
                self.name
            )));
        }
        let lineage = self.datasets.directory.read().lineage(short).cloned().ok_or_else(|| {
            PoolError::InvalidArgument(format!("the stream is incremental from {}, but {}/{short} does not exist: receive a full stream first", begin.from.clone().unwrap_or_default(), self.name))
        })?;
        let index = lineage
            .snapshots
            .iter()
            .position(|snapshot| snapshot.guid == begin.from_guid)
            .ok_or_else(|| {
                PoolError::InvalidArgument(format!(
                "the stream is incremental from {} (guid {:#x}), which {}/{short} does not have",
                begin.from.clone().unwrap_or_default(),
                begin.from_guid,
                self.name
            ))
            })?;
        let (_, wanted) = begin.snapshot.split_once('@').unwrap_or_default();
        if lineage.snapshot(wanted).is_some() {
            return Err(PoolError::VolumeExists(format!(
                "{}/{short}@{wanted}",
                self.name
            )));
        }
        if let Some(record) = self.datasets.directory.read().volumes.get(short) {
            if record.block_bytes != begin.block_bytes {
                return Err(PoolError::InvalidArgument(format!(
                    "the stream's block size {} differs from {}/{short}'s {}",
                    begin.block_bytes, self.name, record.block_bytes
                )));
            }
        }
        if !force {
            if index + 1 != lineage.snapshots.len() {
                return Err(PoolError::InvalidArgument(format!(
                    "{}/{short} has snapshots newer than {}; use -F to roll back to it (destroying them)",
                    self.name, lineage.snapshots[index].name
                )));
            }
            if self.changed_since_latest_snapshot(short)? {
                return Err(PoolError::InvalidArgument(format!(
                    "{}/{short} was written since @{}; use -F to roll back those changes (set atime=off or readonly=on on a filesystem that only receives: reading it updates access times)",
                    self.name, lineage.snapshots[index].name
                )));
            }
        }
        Ok(lineage.snapshots[index].name.clone())
    }

    /// An incremental stream's blocks must be stored as the target's are:
    /// a raw one's sealed under the target's own master key (it was
    /// received raw from the same encryption root, or is that root), and
    /// one that is not raw into a dataset that seals its blocks itself.
    fn check_raw_target(&self, short: &str, begin: &StreamBegin) -> Result<(), PoolError> {
        let crypt = match self.filesystem_record(short) {
            Some(record) => record.crypt,
            None => self.volume_record(short)?.crypt,
        };
        let target_key = crypt.as_ref().map(|crypt| crypt.key_guid);
        match (&begin.raw, target_key) {
            // A raw stream does not carry its sender's MAC yet: the
            // receiver's build renews the target's with the key.
            (Some(raw), Some(guid))
                if raw.key_guid == guid
                    && !self.datasets.keys.available(guid)
                    && self.root_dnode(short)?.is_authenticated() =>
            {
                Err(PoolError::KeyUnavailable(format!(
                    "{}/{short} is authenticated (a MAC over its metadata): load its key to receive a raw stream into it",
                    self.name
                )))
            }
            (Some(raw), Some(guid)) if raw.key_guid == guid => Ok(()),
            (Some(_), Some(_)) => Err(PoolError::InvalidArgument(format!(
                "the raw stream is sealed under another key than {}/{short}'s: receive it raw into a new dataset",
                self.name
            ))),
            (Some(_), None) => Err(PoolError::InvalidArgument(format!(
                "{}/{short} is not encrypted: a raw stream applies only to a dataset received raw from the same encryption root",
                self.name
            ))),
            // Its changes (attributes too) would be sealed by a txg build
            // with the key.
            (None, Some(guid)) if !self.datasets.keys.available(guid) => {
                Err(PoolError::KeyUnavailable(format!(
                    "{}/{short} is encrypted: load its key to receive a stream that is not raw into it",
                    self.name
                )))
            }
            (None, _) => Ok(()),
        }
    }

    /// The root dnode of volume or filesystem `short` (its head's).
    fn root_dnode(&self, short: &str) -> Result<crate::format::Dnode, PoolError> {
        match self.datasets.filesystems.get(short) {
            Some(fs) => Ok(fs.table.dnode()),
            None => Ok(self.volume(short)?.object.dnode()),
        }
    }

    /// True when a volume or a filesystem holds changes made after its
    /// latest snapshot.
    fn changed_since_latest_snapshot(&self, short: &str) -> Result<bool, PoolError> {
        if let Some(fs) = self.datasets.filesystems.get(short) {
            let dnode = fs.table.dnode();
            // (The table's own dnode is marked dirty by a rollback to the
            // latest snapshot, which changes nothing: its nodes and objects
            // tell.)
            return Ok(dnode.root.birth_txg > dnode.prev_snapshot_txg
                || fs.table.has_dirty_nodes()
                || fs.objects.dirty_bytes() > 0
                || fs
                    .objects
                    .open_objects()
                    .iter()
                    .any(|object| object.dirty.get() && !Rc::ptr_eq(object, &fs.table))
                || !fs.table.dead.borrow().is_empty()
                || fs.table.dead_list.get() != 0);
        }
        let head = self.volume(short)?;
        let dnode = head.object.dnode();
        Ok(dnode.root.birth_txg > dnode.prev_snapshot_txg
            || !head.writeback.is_empty()
            || head.object.has_dirty_nodes()
            || !head.object.dead.borrow().is_empty()
            || head.object.dead_list.get() != 0)
    }

    /// The next record to apply. When the stream ends early or a record is
    /// refused, the writes in flight finish and, with `save_partial`, the
    /// position reached is made durable (a refused record was not
    /// accepted: the position is still the end of the last good one).
    async fn next_applied(
        self: &Rc<Self>,
        input: &dyn StreamSource,
        checker: &mut StreamChecker,
        applier: &Applier,
    ) -> Result<(Record, Option<AlignedBuf>), Failure> {
        let failure = match next_record(input, checker).await {
            Ok(Some((_, record, tail))) => return Ok((record, tail)),
            Ok(None) => StreamError::Truncated {
                records: checker.records(),
            }
            .into(),
            Err(failure) => failure,
        };
        applier.drain().await?;
        if applier.save_partial {
            self.save_receive_position(&applier.hidden_short, checker.position())
                .await?;
        }
        Err(failure)
    }

    /// Applies the records after BEGIN to the hidden volume, up to END.
    async fn apply_stream(
        self: &Rc<Self>,
        hidden: &Rc<Volume>,
        input: &dyn StreamSource,
        checker: &mut StreamChecker,
        applier: &Applier,
    ) -> Result<(), Failure> {
        let block_bytes = hidden.block_bytes;
        let mut since_checkpoint = 0u64;
        loop {
            applier.failed()?;
            let record = self.next_applied(input, checker, applier).await?;
            match record {
                (Record::Write { first_block, count }, Some(data)) => {
                    let pool = self.clone();
                    let volume = hidden.clone();
                    since_checkpoint += count as u64 * block_bytes;
                    applier
                        .spawn(async move {
                            let data = BufSlice::whole(data.into_shared());
                            pool.write(&volume, first_block * block_bytes, data, false)
                                .await?;
                            Ok(())
                        })
                        .await;
                }
                (Record::WriteRaw(raw), Some(data)) => {
                    let pool = self.clone();
                    let volume = hidden.clone();
                    since_checkpoint += block_bytes;
                    applier
                        .spawn(async move {
                            pool.write_stored_block(&volume, &raw, &data).await?;
                            Ok(())
                        })
                        .await;
                }
                (Record::Free { first_block, count }, _) => {
                    self.zero(
                        hidden,
                        first_block * block_bytes,
                        count * block_bytes,
                        false,
                        true,
                    )
                    .await?;
                }
                (Record::End(_), _) => {
                    applier.drain().await?;
                    return Ok(());
                }
                (record, _) => {
                    return Err(Failure::Stream(format!("unexpected record {record:?}")))
                }
            }
            if applier.save_partial && since_checkpoint >= RECEIVE_CHECKPOINT_BYTES {
                applier.drain().await?;
                // The position is committed with the next txg: the data before
                // it must be linked by then.
                self.drain_volume(hidden).await?;
                self.note_receive_position(&applier.hidden_short, checker.position());
                since_checkpoint = 0;
            }
        }
    }

    /// Applies the records after BEGIN to a receive's hidden filesystem, up
    /// to END. File blocks are written many at once (as a volume's are);
    /// objects, frees and directory leaves in stream order.
    async fn apply_fs_stream(
        self: &Rc<Self>,
        hidden: &Rc<Filesystem>,
        begin: &StreamBegin,
        input: &dyn StreamSource,
        checker: &mut StreamChecker,
        applier: &Applier,
    ) -> Result<(), Failure> {
        let info = begin
            .filesystem
            .ok_or_else(|| Failure::Stream("not a filesystem's stream".into()))?;
        // Record bytes, not data alone: a stream of empty files also moves
        // its resume position on.
        let mut since_checkpoint = 0u64;
        let mut current: Option<Rc<Object>> = None;
        loop {
            applier.failed()?;
            let (record, tail) = self.next_applied(input, checker, applier).await?;
            // Dirty metadata stays bounded, as for a writer.
            self.txg.throttle(self).await;
            match (record, tail) {
                (Record::Object(object), _) => {
                    since_checkpoint += stream::OBJECT_PAYLOAD_BYTES as u64;
                    current = Some(
                        hidden
                            .receive_object(self, &info, &object, begin.raw.is_some())
                            .await?,
                    );
                }
                (Record::FreeObjects { first, count }, _) => {
                    current = None;
                    hidden.receive_free_objects(self, first, count).await?;
                }
                (
                    record @ (Record::ObjectWrite { .. } | Record::ObjectWriteRaw { .. }),
                    Some(data),
                ) => {
                    let object = current
                        .clone()
                        .ok_or_else(|| Failure::Stream("blocks before their OBJECT".into()))?;
                    since_checkpoint += data.len() as u64;
                    let directory = object.object_type() == ObjectType::FsDirectory;
                    let (pool, fs) = (self.clone(), hidden.clone());
                    let write = async move {
                        match record {
                            Record::ObjectWriteRaw { raw, .. } => {
                                fs.receive_stored_block(&pool, &object, &raw, &data).await
                            }
                            Record::ObjectWrite { first_block, .. } => {
                                fs.receive_blocks(&pool, &object, first_block, &data).await
                            }
                            _ => unreachable!("matched as a write of an object's blocks"),
                        }
                    };
                    // Directory leaves in stream order; files' blocks many
                    // at once.
                    if directory {
                        write.await?;
                    } else {
                        applier.spawn(write).await;
                    }
                }
                (
                    Record::ObjectFree {
                        first_block, count, ..
                    },
                    _,
                ) => {
                    let object = current
                        .clone()
                        .ok_or_else(|| Failure::Stream("blocks before their OBJECT".into()))?;
                    hidden
                        .receive_free_blocks(self, &object, first_block, count)
                        .await?;
                }
                (Record::End(_), _) => {
                    applier.drain().await?;
                    hidden.receive_end(&info).await?;
                    return Ok(());
                }
                (record, _) => {
                    return Err(Failure::Stream(format!("unexpected record {record:?}")))
                }
            }
            if applier.save_partial && since_checkpoint >= RECEIVE_CHECKPOINT_BYTES {
                // The position is committed with the next txg: the blocks
                // before it must be linked by then.
                applier.drain().await?;
                self.note_receive_position(&applier.hidden_short, checker.position());
                since_checkpoint = 0;
            }
        }
    }

    /// Records how far a receive got (committed with the next txg, after the
    /// data before it).
    fn note_receive_position(&self, hidden_short: &str, (next_object, next_block): (u64, u64)) {
        if let Some(Some(receive)) = self.datasets.directory.edit().receive_mut(hidden_short) {
            receive.position.next_object = next_object;
            receive.position.next_block = next_block;
        }
    }

    /// Records how far a receive got and makes it durable.
    async fn save_receive_position(
        self: &Rc<Self>,
        hidden_short: &str,
        position: (u64, u64),
    ) -> Result<(), PoolError> {
        if let Ok(hidden) = self.volume(hidden_short) {
            self.drain_volume(&hidden).await?;
        }
        self.note_receive_position(hidden_short, position);
        self.txg.wait_durable(self, self.txg.open()).await
    }

    /// After a failure: keeps the partial receive (with `save_partial` and
    /// something to resume) or discards it. Returns the error to report.
    async fn fail_receive(
        self: &Rc<Self>,
        short: &str,
        hidden_short: &str,
        save_partial: bool,
        message: String,
    ) -> PoolError {
        if save_partial {
            if let Some(token) = self.receive_resume_token(short) {
                return PoolError::InvalidArgument(format!(
                    "{message}\nthe partial receive into {}/{short} was kept; resume with:\n  ironpool send -t {token} | ironpool receive -s {}/{short}\nor discard it with: ironpool receive -A {}/{short}",
                    self.name, self.name, self.name
                ));
            }
        }
        let cleanup = self.destroy_hidden(hidden_short).await;
        match cleanup {
            Ok(()) => PoolError::InvalidArgument(format!("{message}\nnothing was received; {}/{short} is unchanged", self.name)),
            Err(error) => PoolError::InvalidArgument(format!("{message}\n(discarding the partial receive also failed: {error}; retry with `ironpool receive -A {}/{short}`)", self.name)),
        }
    }
}
