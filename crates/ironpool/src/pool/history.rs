//! The pool's command history (`ironpool history`, as `zpool history`):
//! every command that changed the pool, with its time, kept on disk in the
//! pool itself, so that it travels with the devices and survives any number
//! of imports.
//!
//! Held whole in memory (it is bounded) and written in the txg after the
//! command, which the command waits for: once a command returns, its record
//! is as durable as its effect. The object holds records back to back, each
//! a little-endian u32 length and that many bytes of JSON; appending writes
//! only the new bytes. When the records pass [`HISTORY_BYTES_MAX`] the oldest
//! go (all but the pool's creation, which `zpool history` keeps too) down to
//! three quarters of it, and the object is rewritten once; so a full history
//! costs one rewrite per quarter of its size, not one per command.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

use crate::format::dnode::ObjectType;
use crate::object::ObjectError;
use crate::pool::{Pool, PoolError};

/// Bytes of history kept on disk at most: 1 MiB is thousands of commands (a
/// record is about 150 bytes), years of an operator's changes; OpenZFS keeps
/// 0.1% of the pool, at least 128 KiB.
pub const HISTORY_BYTES_MAX: usize = 1 << 20;

/// A command's text is cut to this many bytes (a record must stay a small
/// fraction of the history, whatever a command names).
pub const HISTORY_COMMAND_BYTES_MAX: usize = 4096;

/// Bytes of each record's length prefix.
const LENGTH_BYTES: usize = 4;

/// One command that changed the pool.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HistoryRecord {
    /// When it ran, seconds since the Unix epoch.
    pub time_unix_seconds: u64,
    /// The txg its record was written in (its effect is in it or before).
    pub txg: u64,
    /// The host the pool was open on.
    pub host: String,
    /// What ran, as a command line: `volume create tank/db 10G -o
    /// compression=lz4`.
    pub command: String,
}

impl HistoryRecord {
    fn encode(&self) -> Vec<u8> {
        // Serialising plain owned data to a Vec cannot fail.
        let json = serde_json::to_vec(self).expect("a history record serialises");
        let mut bytes = Vec::with_capacity(LENGTH_BYTES + json.len());
        bytes.extend_from_slice(&(json.len() as u32).to_le_bytes());
        bytes.extend_from_slice(&json);
        bytes
    }
}

/// The history of an open pool (see the module).
#[derive(Default)]
pub struct History {
    /// Records, oldest first, each encoded as it is on disk.
    records: VecDeque<(HistoryRecord, Vec<u8>)>,
    /// Bytes of all records.
    bytes: usize,
    /// Records at the front that the object already holds, in order.
    written: usize,
    /// Records were dropped: the object is rewritten whole at the next sync.
    rewrite: bool,
}

impl History {
    /// Reads the object's bytes. A record cut short (never: the object is
    /// written whole within a txg) or not JSON is an error.
    pub fn decode(mut bytes: &[u8]) -> Result<History, String> {
        if bytes.len() > 2 * HISTORY_BYTES_MAX {
            return Err(format!("history of {} bytes", bytes.len()));
        }
        let mut history = History::default();
        while !bytes.is_empty() {
            let (length, rest) = bytes
                .split_first_chunk::<LENGTH_BYTES>()
                .ok_or("history: a record's length is cut short")?;
            let length = u32::from_le_bytes(*length) as usize;
            if length > rest.len() {
                return Err("history: a record is cut short".into());
            }
            let (json, rest) = rest.split_at(length);
            let record: HistoryRecord = serde_json::from_slice(json)
                .map_err(|error| format!("history: a record is not readable: {error}"))?;
            history.bytes += LENGTH_BYTES + length;
            history
                .records
                .push_back((record, bytes[..LENGTH_BYTES + length].to_vec()));
            bytes = rest;
        }
        history.written = history.records.len();
        Ok(history)
    }

    /// The records, oldest first.
    pub fn records(&self) -> Vec<HistoryRecord> {
        self.records
            .iter()
            .map(|(record, _)| record.clone())
            .collect()
    }

    /// True when records wait to be written.
    pub fn is_dirty(&self) -> bool {
        self.rewrite || self.written < self.records.len()
    }

    /// Adds a record, dropping the oldest (but the first: the pool's
    /// creation) when the history passes its bound.
    pub fn push(&mut self, mut record: HistoryRecord) {
        if record.command.len() > HISTORY_COMMAND_BYTES_MAX {
            let mut cut = HISTORY_COMMAND_BYTES_MAX;
            while !record.command.is_char_boundary(cut) {
                cut -= 1;
            }
            record.command.truncate(cut);
        }
        let encoded = record.encode();
        self.bytes += encoded.len();
        self.records.push_back((record, encoded));
        if self.bytes > HISTORY_BYTES_MAX {
            let keep_first = self
                .records
                .front()
                .is_some_and(|(first, _)| first.command.starts_with("create "));
            let target = HISTORY_BYTES_MAX / 4 * 3;
            let at = usize::from(keep_first);
            while self.bytes > target && self.records.len() > at + 1 {
                let (_, dropped) = self.records.remove(at).expect("a record to drop");
                self.bytes -= dropped.len();
            }
            self.rewrite = true;
        }
    }
}

impl Pool {
    /// Records `command` (a command line without the program name) as run
    /// now; it is written with the next txg (see [`Pool::commit_history`]).
    pub fn log_history(&self, command: impl Into<String>) {
        let record = HistoryRecord {
            time_unix_seconds: crate::rt::wall_clock_ns() / 1_000_000_000,
            txg: self.txg.open(),
            host: crate::pool::hostname(),
            command: command.into(),
        };
        self.history.borrow_mut().push(record);
    }

