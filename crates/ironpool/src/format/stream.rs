//! The send stream: a volume snapshot (full) or the difference between two
//! snapshots (incremental) as a sequence of self-checking records, for
//! `ironpool send | ironpool receive` over a pipe, a file or ssh.
//!
//! Each record is a 32-byte header and a payload:
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 4 | magic `IPSR` (0x52535049 little-endian) |
//! | 4 | 4 | kind: 1 BEGIN, 2 WRITE, 3 FREE, 4 END |
//! | 8 | 8 | payload length in bytes |
//! | 16 | 16 | XXH3-128 of: the previous record's checksum (zeros for BEGIN), header bytes 0..16, the payload |
//!
//! Chaining each checksum to the previous one makes a dropped, repeated or
//! reordered record as detectable as a flipped bit, and a stream is only
//! complete with its END record, which counts what came before: a truncated
//! stream can never pass for a whole one.
//!
//! Payloads:
//! - BEGIN: a JSON document ([`StreamBegin`]): format version, what the stream
//!   holds, and the identities (guids) a receiver checks before applying it.
//! - WRITE: first block u64, block count u32, zero u32, then the blocks' logical
//!   (uncompressed) bytes, `count × block_bytes`. Blocks ascend through a stream.
//! - FREE: first block u64, block count u64: these blocks read as zeros.
//! - END: records before it u64, blocks written u64, blocks freed u64.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// "IPSR" as bytes on the wire.
pub const STREAM_MAGIC: u32 = u32::from_le_bytes(*b"IPSR");
/// Version of the stream format this build writes; it reads this one only.
pub const STREAM_VERSION: u32 = 1;
/// Size of a record header.
pub const RECORD_HEADER_BYTES: usize = 32;
/// Largest BEGIN payload (a few hundred bytes of JSON in practice).
pub const BEGIN_PAYLOAD_BYTES_MAX: u64 = 64 * 1024;
/// Data bytes a WRITE record carries at most: large enough to stream at full
/// speed, small enough that a receiver buffers a bounded number of them.
pub const WRITE_DATA_BYTES_MAX: u64 = 1024 * 1024;
/// Fixed part of a WRITE payload.
pub const WRITE_HEADER_BYTES: usize = 16;
/// Largest payload of any record.
pub const RECORD_PAYLOAD_BYTES_MAX: u64 = WRITE_HEADER_BYTES as u64 + WRITE_DATA_BYTES_MAX;

/// Kinds of records.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecordKind {
    Begin = 1,
    Write = 2,
    Free = 3,
    End = 4,
}

impl RecordKind {
    fn from_code(code: u32) -> Option<RecordKind> {
        match code {
            1 => Some(RecordKind::Begin),
            2 => Some(RecordKind::Write),
            3 => Some(RecordKind::Free),
            4 => Some(RecordKind::End),
            _ => None,
        }
    }
}

/// Why a stream is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StreamError {
    #[error("not an ironpool send stream (bad magic at record {record})")]
    BadMagic { record: u64 },
    #[error("record {record}: unknown kind {kind}")]
    UnknownKind { record: u64, kind: u32 },
    #[error("record {record}: payload of {bytes} bytes exceeds the limit")]
    TooLarge { record: u64, bytes: u64 },
    #[error("record {record}: checksum mismatch (the stream is damaged)")]
    Checksum { record: u64 },
    #[error("record {record}: {detail}")]
    Malformed { record: u64, detail: String },
    #[error("the stream ends after {records} records without its END record (truncated)")]
    Truncated { records: u64 },
    #[error(
        "stream format version {0} is not supported (this build reads version {STREAM_VERSION})"
    )]
    Version(u32),
}

/// What a stream holds (the BEGIN record).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamBegin {
    pub version: u32,
    /// The snapshot sent, as named on the sender: "POOL/VOL@SNAP".
    pub snapshot: String,
    pub to_guid: u64,
    /// For an incremental stream: the earlier snapshot it applies on top of.
    #[serde(default)]
    pub from: Option<String>,
    #[serde(default)]
    pub from_guid: u64,
    pub size_bytes: u64,
    pub block_bytes: u32,
    /// When resuming an interrupted receive: the first block this stream carries
    /// (everything before was received already).
    #[serde(default)]
    pub resume_block: Option<u64>,
    /// The sender's settings, for information (a receiver follows its own).
    #[serde(default)]
    pub properties: BTreeMap<String, String>,
}

/// The END record's counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct StreamEnd {
    pub records: u64,
    pub written_blocks: u64,
    pub freed_blocks: u64,
}

