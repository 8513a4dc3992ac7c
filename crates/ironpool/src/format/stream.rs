//! The send stream: a volume snapshot (full) or the difference between two
//! snapshots (incremental) as a sequence of self-checking records, for
//! `ironpool send | ironpool receive` over a pipe, a file or ssh.
//!
//! Each record is a 32-byte header and a payload:
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 4 | magic `IPSR` (0x52535049 little-endian) |
//! | 4 | 4 | kind: 1 BEGIN, 2 WRITE, 3 FREE, 4 END; for filesystems 5 OBJECT, 6 FREEOBJECTS, 7 OBJECT_WRITE, 8 OBJECT_FREE; for raw streams 9 WRITE_RAW |
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
//!
//! A filesystem's stream (BEGIN's `filesystem` is set) carries objects
//! instead of a volume's blocks, in ascending object number:
//! - OBJECT: object u64, type u8, data block shift u8, zero u16 + u32, length
//!   u64, then the dnode's 304-byte bonus (the attributes). The object's
//!   WRITE and FREE records follow it, blocks ascending.
//! - FREEOBJECTS: first object u64, count u64: these objects do not exist.
//! - OBJECT_WRITE: object u64, first block u64, block count u32, zero u32, then
//!   `count × 2^shift` bytes (the object's blocks, logical contents).
//! - OBJECT_FREE: object u64, first block u64, block count u64: holes.
//!
//! A raw stream (`send -w`, version 3; a filesystem's 4, BEGIN's `raw` set) carries an
//! encrypted volume's blocks as they are stored, sealed, so that neither the
//! stream nor the receiver ever holds the plaintext or the key. BEGIN's
//! `raw` holds the volume's master key wrapped by the user's key (never
//! the key itself), so the same user's key opens the received volume. Its
//! data blocks come one per record, instead of WRITE:
//! - WRITE_RAW: block u64, logical size u32, stored size u32, compression
//!   u8, zero u8 × 7, salt u64, IV 12 bytes, zero u32, MAC 16 bytes (64
//!   bytes in all, the fields of the block's pointer that opening it
//!   needs), then the stored bytes (`stored size` of them).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::format::bp::{BlockCrypt, Compression, SEALING_BYTES};
use crate::format::dnode::{ObjectType, BONUS_BYTES};

/// "IPSR" as bytes on the wire.
pub const STREAM_MAGIC: u32 = u32::from_le_bytes(*b"IPSR");
/// Version of the stream format this build writes. Version 2 streams may
/// carry directories in the layout of format version 2 (root leaf at block
/// 0, maybe small), which no receiver before it reads; this build reads
/// version 1 streams (of older senders) too.
pub const STREAM_VERSION: u32 = 2;
/// Version of a raw stream (`send -w`): WRITE_RAW records (a volume's) or
/// OBJECT_WRITE_RAW records (a filesystem's), which no receiver before it
/// reads. Streams that are not raw stay version 2, so
/// older receivers still take them. A filesystem's raw stream of an older
/// build is version 3 too, its objects' attributes in the clear.
pub const STREAM_VERSION_RAW: u32 = 3;
/// Version of a filesystem's raw stream: its OBJECT records carry its
/// objects' attributes sealed (`format::sealed_bonus`), which a version 3
/// receiver would take for damaged znodes. A volume's raw stream has no
/// attributes and stays version 3, for older receivers.
pub const STREAM_VERSION_RAW_SEALED_ATTRIBUTES: u32 = 4;
/// The newest stream version this build reads.
pub const STREAM_VERSION_MAX: u32 = STREAM_VERSION_RAW_SEALED_ATTRIBUTES;
/// The oldest stream version this build reads.
pub const STREAM_VERSION_MIN: u32 = 1;
/// Size of a record header.
pub const RECORD_HEADER_BYTES: usize = 32;
/// Largest BEGIN payload (a few hundred bytes of JSON in practice).
pub const BEGIN_PAYLOAD_BYTES_MAX: u64 = 64 * 1024;
/// Data bytes a WRITE record carries at most: large enough to stream at full
/// speed, small enough that a receiver buffers a bounded number of them.
pub const WRITE_DATA_BYTES_MAX: u64 = 1024 * 1024;
/// Fixed part of a WRITE payload.
pub const WRITE_HEADER_BYTES: usize = 16;
/// Fixed part of a WRITE_RAW payload.
pub const WRITE_RAW_HEADER_BYTES: usize = 64;
/// Fixed part of an OBJECT_WRITE_RAW payload: the object, then a
/// WRITE_RAW's fixed part.
pub const OBJECT_WRITE_RAW_HEADER_BYTES: usize = 8 + WRITE_RAW_HEADER_BYTES;
/// Largest payload of any record: the largest fixed part and one MiB of
/// data (a record's data, or one stored block of at most 1 MiB).
pub const RECORD_PAYLOAD_BYTES_MAX: u64 =
    OBJECT_WRITE_RAW_HEADER_BYTES as u64 + WRITE_DATA_BYTES_MAX;