    /// Records `command` and waits until its record is on disk: a command
    /// that returned is in the history even if the pool crashes right
    /// after. A pool that cannot commit (suspended) keeps the record for
    /// the commit that ends the suspension; the command's own result
    /// stands either way.
    pub async fn commit_history(self: &std::rc::Rc<Self>, command: impl Into<String>) {
        self.log_history(command);
        let _ = self.commit_linked().await;
    }

    /// The commands that changed the pool, oldest first.
    pub fn history(&self) -> Vec<HistoryRecord> {
        self.history.borrow().records()
    }

    /// At import: loads the history object the directory names (none in a
    /// pool from before the history existed: it starts empty). A history
    /// that cannot be read does not keep the pool from importing (its data
    /// matters more than its log): the import notes it, and the next record
    /// starts a new object (the damaged one is left as it is: its blocks may
    /// not be readable, so it cannot be rewritten in place).
    pub(in crate::pool) async fn load_history(&self) {
        let id = self.datasets.directory.read().history_object;
        if id == 0 {
            return;
        }
        match self.read_history(id).await {
            Ok(history) => *self.history.borrow_mut() = history,
            Err(error) => {
                self.import_notes.borrow_mut().push(format!(
                    "the command history could not be read ({error}): it starts over"
                ));
                *self.history.borrow_mut() = History::default();
                self.datasets.directory.edit().history_object = 0;
            }
        }
    }

    async fn read_history(&self, id: u64) -> Result<History, PoolError> {
        let object = self.objects.open(id).await?;
        let length = object.length_bytes() as usize;
        if length > 2 * HISTORY_BYTES_MAX {
            return Err(PoolError::Corrupt(format!(
                "history object {id} of {length} bytes"
            )));
        }
        // Read whole: it stays cached, so a txg appends without reading.
        let bytes = self.objects.read_bytes(&object, 0, length).await?;
        History::decode(&bytes).map_err(PoolError::Corrupt)
    }
}

/// A txg's build step: writes records not yet on disk, creating the object
/// on the first. True when it changed anything.
pub(in crate::pool) fn build_step(pool: &Pool, txg: u64) -> Result<bool, ObjectError> {
    let mut history = pool.history.borrow_mut();
    if !history.is_dirty() {
        return Ok(false);
    }
    let mut id = pool.datasets.directory.read().history_object;
    if id == 0 {
        id = pool.create_metadata_object(ObjectType::History, txg).0;
        pool.datasets.directory.edit().history_object = id;
        // A new object holds nothing yet.
        history.written = 0;
    }
    let object = pool.objects.get(id).ok_or(ObjectError::NoSuchObject(id))?;
    if history.rewrite {
        let bytes: Vec<u8> = history
            .records
            .iter()
            .flat_map(|(_, encoded)| encoded.iter().copied())
            .collect();
        pool.objects.write_bytes_cached(&object, 0, &bytes)?;
        if object.length_bytes() > bytes.len() as u64 {
            pool.objects.truncate_cached(&object, bytes.len() as u64)?;
        }
    } else {
        let offset: usize = history
            .records
            .iter()
            .take(history.written)
            .map(|(_, encoded)| encoded.len())
            .sum();
        let bytes: Vec<u8> = history
            .records
            .iter()
            .skip(history.written)
            .flat_map(|(_, encoded)| encoded.iter().copied())
            .collect();
        pool.objects
            .write_bytes_cached(&object, offset as u64, &bytes)?;
    }
    history.rewrite = false;
    history.written = history.records.len();
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(index: usize) -> HistoryRecord {
        HistoryRecord {
            time_unix_seconds: 1_800_000_000 + index as u64,
            txg: index as u64,
            host: "host".into(),
            command: format!("set compression=lz4 tank/vol{index}"),
        }
    }

    #[test]
    fn round_trips_and_appends_only_new_records() {
        let mut history = History::default();
        assert!(!history.is_dirty());
        history.push(record(0));
        history.push(record(1));
        assert!(history.is_dirty());
        let bytes: Vec<u8> = history
            .records
            .iter()
            .flat_map(|(_, encoded)| encoded.clone())
            .collect();
        let read = History::decode(&bytes).unwrap();
        assert_eq!(read.records(), vec![record(0), record(1)]);
        assert!(!read.is_dirty());
        assert!(History::decode(&bytes[..bytes.len() - 1]).is_err());
        assert!(History::decode(&[5, 0, 0, 0, b'{', b'x', b'}', b'!', b'!']).is_err());
    }

    #[test]
    fn a_full_history_drops_the_oldest_but_keeps_the_creation() {
        let mut history = History::default();
        history.push(HistoryRecord {
            command: "create tank mirror a b".into(),
            ..record(0)
        });
        let mut index = 1;
        while !history.rewrite {
            history.push(record(index));
            index += 1;
        }
        assert!(history.bytes <= HISTORY_BYTES_MAX / 4 * 3);
        let records = history.records();
        assert_eq!(records[0].command, "create tank mirror a b");
        assert_eq!(records.last().unwrap(), &record(index - 1));
        // Oldest gone, newest kept, in order.
        assert!(records[1].txg > 1);
        assert!(records.windows(2).all(|pair| pair[0].txg < pair[1].txg));
    }

    #[test]
    fn a_long_command_is_cut() {
        let mut history = History::default();
        history.push(HistoryRecord {
            command: "ü".repeat(HISTORY_COMMAND_BYTES_MAX),
            ..record(0)
        });
        assert!(history.records()[0].command.len() <= HISTORY_COMMAND_BYTES_MAX);
    }
}