/// A decoded record (WRITE data stays in the caller's buffer).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Record {
    Begin(StreamBegin),
    Write { first_block: u64, count: u32 },
    Free { first_block: u64, count: u64 },
    End(StreamEnd),
}

/// A parsed header (before its payload is read).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecordHeader {
    pub kind: RecordKind,
    pub payload_bytes: u64,
    pub checksum: [u8; 16],
    raw: [u8; 16],
}

fn chained(previous: &[u8; 16], header_prefix: &[u8], payload: &[&[u8]]) -> [u8; 16] {
    let mut hasher = xxhash_rust::xxh3::Xxh3::new();
    hasher.update(previous);
    hasher.update(header_prefix);
    for part in payload {
        hasher.update(part);
    }
    hasher.digest128().to_le_bytes()
}

/// Encodes a record header for `payload` (given in parts, as written), chained to
/// `previous`; returns the header and the record's checksum (the next `previous`).
pub fn encode_header(
    kind: RecordKind,
    payload: &[&[u8]],
    previous: &[u8; 16],
) -> ([u8; RECORD_HEADER_BYTES], [u8; 16]) {
    let length: usize = payload.iter().map(|part| part.len()).sum();
    let mut header = [0u8; RECORD_HEADER_BYTES];
    header[0..4].copy_from_slice(&STREAM_MAGIC.to_le_bytes());
    header[4..8].copy_from_slice(&(kind as u32).to_le_bytes());
    header[8..16].copy_from_slice(&(length as u64).to_le_bytes());
    let checksum = chained(previous, &header[..16], payload);
    header[16..32].copy_from_slice(&checksum);
    (header, checksum)
}

/// Parses a header; `record` is its index (for messages).
pub fn decode_header(
    bytes: &[u8; RECORD_HEADER_BYTES],
    record: u64,
) -> Result<RecordHeader, StreamError> {
    let magic = u32::from_le_bytes(bytes[0..4].try_into().expect("4 bytes"));
    if magic != STREAM_MAGIC {
        return Err(StreamError::BadMagic { record });
    }
    let code = u32::from_le_bytes(bytes[4..8].try_into().expect("4 bytes"));
    let kind =
        RecordKind::from_code(code).ok_or(StreamError::UnknownKind { record, kind: code })?;
    let payload_bytes = u64::from_le_bytes(bytes[8..16].try_into().expect("8 bytes"));
    let limit = match kind {
        RecordKind::Begin => BEGIN_PAYLOAD_BYTES_MAX,
        RecordKind::Write => RECORD_PAYLOAD_BYTES_MAX,
        RecordKind::Free | RecordKind::End => 24,
    };
    if payload_bytes > limit {
        return Err(StreamError::TooLarge {
            record,
            bytes: payload_bytes,
        });
    }
    let mut raw = [0u8; 16];
    raw.copy_from_slice(&bytes[..16]);
    Ok(RecordHeader {
        kind,
        payload_bytes,
        checksum: bytes[16..32].try_into().expect("16 bytes"),
        raw,
    })
}