/// Fixed part of an OBJECT payload (the bonus follows).
pub const OBJECT_HEADER_BYTES: usize = 24;
/// An OBJECT payload: the fixed part and a dnode's bonus.
pub const OBJECT_PAYLOAD_BYTES: usize = OBJECT_HEADER_BYTES + BONUS_BYTES;
/// Fixed part of an OBJECT_WRITE payload.
pub const OBJECT_WRITE_HEADER_BYTES: usize = 24;
/// Object numbers a filesystem stream may name: a filesystem's own limit.
pub const STREAM_OBJECTS_MAX: u64 = 1 << 48;
/// A filesystem object's data block shift: 512 bytes to 1 MiB.
pub const OBJECT_BLOCK_SHIFT_MIN: u8 = 9;
pub const OBJECT_BLOCK_SHIFT_MAX: u8 = 20;
/// Blocks an object may have: files end at 2^50 bytes, so 2^41 blocks of
/// the smallest size.
pub const OBJECT_BLOCKS_MAX: u64 = 1 << 41;

/// Kinds of records.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecordKind {
    Begin = 1,
    Write = 2,
    Free = 3,
    End = 4,
    Object = 5,
    FreeObjects = 6,
    ObjectWrite = 7,
    ObjectFree = 8,
    WriteRaw = 9,
    ObjectWriteRaw = 10,
}

impl RecordKind {
    fn from_code(code: u32) -> Option<RecordKind> {
        match code {
            1 => Some(RecordKind::Begin),
            2 => Some(RecordKind::Write),
            3 => Some(RecordKind::Free),
            4 => Some(RecordKind::End),
            5 => Some(RecordKind::Object),
            6 => Some(RecordKind::FreeObjects),
            7 => Some(RecordKind::ObjectWrite),
            8 => Some(RecordKind::ObjectFree),
            9 => Some(RecordKind::WriteRaw),
            10 => Some(RecordKind::ObjectWriteRaw),
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
        "stream format version {0} is not supported (this build reads versions {STREAM_VERSION_MIN} to {STREAM_VERSION_MAX})"
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
    /// Set for a filesystem's stream: its header. Absent for a volume.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filesystem: Option<FsStreamInfo>,
    /// Resuming a filesystem's receive: the first object this stream carries
    /// (with `resume_block`, the first block of that object).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resume_object: Option<u64>,
    /// Set for a raw stream: the key its blocks are sealed under.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub raw: Option<RawKey>,
}

/// A raw stream's key (in BEGIN): what the receiver keeps so that the
/// sender's user key opens what it received.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RawKey {
    /// The sender's key guid: volumes with the same one share the master
    /// key, so an incremental raw stream applies only to a volume that
    /// has it.
    pub key_guid: u64,
    /// The master key wrapped by the user's key, in hexadecimal
    /// (`crypto::WrappedKey::encode`).
    pub wrapped_key: String,
}

/// A WRITE_RAW record's fields: one stored block and what its pointer
/// needs to open it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RawBlock {
    pub block: u64,
    pub logical: u32,
    pub physical: u32,
    pub compression: Compression,
    pub crypt: BlockCrypt,
}

/// A filesystem stream's header (in BEGIN).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FsStreamInfo {
    /// The root directory's object.
    pub root: u64,
    /// The sender's next object number: every object of the stream is below.
    pub next_object: u64,
}

/// A filesystem object as an OBJECT record describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StreamObject {
    pub object: u64,
    pub object_type: ObjectType,
    pub block_shift: u8,
    pub length: u64,
    pub bonus: Vec<u8>,
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
    Write {
        first_block: u64,
        count: u32,
    },
    Free {
        first_block: u64,
        count: u64,
    },
    End(StreamEnd),
    Object(StreamObject),
    FreeObjects {
        first: u64,
        count: u64,
    },
    ObjectWrite {
        object: u64,
        first_block: u64,
        count: u32,
    },
    ObjectFree {
        object: u64,
        first_block: u64,
        count: u64,
    },
    WriteRaw(RawBlock),
    /// One stored block of a filesystem's object (a raw stream's).
    ObjectWriteRaw {
        object: u64,
        raw: RawBlock,
    },
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
    let mut hasher = twox_hash::XxHash3_128::new();
    hasher.write(previous);
    hasher.write(header_prefix);
    for part in payload {
        hasher.write(part);
    }
    hasher.finish_128().to_le_bytes()
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
        RecordKind::Write
        | RecordKind::ObjectWrite
        | RecordKind::WriteRaw
        | RecordKind::ObjectWriteRaw => RECORD_PAYLOAD_BYTES_MAX,
        RecordKind::Free | RecordKind::End | RecordKind::FreeObjects | RecordKind::ObjectFree => 24,
        RecordKind::Object => OBJECT_PAYLOAD_BYTES as u64,
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
        kind if !matches!(
            kind,
            RecordKind::Write
                | RecordKind::ObjectWrite
                | RecordKind::WriteRaw
                | RecordKind::ObjectWriteRaw
        ) && !tail.is_empty() =>
        {
            Err(malformed("only WRITE records carry data"))
        }
        RecordKind::Begin => {
            let begin: StreamBegin = serde_json::from_slice(payload)
                .map_err(|error| malformed(&format!("BEGIN: {error}")))?;
            if !(STREAM_VERSION_MIN..=STREAM_VERSION_MAX).contains(&begin.version) {
                return Err(StreamError::Version(begin.version));
            }
            if begin.raw.is_some() != (begin.version >= STREAM_VERSION_RAW) {
                return Err(malformed(
                    "BEGIN: a raw stream is version 3 or 4, and only it",
                ));
            }
            if !begin.block_bytes.is_power_of_two()
                || begin.block_bytes < 512
                || begin.block_bytes as u64 > WRITE_DATA_BYTES_MAX
            {
                return Err(malformed("BEGIN: bad block size"));
            }
            match begin.filesystem {
                Some(info) => {
                    if info.root == 0
                        || info.root >= info.next_object
                        || info.next_object > STREAM_OBJECTS_MAX
                    {
                        return Err(malformed("BEGIN: bad filesystem header"));
                    }
                }
                None => {
                    if begin.resume_object.is_some() {
                        return Err(malformed("BEGIN: a volume's stream resumes at a block"));
                    }
                    if begin.size_bytes == 0
                        || !begin.size_bytes.is_multiple_of(begin.block_bytes as u64)
                    {
                        return Err(malformed(
                            "BEGIN: size is not a positive multiple of the block size",
                        ));
                    }
                }
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
        RecordKind::Object => {
            if payload.len() != OBJECT_PAYLOAD_BYTES {
                return Err(malformed("OBJECT payload is not 328 bytes"));
            }
            let object_type = match ObjectType::from_code(payload[8]) {
                Some(
                    kind @ (ObjectType::FsFile | ObjectType::FsDirectory | ObjectType::FsXattr),
                ) => kind,
                _ => return Err(malformed("OBJECT: not a filesystem object's type")),
            };
            let block_shift = payload[9];
            if !(OBJECT_BLOCK_SHIFT_MIN..=OBJECT_BLOCK_SHIFT_MAX).contains(&block_shift) {
                return Err(malformed("OBJECT: bad block size"));
            }
            let length = u64_at(16);
            if length > OBJECT_BLOCKS_MAX << OBJECT_BLOCK_SHIFT_MIN {
                return Err(malformed("OBJECT: length past a file's limit"));
            }
            Ok(Record::Object(StreamObject {
                object: u64_at(0),
                object_type,
                block_shift,
                length,
                bonus: payload[OBJECT_HEADER_BYTES..].to_vec(),
            }))
        }
        RecordKind::FreeObjects => {
            if payload.len() != 16 || u64_at(8) == 0 {
                return Err(malformed("FREEOBJECTS payload is not 16 bytes of a range"));
            }
            Ok(Record::FreeObjects {
                first: u64_at(0),
                count: u64_at(8),
            })
        }
        RecordKind::ObjectWrite => {
            if payload.len() != OBJECT_WRITE_HEADER_BYTES || block_bytes == 0 {
                return Err(malformed("OBJECT_WRITE too short or before its OBJECT"));
            }
            let count = u32::from_le_bytes(payload[16..20].try_into().expect("4 bytes"));
            if count == 0 || tail.len() as u64 != count as u64 * block_bytes as u64 {
                return Err(malformed(
                    "OBJECT_WRITE length does not match its block count",
                ));
            }
            Ok(Record::ObjectWrite {
                object: u64_at(0),
                first_block: u64_at(8),
                count,
            })
        }
        RecordKind::WriteRaw => {
            if payload.len() != WRITE_RAW_HEADER_BYTES || block_bytes == 0 {
                return Err(malformed("WRITE_RAW too short or before BEGIN"));
            }
            decode_raw_block(payload, tail, block_bytes)
                .map(Record::WriteRaw)
                .map_err(|detail| malformed(&format!("WRITE_RAW: {detail}")))
        }
        RecordKind::ObjectWriteRaw => {
            if payload.len() != OBJECT_WRITE_RAW_HEADER_BYTES || block_bytes == 0 {
                return Err(malformed("OBJECT_WRITE_RAW too short or before its OBJECT"));
            }
            let raw = decode_raw_block(&payload[8..], tail, block_bytes)
                .map_err(|detail| malformed(&format!("OBJECT_WRITE_RAW: {detail}")))?;
            Ok(Record::ObjectWriteRaw {
                object: u64_at(0),
                raw,
            })
        }
        RecordKind::ObjectFree => {
            if payload.len() != 24 || u64_at(16) == 0 {
                return Err(malformed("OBJECT_FREE payload is not 24 bytes of a range"));
            }
            Ok(Record::ObjectFree {
                object: u64_at(0),
                first_block: u64_at(8),
                count: u64_at(16),
            })
        }
    }
}