/// Checks a record's checksum against its chain and parses its payload, given
/// as `head` then `tail` (a receiver reads a WRITE's fixed part apart from its
/// data, which goes straight into an aligned buffer; other records are all head).
/// `block_bytes`: the stream's block size (from BEGIN; 0 before it).
pub fn decode_payload(
    header: &RecordHeader,
    head: &[u8],
    tail: &[u8],
    previous: &[u8; 16],
    record: u64,
    block_bytes: u32,
) -> Result<Record, StreamError> {
    if (head.len() + tail.len()) as u64 != header.payload_bytes {
        return Err(StreamError::Malformed {
            record,
            detail: "payload length differs from its header".into(),
        });
    }
    if chained(previous, &header.raw, &[head, tail]) != header.checksum {
        return Err(StreamError::Checksum { record });
    }
    let payload = head;
    let malformed = |detail: &str| StreamError::Malformed {
        record,
        detail: detail.to_string(),
    };
    let u64_at = |offset: usize| {
        u64::from_le_bytes(payload[offset..offset + 8].try_into().expect("8 bytes"))
    };
    match header.kind {
        kind if kind != RecordKind::Write && !tail.is_empty() => {
            Err(malformed("only WRITE records carry data"))
        }
        RecordKind::Begin => {
            let begin: StreamBegin = serde_json::from_slice(payload)
                .map_err(|error| malformed(&format!("BEGIN: {error}")))?;
            if begin.version != STREAM_VERSION {
                return Err(StreamError::Version(begin.version));
            }
            if !begin.block_bytes.is_power_of_two()
                || begin.block_bytes < 512
                || begin.block_bytes as u64 > WRITE_DATA_BYTES_MAX
            {
                return Err(malformed("BEGIN: bad block size"));
            }
            if begin.size_bytes == 0 || !begin.size_bytes.is_multiple_of(begin.block_bytes as u64) {
                return Err(malformed(
                    "BEGIN: size is not a positive multiple of the block size",
                ));
            }
            Ok(Record::Begin(begin))
        }
        RecordKind::Write => {
            if payload.len() != WRITE_HEADER_BYTES || block_bytes == 0 {
                return Err(malformed("WRITE too short or before BEGIN"));
            }
            let first_block = u64_at(0);
            let count = u32::from_le_bytes(payload[8..12].try_into().expect("4 bytes"));
            if count == 0 || tail.len() as u64 != count as u64 * block_bytes as u64 {
                return Err(malformed("WRITE length does not match its block count"));
            }
            Ok(Record::Write { first_block, count })
        }
        RecordKind::Free => {
            if payload.len() != 16 {
                return Err(malformed("FREE payload is not 16 bytes"));
            }
            let count = u64_at(8);
            if count == 0 {
                return Err(malformed("FREE of no blocks"));
            }
            Ok(Record::Free {
                first_block: u64_at(0),
                count,
            })
        }
        RecordKind::End => {
            if payload.len() != 24 {
                return Err(malformed("END payload is not 24 bytes"));
            }
            Ok(Record::End(StreamEnd {
                records: u64_at(0),
                written_blocks: u64_at(8),
                freed_blocks: u64_at(16),
            }))
        }
    }
}

/// The fixed part of a WRITE payload.
pub fn write_header(first_block: u64, count: u32) -> [u8; WRITE_HEADER_BYTES] {
    let mut out = [0u8; WRITE_HEADER_BYTES];
    out[0..8].copy_from_slice(&first_block.to_le_bytes());
    out[8..12].copy_from_slice(&count.to_le_bytes());
    out
}

/// A FREE payload.
pub fn free_payload(first_block: u64, count: u64) -> [u8; 16] {
    let mut out = [0u8; 16];
    out[0..8].copy_from_slice(&first_block.to_le_bytes());
    out[8..16].copy_from_slice(&count.to_le_bytes());
    out
}

/// An END payload.
pub fn end_payload(end: &StreamEnd) -> [u8; 24] {
    let mut out = [0u8; 24];
    out[0..8].copy_from_slice(&end.records.to_le_bytes());
    out[8..16].copy_from_slice(&end.written_blocks.to_le_bytes());
    out[16..24].copy_from_slice(&end.freed_blocks.to_le_bytes());
    out
}

/// Follows the rules a whole stream must keep, record by record: BEGIN first and
/// once, blocks ascending and inside the volume, END last with the right counts.
/// Both the receiver and the fuzzer drive it.
#[derive(Debug, Default)]
pub struct StreamChecker {
    begin: Option<StreamBegin>,
    previous: [u8; 16],
    records: u64,
    next_block: u64,
    written_blocks: u64,
    freed_blocks: u64,
    ended: bool,
}

impl StreamChecker {
    pub fn new() -> StreamChecker {
        StreamChecker::default()
    }

    /// Records seen so far.
    pub fn records(&self) -> u64 {
        self.records
    }

    /// The BEGIN record, once seen.
    pub fn begin(&self) -> Option<&StreamBegin> {
        self.begin.as_ref()
    }

    /// The first block a later record may touch.
    pub fn next_block(&self) -> u64 {
        self.next_block
    }

    /// Blocks written and freed by the records so far.
    pub fn counts(&self) -> (u64, u64) {
        (self.written_blocks, self.freed_blocks)
    }

    pub fn ended(&self) -> bool {
        self.ended
    }

    /// Parses the header of the next record.
    pub fn header(&self, bytes: &[u8; RECORD_HEADER_BYTES]) -> Result<RecordHeader, StreamError> {
        if self.ended {
            return Err(StreamError::Malformed {
                record: self.records,
                detail: "data after the END record".into(),
            });
        }
        let header = decode_header(bytes, self.records)?;
        if (self.begin.is_none()) != (header.kind == RecordKind::Begin) {
            return Err(StreamError::Malformed {
                record: self.records,
                detail: "BEGIN must come first, and only once".into(),
            });
        }
        Ok(header)
    }

    /// Bytes of the payload that come before a record's data: the whole payload,
    /// except for WRITE records (their fixed part).
    pub fn head_bytes(header: &RecordHeader) -> usize {
        match header.kind {
            RecordKind::Write => WRITE_HEADER_BYTES.min(header.payload_bytes as usize),
            _ => header.payload_bytes as usize,
        }
    }

    /// Verifies and accepts the next record's payload (`head`, then `tail`: see
    /// [`StreamChecker::head_bytes`]).
    pub fn accept(
        &mut self,
        header: &RecordHeader,
        head: &[u8],
        tail: &[u8],
    ) -> Result<Record, StreamError> {
        let record = self.records;
        let block_bytes = self
            .begin
            .as_ref()
            .map(|begin| begin.block_bytes)
            .unwrap_or(0);
        let parsed = decode_payload(header, head, tail, &self.previous, record, block_bytes)?;
        let malformed = |detail: String| StreamError::Malformed { record, detail };
        let volume_blocks = self
            .begin
            .as_ref()
            .map(|begin| begin.size_bytes / begin.block_bytes as u64)
            .unwrap_or(0);
        let extent = |first: u64, count: u64, next: &mut u64| -> Result<(), StreamError> {
            let end = first
                .checked_add(count)
                .ok_or_else(|| malformed("block range overflows".into()))?;
            if first < *next {
                return Err(malformed(format!(
                    "block {first} is out of order (expected {} or later)",
                    *next
                )));
            }
            if end > volume_blocks {
                return Err(malformed(format!(
                    "blocks {first}..{end} are past the volume's {volume_blocks} blocks"
                )));
            }
            *next = end;
            Ok(())
        };
        match &parsed {
            Record::Begin(begin) => {
                self.next_block = begin.resume_block.unwrap_or(0);
                self.begin = Some(begin.clone());
            }
            Record::Write { first_block, count } => {
                extent(*first_block, *count as u64, &mut self.next_block)?;
                self.written_blocks += *count as u64;
            }
            Record::Free { first_block, count } => {
                extent(*first_block, *count, &mut self.next_block)?;
                self.freed_blocks += count;
            }
            Record::End(end) => {
                let expected = StreamEnd {
                    records: record,
                    written_blocks: self.written_blocks,
                    freed_blocks: self.freed_blocks,
                };
                if *end != expected {
                    return Err(malformed(format!(
                        "END counts {end:?} do not match the stream's {expected:?}"
                    )));
                }
                self.ended = true;
            }
        }
        self.previous = header.checksum;
        self.records += 1;
        Ok(parsed)
    }
}

/// Checks a whole stream held in memory (tests and the fuzzer): every record,
/// then that it ended.
pub fn check_stream(mut bytes: &[u8]) -> Result<Vec<Record>, StreamError> {
    let mut checker = StreamChecker::new();
    let mut records = Vec::new();
    while !bytes.is_empty() {
        let Some(header_bytes) = bytes.get(..RECORD_HEADER_BYTES) else {
            return Err(StreamError::Truncated {
                records: checker.records(),
            });
        };
        let header = checker.header(header_bytes.try_into().expect("header size"))?;
        let end = RECORD_HEADER_BYTES + header.payload_bytes as usize;
        let Some(payload) = bytes.get(RECORD_HEADER_BYTES..end) else {
            return Err(StreamError::Truncated {
                records: checker.records(),
            });
        };
        let (head, tail) = payload.split_at(StreamChecker::head_bytes(&header));
        records.push(checker.accept(&header, head, tail)?);
        bytes = &bytes[end..];
    }
    if !checker.ended() {
        return Err(StreamError::Truncated {
            records: checker.records(),
        });
    }
    Ok(records)
}

/// Builds a stream in memory (tests, fuzz seeds): what the sender writes.
#[derive(Default)]
pub struct StreamWriter {
    pub bytes: Vec<u8>,
    previous: [u8; 16],
    records: u64,
    written_blocks: u64,
    freed_blocks: u64,
}

impl StreamWriter {
    pub fn new() -> StreamWriter {
        StreamWriter::default()
    }

    fn push(&mut self, kind: RecordKind, payload: &[&[u8]]) {
        let (header, checksum) = encode_header(kind, payload, &self.previous);
        self.bytes.extend_from_slice(&header);
        for part in payload {
            self.bytes.extend_from_slice(part);
        }
        self.previous = checksum;
        self.records += 1;
    }

    pub fn begin(&mut self, begin: &StreamBegin) {
        let json = serde_json::to_vec(begin).expect("BEGIN serialises");
        self.push(RecordKind::Begin, &[&json]);
    }