/// A WRITE_RAW payload's fixed part (`fields`, 64 bytes) and its stored
/// bytes (`tail`), checked against the block size `block_bytes`; the
/// error says what is wrong.
fn decode_raw_block(fields: &[u8], tail: &[u8], block_bytes: u32) -> Result<RawBlock, String> {
    debug_assert_eq!(fields.len(), WRITE_RAW_HEADER_BYTES);
    let u32_at =
        |offset: usize| u32::from_le_bytes(fields[offset..offset + 4].try_into().expect("4 bytes"));
    let u64_at =
        |offset: usize| u64::from_le_bytes(fields[offset..offset + 8].try_into().expect("8 bytes"));
    let (logical, physical) = (u32_at(8), u32_at(12));
    let compression =
        Compression::from_code(fields[16]).ok_or_else(|| "unknown compression".to_string())?;
    if logical != block_bytes
        || physical == 0
        || physical > logical
        || tail.len() != physical as usize
        || (compression == Compression::Off && physical != logical)
    {
        return Err("sizes do not match the block size and its data".into());
    }
    let crypt = BlockCrypt::from_bytes(
        fields[24..24 + SEALING_BYTES]
            .try_into()
            .expect("the sealing's bytes"),
    );
    let (Some(crypt), true) = (crypt, fields[17..24].iter().all(|byte| *byte == 0)) else {
        return Err("reserved bytes are not zero".into());
    };
    Ok(RawBlock {
        block: u64_at(0),
        logical,
        physical,
        compression,
        crypt,
    })
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

/// The fixed part of a WRITE_RAW payload.
pub fn write_raw_header(raw: &RawBlock) -> [u8; WRITE_RAW_HEADER_BYTES] {
    let mut out = [0u8; WRITE_RAW_HEADER_BYTES];
    out[0..8].copy_from_slice(&raw.block.to_le_bytes());
    out[8..12].copy_from_slice(&raw.logical.to_le_bytes());
    out[12..16].copy_from_slice(&raw.physical.to_le_bytes());
    out[16] = raw.compression.code();
    out[24..24 + SEALING_BYTES].copy_from_slice(&raw.crypt.to_bytes());
    out
}

/// The fixed part of an OBJECT_WRITE_RAW payload: `object`, then the
/// block's WRITE_RAW fields.
pub fn object_write_raw_header(object: u64, raw: &RawBlock) -> [u8; OBJECT_WRITE_RAW_HEADER_BYTES] {
    let mut out = [0u8; OBJECT_WRITE_RAW_HEADER_BYTES];
    out[0..8].copy_from_slice(&object.to_le_bytes());
    out[8..].copy_from_slice(&write_raw_header(raw));
    out
}

/// An OBJECT payload.
pub fn object_payload(object: &StreamObject) -> Vec<u8> {
    let mut out = vec![0u8; OBJECT_PAYLOAD_BYTES];
    out[0..8].copy_from_slice(&object.object.to_le_bytes());
    out[8] = object.object_type.code();
    out[9] = object.block_shift;
    out[16..24].copy_from_slice(&object.length.to_le_bytes());
    let bonus = object.bonus.len().min(BONUS_BYTES);
    out[OBJECT_HEADER_BYTES..OBJECT_HEADER_BYTES + bonus].copy_from_slice(&object.bonus[..bonus]);
    out
}

/// The fixed part of an OBJECT_WRITE payload.
pub fn object_write_header(object: u64, first_block: u64, count: u32) -> [u8; 24] {
    let mut out = [0u8; 24];
    out[0..8].copy_from_slice(&object.to_le_bytes());
    out[8..16].copy_from_slice(&first_block.to_le_bytes());
    out[16..20].copy_from_slice(&count.to_le_bytes());
    out
}

/// An OBJECT_FREE payload.
pub fn object_free_payload(object: u64, first_block: u64, count: u64) -> [u8; 24] {
    let mut out = [0u8; 24];
    out[0..8].copy_from_slice(&object.to_le_bytes());
    out[8..16].copy_from_slice(&first_block.to_le_bytes());
    out[16..24].copy_from_slice(&count.to_le_bytes());
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
    /// Filesystem streams: the object whose records may follow (its
    /// number and block shift), and the lowest number a later OBJECT or
    /// FREEOBJECTS may name.
    object: Option<(u64, u8)>,
    next_object: u64,
    /// A resumed filesystem stream: its first object and block.
    resume: Option<(u64, u64)>,
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

    /// The stream's position: everything before (object, block) was
    /// carried by the records so far (a volume's: object 0).
    pub fn position(&self) -> (u64, u64) {
        let filesystem = self
            .begin
            .as_ref()
            .is_some_and(|begin| begin.filesystem.is_some());
        match (filesystem, self.object) {
            (false, _) => (0, self.next_block),
            (true, Some((object, _))) => (object, self.next_block),
            (true, None) => (self.next_object, 0),
        }
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
            RecordKind::ObjectWrite => OBJECT_WRITE_HEADER_BYTES.min(header.payload_bytes as usize),
            RecordKind::WriteRaw => WRITE_RAW_HEADER_BYTES.min(header.payload_bytes as usize),
            RecordKind::ObjectWriteRaw => {
                OBJECT_WRITE_RAW_HEADER_BYTES.min(header.payload_bytes as usize)
            }
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
        let filesystem = self
            .begin
            .as_ref()
            .is_some_and(|begin| begin.filesystem.is_some());
        let block_bytes = match (filesystem, self.object) {
            (false, _) => self
                .begin
                .as_ref()
                .map(|begin| begin.block_bytes)
                .unwrap_or(0),
            (true, Some((_, shift))) => 1 << shift,
            (true, None) => 0,
        };
        let parsed = decode_payload(header, head, tail, &self.previous, record, block_bytes)?;
        let malformed = |detail: String| StreamError::Malformed { record, detail };
        let volume_kind = matches!(
            header.kind,
            RecordKind::Write | RecordKind::Free | RecordKind::WriteRaw
        );
        let raw = self.begin.as_ref().is_some_and(|begin| begin.raw.is_some());
        match header.kind {
            RecordKind::Write | RecordKind::ObjectWrite if raw => {
                return Err(malformed(
                    "a raw stream carries its blocks as WRITE_RAW or OBJECT_WRITE_RAW records"
                        .into(),
                ))
            }
            RecordKind::WriteRaw | RecordKind::ObjectWriteRaw if !raw => {
                return Err(malformed(format!(
                    "a {:?} record in a stream that is not raw",
                    header.kind
                )))
            }
            _ => {}
        }
        let filesystem_kind = matches!(
            header.kind,
            RecordKind::Object
                | RecordKind::FreeObjects
                | RecordKind::ObjectWrite
                | RecordKind::ObjectFree
                | RecordKind::ObjectWriteRaw
        );
        if (volume_kind && filesystem) || (filesystem_kind && !filesystem) {
            return Err(malformed(format!(
                "a {:?} record does not belong in a {} stream",
                header.kind,
                if filesystem {
                    "filesystem's"
                } else {
                    "volume's"
                }
            )));
        }
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
        // A filesystem object's blocks: ascending, inside its limit.
        let object_extent = |checker: &mut StreamChecker,
                             object: u64,
                             first: u64,
                             count: u64|
         -> Result<(), StreamError> {
            if checker.object.map(|(current, _)| current) != Some(object) {
                return Err(malformed(format!(
                    "blocks of object {object} outside its OBJECT's records"
                )));
            }
            let end = first
                .checked_add(count)
                .filter(|end| *end <= OBJECT_BLOCKS_MAX)
                .ok_or_else(|| malformed(format!("object {object}: block range too large")))?;
            if first < checker.next_block {
                return Err(malformed(format!(
                    "object {object}: block {first} is out of order (expected {} or later)",
                    checker.next_block
                )));
            }
            checker.next_block = end;
            Ok(())
        };
        // The next object named: ascending, above the root's parent slot 0.
        let next_object = |checker: &mut StreamChecker, first: u64, count: u64| {
            let end = first
                .checked_add(count)
                .filter(|end| *end <= STREAM_OBJECTS_MAX)
                .ok_or_else(|| malformed(format!("objects {first}+{count} past the limit")))?;
            if first == 0 || first < checker.next_object {
                return Err(malformed(format!(
                    "object {first} is out of order (expected {} or later)",
                    checker.next_object
                )));
            }
            checker.next_object = end;
            Ok(())
        };
        match &parsed {
            Record::Begin(begin) => {
                self.next_block = begin.resume_block.unwrap_or(0);
                if begin.filesystem.is_some() {
                    self.next_object = begin.resume_object.unwrap_or(1).max(1);
                    self.resume = begin
                        .resume_object
                        .map(|object| (object, begin.resume_block.unwrap_or(0)));
                    self.next_block = 0;
                }
                self.begin = Some(begin.clone());
            }
            Record::Object(object) => {
                next_object(self, object.object, 1)?;
                self.object = Some((object.object, object.block_shift));
                self.next_block = match self.resume.take() {
                    Some((first, block)) if first == object.object => block,
                    _ => 0,
                };
            }
            Record::FreeObjects { first, count } => {
                next_object(self, *first, *count)?;
                self.object = None;
                self.resume = None;
            }
            Record::ObjectWrite {
                object,
                first_block,
                count,
            } => {
                object_extent(self, *object, *first_block, *count as u64)?;
                self.written_blocks += *count as u64;
            }
            Record::ObjectFree {
                object,
                first_block,
                count,
            } => {
                object_extent(self, *object, *first_block, *count)?;
                self.freed_blocks += count;
            }
            Record::Write { first_block, count } => {
                extent(*first_block, *count as u64, &mut self.next_block)?;
                self.written_blocks += *count as u64;
            }
            Record::WriteRaw(raw) => {
                extent(raw.block, 1, &mut self.next_block)?;
                self.written_blocks += 1;
            }
            Record::ObjectWriteRaw { object, raw } => {
                object_extent(self, *object, raw.block, 1)?;
                self.written_blocks += 1;
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

    pub fn write_raw(&mut self, raw: &RawBlock, data: &[u8]) {
        self.push(RecordKind::WriteRaw, &[&write_raw_header(raw), data]);
        self.written_blocks += 1;
    }

    pub fn free(&mut self, first_block: u64, count: u64) {
        self.push(RecordKind::Free, &[&free_payload(first_block, count)]);
        self.freed_blocks += count;
    }

    pub fn object(&mut self, object: &StreamObject) {
        self.push(RecordKind::Object, &[&object_payload(object)]);
    }

    pub fn free_objects(&mut self, first: u64, count: u64) {
        self.push(RecordKind::FreeObjects, &[&free_payload(first, count)]);
    }

    pub fn object_write(&mut self, object: u64, first_block: u64, count: u32, data: &[u8]) {
        self.push(
            RecordKind::ObjectWrite,
            &[&object_write_header(object, first_block, count), data],
        );
        self.written_blocks += count as u64;
    }

    pub fn object_write_raw(&mut self, object: u64, raw: &RawBlock, data: &[u8]) {
        self.push(
            RecordKind::ObjectWriteRaw,
            &[&object_write_raw_header(object, raw), data],
        );
        self.written_blocks += 1;
    }

    pub fn object_free(&mut self, object: u64, first_block: u64, count: u64) {
        self.push(
            RecordKind::ObjectFree,
            &[&object_free_payload(object, first_block, count)],
        );
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
    use crate::format::bp::{IV_BYTES, MAC_BYTES};

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
            filesystem: None,
            resume_object: None,
            raw: None,
        }
    }

    fn fs_begin() -> StreamBegin {
        StreamBegin {
            filesystem: Some(FsStreamInfo {
                root: 1,
                next_object: 10,
            }),
            size_bytes: 0,
            block_bytes: 128 * 1024,
            ..begin()
        }
    }

    fn file(object: u64, shift: u8) -> StreamObject {
        StreamObject {
            object,
            object_type: ObjectType::FsFile,
            block_shift: shift,
            length: 3 << shift,
            bonus: vec![7u8; BONUS_BYTES],
        }
    }

    #[test]
    fn filesystem_streams_round_trip_and_keep_their_rules() {
        let mut writer = StreamWriter::new();
        writer.begin(&fs_begin());
        writer.object(&file(1, 12));
        writer.object_write(1, 0, 2, &vec![3u8; 8192]);
        writer.object_free(1, 2, 1);
        writer.free_objects(2, 3);
        writer.object(&file(5, 9));
        writer.object_write(5, 1, 1, &vec![4u8; 512]);
        writer.end();
        let records = check_stream(&writer.bytes).unwrap();
        assert_eq!(records[1], Record::Object(file(1, 12)));
        assert_eq!(records[4], Record::FreeObjects { first: 2, count: 3 });
        assert_eq!(
            records[7],
            Record::End(StreamEnd {
                records: 7,
                written_blocks: 3,
                freed_blocks: 1
            })
        );
        for position in (0..writer.bytes.len()).step_by(89) {
            let mut damaged = writer.bytes.clone();
            damaged[position] ^= 0x04;
            assert!(check_stream(&damaged).is_err(), "flip at {position} passed");
        }

        type Case = (&'static str, Box<dyn Fn(&mut StreamWriter)>);
        let cases: Vec<Case> = vec![
            (
                "objects out of order",
                Box::new(|w| {
                    w.object(&file(4, 12));
                    w.object(&file(3, 12));
                }),
            ),
            (
                "an object twice",
                Box::new(|w| {
                    w.object(&file(4, 12));
                    w.object(&file(4, 12));
                }),
            ),
            ("object 0", Box::new(|w| w.object(&file(0, 12)))),
            (
                "blocks of another object",
                Box::new(|w| {
                    w.object(&file(4, 12));
                    w.object_write(5, 0, 1, &vec![0u8; 4096]);
                }),
            ),
            (
                "blocks after a FREEOBJECTS",
                Box::new(|w| {
                    w.object(&file(4, 12));
                    w.free_objects(5, 1);
                    w.object_write(4, 0, 1, &vec![0u8; 4096]);
                }),
            ),
            (
                "blocks out of order",
                Box::new(|w| {
                    w.object(&file(4, 12));
                    w.object_write(4, 3, 1, &vec![0u8; 4096]);
                    w.object_free(4, 2, 1);
                }),
            ),
            (
                "a length that is not the object's blocks",
                Box::new(|w| {
                    w.object(&file(4, 12));
                    w.object_write(4, 0, 1, &vec![0u8; 8192]);
                }),
            ),
            (
                "a volume's record",
                Box::new(|w| {
                    w.object(&file(4, 12));
                    w.write(0, 1, &vec![0u8; 128 * 1024]);
                }),
            ),
            (
                "objects past the limit",
                Box::new(|w| w.free_objects(2, STREAM_OBJECTS_MAX)),
            ),
        ];
        for (name, build) in cases {
            let mut writer = StreamWriter::new();
            writer.begin(&fs_begin());
            build(&mut writer);
            writer.end();
            assert!(check_stream(&writer.bytes).is_err(), "{name} passed");
        }
        // A volume's stream takes no filesystem records.
        let mut writer = StreamWriter::new();
        writer.begin(&begin());
        writer.object(&file(1, 12));
        writer.end();
        assert!(check_stream(&writer.bytes).is_err());
        // A bad object type is refused.
        let mut writer = StreamWriter::new();
        writer.begin(&fs_begin());
        writer.object(&StreamObject {
            object_type: ObjectType::Directory,
            ..file(1, 12)
        });
        writer.end();
        assert!(check_stream(&writer.bytes).is_err());
    }

    #[test]
    fn a_resumed_filesystem_stream_starts_at_its_object_and_block() {
        let resumed = StreamBegin {
            resume_object: Some(4),
            resume_block: Some(2),
            ..fs_begin()
        };
        let mut writer = StreamWriter::new();
        writer.begin(&resumed);
        writer.object(&file(4, 12));
        writer.object_write(4, 2, 1, &vec![1u8; 4096]);
        writer.object(&file(6, 12));
        writer.object_write(6, 0, 1, &vec![1u8; 4096]);
        writer.end();
        check_stream(&writer.bytes).unwrap();
        for (object, block) in [(3, 0), (4, 1)] {
            let mut writer = StreamWriter::new();
            writer.begin(&resumed);
            writer.object(&file(object, 12));
            writer.object_write(object, block, 1, &vec![1u8; 4096]);
            writer.end();
            assert!(
                check_stream(&writer.bytes).is_err(),
                "object {object} block {block} before the resume point passed"
            );
        }
    }

    fn raw_begin() -> StreamBegin {
        StreamBegin {
            version: STREAM_VERSION_RAW,
            raw: Some(RawKey {
                key_guid: 9,
                wrapped_key: "00".repeat(104),
            }),
            ..begin()
        }
    }

    fn raw_block(block: u64, physical: u32, compression: Compression) -> RawBlock {
        RawBlock {
            block,
            logical: 4096,
            physical,
            compression,
            crypt: BlockCrypt {
                salt: 0x5a17 + block,
                iv: [block as u8; IV_BYTES],
                mac: [0xac; MAC_BYTES],
            },
        }
    }

    fn raw_fs_begin() -> StreamBegin {
        StreamBegin {
            filesystem: fs_begin().filesystem,
            size_bytes: 0,
            block_bytes: fs_begin().block_bytes,
            ..raw_begin()
        }
    }

    #[test]
    fn raw_filesystem_streams_round_trip() {
        let mut writer = StreamWriter::new();
        writer.begin(&raw_fs_begin());
        writer.object(&file(1, 12));
        writer.object_write_raw(1, &raw_block(0, 4096, Compression::Off), &[1u8; 4096]);
        writer.object_write_raw(1, &raw_block(2, 700, Compression::Lz4), &[2u8; 700]);
        writer.object_free(1, 3, 1);
        writer.end();
        let records = check_stream(&writer.bytes).unwrap();
        assert_eq!(
            records[3],
            Record::ObjectWriteRaw {
                object: 1,
                raw: raw_block(2, 700, Compression::Lz4)
            }
        );
        assert_eq!(
            records[5],
            Record::End(StreamEnd {
                records: 5,
                written_blocks: 2,
                freed_blocks: 1
            })
        );
        // Blocks of an object ascend, raw as otherwise.
        let mut writer = StreamWriter::new();
        writer.begin(&raw_fs_begin());
        writer.object(&file(1, 12));
        writer.object_write_raw(1, &raw_block(2, 700, Compression::Lz4), &[2u8; 700]);
        writer.object_write_raw(1, &raw_block(1, 700, Compression::Lz4), &[2u8; 700]);
        writer.end();
        assert!(check_stream(&writer.bytes).is_err());
    }

    #[test]
    fn raw_streams_round_trip_and_keep_their_rules() {
        let mut writer = StreamWriter::new();
        writer.begin(&raw_begin());
        writer.write_raw(&raw_block(0, 4096, Compression::Off), &[1u8; 4096]);
        writer.write_raw(&raw_block(1, 1000, Compression::Lz4), &[2u8; 1000]);
        writer.free(2, 3);
        writer.write_raw(&raw_block(7, 512, Compression::Zstd), &[3u8; 512]);
        writer.end();
        let records = check_stream(&writer.bytes).unwrap();
        assert_eq!(records[0], Record::Begin(raw_begin()));
        assert_eq!(
            records[2],
            Record::WriteRaw(raw_block(1, 1000, Compression::Lz4))
        );
        assert_eq!(
            records[5],
            Record::End(StreamEnd {
                records: 5,
                written_blocks: 3,
                freed_blocks: 3
            })
        );
        for position in (0..writer.bytes.len()).step_by(61) {
            let mut damaged = writer.bytes.clone();
            damaged[position] ^= 0x10;
            assert!(check_stream(&damaged).is_err(), "flip at {position} passed");
        }

        type Case = (&'static str, StreamBegin, Box<dyn Fn(&mut StreamWriter)>);
        let cases: Vec<Case> = vec![
            (
                "a WRITE in a raw stream",
                raw_begin(),
                Box::new(|w| w.write(0, 1, &[0u8; 4096])),
            ),
            (
                "a WRITE_RAW in a stream that is not raw",
                begin(),
                Box::new(|w| w.write_raw(&raw_block(0, 4096, Compression::Off), &[0u8; 4096])),
            ),
            (
                "a raw stream that is not version 3 or 4",
                StreamBegin {
                    version: STREAM_VERSION,
                    ..raw_begin()
                },
                Box::new(|_| {}),
            ),
            (
                "version 3 without its key",
                StreamBegin {
                    version: STREAM_VERSION_RAW,
                    ..begin()
                },
                Box::new(|_| {}),
            ),
            (
                "an OBJECT_WRITE in a raw stream",
                raw_fs_begin(),
                Box::new(|w| {
                    w.object(&file(1, 12));
                    w.object_write(1, 0, 1, &[0u8; 4096]);
                }),
            ),
            (
                "an OBJECT_WRITE_RAW in a stream that is not raw",
                fs_begin(),
                Box::new(|w| {
                    w.object(&file(1, 12));
                    w.object_write_raw(1, &raw_block(0, 4096, Compression::Off), &[0u8; 4096]);
                }),
            ),
            (
                "an OBJECT_WRITE_RAW of another object than its OBJECT's",
                raw_fs_begin(),
                Box::new(|w| {
                    w.object(&file(1, 12));
                    w.object_write_raw(2, &raw_block(0, 4096, Compression::Off), &[0u8; 4096]);
                }),
            ),
            (
                "an OBJECT_WRITE_RAW of another size than its object's blocks",
                raw_fs_begin(),
                Box::new(|w| {
                    w.object(&file(1, 13));
                    w.object_write_raw(1, &raw_block(0, 4096, Compression::Off), &[0u8; 4096]);
                }),
            ),
            (
                "a volume's WRITE_RAW in a raw filesystem stream",
                raw_fs_begin(),
                Box::new(|w| {
                    w.object(&file(1, 12));
                    w.write_raw(&raw_block(0, 4096, Compression::Off), &[0u8; 4096]);
                }),
            ),
            (
                "stored bytes other than its size says",
                raw_begin(),
                Box::new(|w| w.write_raw(&raw_block(0, 1000, Compression::Lz4), &[0u8; 999])),
            ),
            (
                "stored larger than logical",
                raw_begin(),
                Box::new(|w| w.write_raw(&raw_block(0, 8192, Compression::Lz4), &[0u8; 8192])),
            ),
            (
                "uncompressed and smaller than its block",
                raw_begin(),
                Box::new(|w| w.write_raw(&raw_block(0, 1000, Compression::Off), &[0u8; 1000])),
            ),
            (
                "a logical size other than the block size",
                raw_begin(),
                Box::new(|w| {
                    let block = RawBlock {
                        logical: 8192,
                        ..raw_block(0, 4096, Compression::Lz4)
                    };
                    w.write_raw(&block, &[0u8; 4096])
                }),
            ),
            (
                "blocks out of order",
                raw_begin(),
                Box::new(|w| {
                    w.write_raw(&raw_block(3, 512, Compression::Lz4), &[0u8; 512]);
                    w.write_raw(&raw_block(3, 512, Compression::Lz4), &[0u8; 512]);
                }),
            ),
            (
                "a block past the volume",
                raw_begin(),
                Box::new(|w| w.write_raw(&raw_block(64, 512, Compression::Lz4), &[0u8; 512])),
            ),
        ];
        for (name, begin, build) in cases {
            let mut writer = StreamWriter::new();
            writer.begin(&begin);
            build(&mut writer);
            writer.end();
            assert!(check_stream(&writer.bytes).is_err(), "{name} passed");
        }
        // Reserved bytes must be zero.
        let mut writer = StreamWriter::new();
        writer.begin(&raw_begin());
        let mut head = write_raw_header(&raw_block(0, 512, Compression::Lz4));
        head[20] = 1;
        writer.push(RecordKind::WriteRaw, &[&head, &[0u8; 512]]);
        writer.written_blocks += 1;
        writer.end();
        assert!(check_stream(&writer.bytes).is_err());
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