    pub fn write(&mut self, first_block: u64, count: u32, data: &[u8]) {
        self.push(
            RecordKind::Write,
            &[&write_header(first_block, count), data],
        );
        self.written_blocks += count as u64;
    }

    pub fn free(&mut self, first_block: u64, count: u64) {
        self.push(RecordKind::Free, &[&free_payload(first_block, count)]);
        self.freed_blocks += count;
    }

    pub fn end(&mut self) {
        let end = StreamEnd {
            records: self.records,
            written_blocks: self.written_blocks,
            freed_blocks: self.freed_blocks,
        };
        self.push(RecordKind::End, &[&end_payload(&end)]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn begin() -> StreamBegin {
        StreamBegin {
            version: STREAM_VERSION,
            snapshot: "tank/vol@a".into(),
            to_guid: 7,
            from: None,
            from_guid: 0,
            size_bytes: 64 * 4096,
            block_bytes: 4096,
            resume_block: None,
            properties: BTreeMap::new(),
        }
    }

    fn sample() -> Vec<u8> {
        let mut writer = StreamWriter::new();
        writer.begin(&begin());
        writer.write(0, 2, &vec![1u8; 8192]);
        writer.free(2, 10);
        writer.write(20, 1, &vec![2u8; 4096]);
        writer.end();
        writer.bytes
    }

    #[test]
    fn round_trips() {
        let records = check_stream(&sample()).unwrap();
        assert_eq!(records.len(), 5);
        assert_eq!(records[0], Record::Begin(begin()));
        assert_eq!(
            records[1],
            Record::Write {
                first_block: 0,
                count: 2
            }
        );
        assert_eq!(
            records[2],
            Record::Free {
                first_block: 2,
                count: 10
            }
        );
        assert_eq!(
            records[4],
            Record::End(StreamEnd {
                records: 4,
                written_blocks: 3,
                freed_blocks: 10
            })
        );
    }

    #[test]
    fn every_flipped_bit_is_caught() {
        let stream = sample();
        for position in (0..stream.len()).step_by(97) {
            let mut damaged = stream.clone();
            damaged[position] ^= 0x10;
            assert!(check_stream(&damaged).is_err(), "flip at {position} passed");
        }
    }

    #[test]
    fn every_truncation_is_caught() {
        let stream = sample();
        for length in 0..stream.len() {
            assert!(
                check_stream(&stream[..length]).is_err(),
                "truncation to {length} passed"
            );
        }
    }

    #[test]
    fn dropped_or_reordered_records_are_caught() {
        let mut writer = StreamWriter::new();
        writer.begin(&begin());
        let after_begin = writer.bytes.len();
        writer.write(0, 1, &vec![1u8; 4096]);
        let after_first = writer.bytes.len();
        writer.write(1, 1, &vec![2u8; 4096]);
        let after_second = writer.bytes.len();
        writer.end();
        let stream = writer.bytes;
        // Drop the first WRITE.
        let dropped: Vec<u8> = [&stream[..after_begin], &stream[after_first..]].concat();
        assert!(matches!(
            check_stream(&dropped),
            Err(StreamError::Checksum { .. })
        ));
        // Swap the two WRITEs.
        let swapped: Vec<u8> = [
            &stream[..after_begin],
            &stream[after_first..after_second],
            &stream[after_begin..after_first],
            &stream[after_second..],
        ]
        .concat();
        assert!(check_stream(&swapped).is_err());
    }

    #[test]
    fn rules_are_enforced_even_with_good_checksums() {
        type Case = (&'static str, Box<dyn Fn(&mut StreamWriter)>);
        let cases: Vec<Case> = vec![
            (
                "out of order",
                Box::new(|w| {
                    w.write(5, 1, &vec![0u8; 4096]);
                    w.write(4, 1, &vec![0u8; 4096]);
                }),
            ),
            ("past the end", Box::new(|w| w.free(60, 10))),
            ("bad length", Box::new(|w| w.write(0, 2, &vec![0u8; 4096]))),
            ("second begin", Box::new(|w| w.begin(&begin()))),
        ];
        for (name, build) in cases {
            let mut writer = StreamWriter::new();
            writer.begin(&begin());
            build(&mut writer);
            writer.end();
            assert!(check_stream(&writer.bytes).is_err(), "{name} passed");
        }
        let mut wrong_version = begin();
        wrong_version.version = 99;
        let mut writer = StreamWriter::new();
        writer.begin(&wrong_version);
        writer.end();
        assert_eq!(
            check_stream(&writer.bytes).unwrap_err(),
            StreamError::Version(99)
        );
    }
}
