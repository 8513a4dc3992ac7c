//! Intent log blocks: the chain a dataset writes on FLUSH (and FUA, and under
//! `sync=always`) so that acknowledged writes survive a crash without waiting
//! for a transaction group. See `docs/FORMAT.md`, "Intent log".
//!
//! A log block checksums itself (XXH3-128, like labels and uberblocks): the
//! address of block n+1 is chosen and written into block n before block n+1's
//! contents exist, so no pointer can carry its checksum. Each block also
//! names its chain (a random guid drawn when the chain starts) and its
//! sequence number; replay follows the chain from the head in the dataset's
//! directory record and stops at the first block that does not verify, does
//! not belong to the chain, or is not the next in sequence: a block torn by a
//! crash, never written, or left over from an older chain in reused space.

use super::bp::{BlockCrypt, BlockPointer, Dva, BLOCK_POINTER_BYTES, SEALING_BYTES};
use super::checksum::embedded;
use super::dnode::Bonus;
use super::fsdir::valid_entry_name;
use super::znode::{Timestamp, Znode, ZNODE_BYTES, ZNODE_EXT_BYTES};
use super::{get_u32, get_u64, invalid, put_u32, put_u64, FormatError};

/// "IPLOGBLK", little-endian.
pub const LOG_BLOCK_MAGIC: u64 = u64::from_le_bytes(*b"IPLOGBLK");
/// Bytes of a log block's header.
pub const LOG_HEADER_BYTES: usize = 80;
/// Smallest log block: one 4 KiB sector holds the header and a few records.
pub const LOG_BLOCK_BYTES_MIN: usize = 4096;
/// Largest log block (as OpenZFS's largest log write block, 128 KiB): a
/// commit larger than this chains several blocks written at once.
pub const LOG_BLOCK_BYTES_MAX: usize = 128 * 1024;
/// Fixed part of every record.
const RECORD_HEAD_BYTES: usize = 32;
/// A copied record's data at most (a record never spans two blocks).
pub const COPY_BYTES_MAX: usize = LOG_BLOCK_BYTES_MAX - LOG_HEADER_BYTES - RECORD_HEAD_BYTES;

const KIND_BLOCK: u8 = 1;
const KIND_HOLE: u8 = 2;
const KIND_COPY: u8 = 3;
const KIND_ATTR: u8 = 4;
const KIND_WRITTEN: u8 = 5;
const KIND_OBJECT: u8 = 6;
const KIND_FREED: u8 = 7;
const KIND_ENTRY: u8 = 8;
const KIND_XATTRS: u8 = 9;
/// An object record whose znode has a project id or flags: the znode's
/// [`ZNODE_EXT_BYTES`] (a znode with neither is written as `KIND_OBJECT`,
/// as before they were kept).
const KIND_OBJECT_EXT: u8 = 10;
/// An attribute record of an encrypted filesystem: the size in the clear,
/// the times sealed ([`SealedTimes`]).
const KIND_ATTR_SEALED: u8 = 11;
/// A record of an encrypted filesystem sealed whole: an object's state,
/// an entry or a list of extended attributes ([`LogRecord::Sealed`]).
const KIND_SEALED: u8 = 12;
/// Bytes of an attribute record's body: length, then the two times.
const ATTR_BODY_BYTES: usize = 32;
/// Bytes of the two times, as an attribute record's body holds them after
/// the length: seconds of each (i64), then nanoseconds of each (u32).
pub const TIMES_BYTES: usize = 24;
/// Bytes of a sealed attribute record's body: length, the sealed times,
/// salt, IV, 4 zero bytes, MAC.
pub const ATTR_SEALED_BODY_BYTES: usize = 8 + TIMES_BYTES + SEALING_BYTES;
/// Domain of sealed times' associated data.
const TIMES_AAD_DOMAIN: &[u8; 16] = b"ironpool times 1";
/// Domain of a sealed record's associated data.
const RECORD_AAD_DOMAIN: &[u8; 16] = b"ironpool record1";
/// Bytes of an object record's body: length, then the znode.
const OBJECT_BODY_BYTES: usize = 8 + ZNODE_BYTES;
/// Bytes of an extended object record's body.
const OBJECT_EXT_BODY_BYTES: usize = 8 + ZNODE_EXT_BYTES;

/// The znode bytes an object record of `znode` carries.
fn object_znode_bytes(znode: &Znode) -> usize {
    if znode.needs_ext_record() {
        ZNODE_EXT_BYTES
    } else {
        ZNODE_BYTES
    }
}

/// A file's modification and change times sealed (an encrypted
/// filesystem's attribute record): the salt, IV and MAC of the sealing, and
/// the [`TIMES_BYTES`] sealed (`crypto::seal_times`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SealedTimes {
    pub crypt: BlockCrypt,
    pub ciphertext: [u8; TIMES_BYTES],
}

/// The two times as an attribute record holds them after its length.
pub fn times_bytes(mtime: Timestamp, ctime: Timestamp) -> [u8; TIMES_BYTES] {
    let mut out = [0u8; TIMES_BYTES];
    put_u64(&mut out, 0, mtime.seconds as u64);
    put_u64(&mut out, 8, ctime.seconds as u64);
    put_u32(&mut out, 16, mtime.nanos);
    put_u32(&mut out, 20, ctime.nanos);
    out
}

/// The times [`times_bytes`] wrote: (mtime, ctime).
pub fn times_from_bytes(bytes: &[u8; TIMES_BYTES]) -> (Timestamp, Timestamp) {
    let time = |seconds: usize, nanos: usize| Timestamp {
        seconds: get_u64(bytes, seconds) as i64,
        nanos: get_u32(bytes, nanos),
    };
    (time(0, 16), time(8, 20))
}

impl SealedTimes {
    /// A sealed attribute record's body: `length`, then these times.
    pub fn body(&self, length: u64) -> [u8; ATTR_SEALED_BODY_BYTES] {
        let mut out = [0u8; ATTR_SEALED_BODY_BYTES];
        put_u64(&mut out, 0, length);
        out[8..8 + TIMES_BYTES].copy_from_slice(&self.ciphertext);
        out[8 + TIMES_BYTES..].copy_from_slice(&self.crypt.to_bytes());
        out
    }

    /// The length and sealed times of a sealed attribute record's `body`.
    pub fn from_body(body: &[u8]) -> Result<(u64, SealedTimes), FormatError> {
        if body.len() != ATTR_SEALED_BODY_BYTES {
            return Err(invalid("sealed times", "length"));
        }
        let sealing = body[8 + TIMES_BYTES..]
            .try_into()
            .expect("the sealing's bytes");
        let Some(crypt) = BlockCrypt::from_bytes(sealing) else {
            return Err(invalid("sealed times", "reserved bytes not zero"));
        };
        Ok((
            get_u64(body, 0),
            SealedTimes {
                crypt,
                ciphertext: body[8..8 + TIMES_BYTES].try_into().expect("times bytes"),
            },
        ))
    }

    /// What the MAC authenticates besides the times: the file, the txg of
    /// the writes and the size they left (a record's times moved to
    /// another file, or to another record, fail).
    pub fn aad(object: u64, txg: u64, length: u64) -> [u8; 40] {
        let mut aad = [0u8; 40];
        aad[..16].copy_from_slice(TIMES_AAD_DOMAIN);
        put_u64(&mut aad, 16, object);
        put_u64(&mut aad, 24, txg);
        put_u64(&mut aad, 32, length);
        aad
    }
}

/// Where a log block is: its one copy, and how many bytes to read.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct LogPointer {
    pub dva: Dva,
    pub bytes: u32,
}

/// One change to a dataset's object, as the log carries it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LogRecord {
    /// Block `blkid` of `object` was written in place and linked in txg
    /// `pointer.birth_txg`: replay links the pointer unless that txg is durable.
    Block {
        object: u64,
        blkid: u64,
        pointer: BlockPointer,
    },
    /// Block `blkid` of `object` became a hole (zeroed or trimmed) in `txg`.
    Hole { object: u64, blkid: u64, txg: u64 },
    /// Block `blkid` of `object` holds `data` (a whole block, copied into the
    /// log because it was not yet written in place).
    Copy {
        object: u64,
        blkid: u64,
        data: Vec<u8>,
    },
    /// Block `blkid` of `object` was linked in txg `txg` holding `data` (a
    /// filesystem's small write, its bytes copied into the log so that the
    /// commit need not flush the devices it was written to): replay writes
    /// the data again unless that txg is durable.
    Written {
        object: u64,
        blkid: u64,
        txg: u64,
        data: Vec<u8>,
    },
    /// A file's size and modification times after writes of txg `txg` (a
    /// filesystem's log): replay sets them unless that txg is durable. An
    /// encrypted filesystem's has its times `sealed` (then `mtime` and
    /// `ctime` are zero): they are attributes, which it keeps sealed.
    Attr {
        object: u64,
        txg: u64,
        length: u64,
        mtime: Timestamp,
        ctime: Timestamp,
        sealed: Option<SealedTimes>,
    },
    /// A filesystem's object (file, directory, link) as a change of names
    /// or attributes of txg `txg` left it: replay makes it so (creating it
    /// if it does not exist) unless that txg is durable.
    Object {
        object: u64,
        txg: u64,
        state: ObjectState,
    },
    /// A filesystem's object was freed in txg `txg` (its last name gone,
    /// and not open).
    Freed { object: u64, txg: u64 },
    /// Entry `name` of directory `dir` names `target` after a change of
    /// txg `txg` (None: the name is gone).
    Entry {
        dir: u64,
        txg: u64,
        name: Vec<u8>,
        target: Option<EntryTarget>,
    },
    /// A filesystem's object has the extended attributes `list` (encoded
    /// as its xattr object holds them, `format::xattr`; empty: none) after
    /// a change of txg `txg`: replay makes it so unless that txg is durable.
    Xattrs {
        object: u64,
        txg: u64,
        list: Vec<u8>,
    },
    /// An encrypted filesystem's object, entry or extended attributes
    /// record, of `object` (an entry's: its directory) after a change of
    /// txg `txg`, sealed whole under the filesystem's key: `sealed` is the
    /// record as it would be written in the clear (head and body), sealed,
    /// then the sealing ([`SEALING_BYTES`]). Opened at replay, with the key
    /// (`crypto::open_record`); the object and txg stay in the clear, in
    /// the associated data, for the import's claim and a replay's order.
    Sealed {
        object: u64,
        txg: u64,
        sealed: Vec<u8>,
    },
}

/// What a sealed record's MAC authenticates besides the record: its object
/// and txg as the clear head gives them ([`LogRecord::Sealed`]).
pub fn sealed_record_aad(object: u64, txg: u64) -> [u8; 32] {
    let mut aad = [0u8; 32];
    aad[..16].copy_from_slice(RECORD_AAD_DOMAIN);
    put_u64(&mut aad, 16, object);
    put_u64(&mut aad, 24, txg);
    aad
}

/// `record` as it is written in a log block, head and body: what
/// `crypto::seal_record` seals.
pub fn record_bytes(record: &LogRecord) -> Vec<u8> {
    let mut out = vec![0u8; record.encoded_bytes()];
    record.encode(&mut out);
    out
}

/// The one record `bytes` hold, as [`record_bytes`] wrote it: what
/// `crypto::open_record` opened. A sealed record within is refused.
pub fn record_from_bytes(bytes: &[u8]) -> Result<LogRecord, FormatError> {
    let (record, length) = decode_record(bytes, 0, bytes.len())?;
    if matches!(record, LogRecord::Sealed { .. }) || RECORD_HEAD_BYTES + length != bytes.len() {
        return Err(invalid("sealed log record", "not one record"));
    }
    Ok(record)
}

/// What an object record says of a filesystem's object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ObjectState {
    /// Its data block size (a file of one block grows it up to the record
    /// size).
    pub block_shift: u8,
    pub length: u64,
    pub znode: Znode,
}

/// What a directory entry names: the object, its `DT_*` type and the
/// entry's `readdir` cookie.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EntryTarget {
    pub object: u64,
    pub kind: u8,
    pub cookie: u64,
}

impl LogRecord {
    /// Bytes the record takes in a log block.
    pub fn encoded_bytes(&self) -> usize {
        RECORD_HEAD_BYTES
            + match self {
                LogRecord::Block { .. } => BLOCK_POINTER_BYTES,
                LogRecord::Hole { .. } => 0,
                LogRecord::Copy { data, .. }
                | LogRecord::Written { data, .. }
                | LogRecord::Xattrs { list: data, .. } => data.len().next_multiple_of(8),
                LogRecord::Attr { sealed: None, .. } => ATTR_BODY_BYTES,
                LogRecord::Attr {
                    sealed: Some(_), ..
                } => ATTR_SEALED_BODY_BYTES,
                LogRecord::Object { state, .. } => 8 + object_znode_bytes(&state.znode),
                LogRecord::Freed { .. } => 0,
                LogRecord::Entry { name, .. } => 8 + name.len().next_multiple_of(8),
                LogRecord::Sealed { sealed, .. } => sealed.len().next_multiple_of(8),
            }
    }

    /// The txg of the change (a copy's: 0, it names none).
    pub fn txg(&self) -> u64 {
        match self {
            LogRecord::Block { pointer, .. } => pointer.birth_txg,
            LogRecord::Hole { txg, .. }
            | LogRecord::Attr { txg, .. }
            | LogRecord::Written { txg, .. }
            | LogRecord::Object { txg, .. }
            | LogRecord::Freed { txg, .. }
            | LogRecord::Entry { txg, .. }
            | LogRecord::Xattrs { txg, .. }
            | LogRecord::Sealed { txg, .. } => *txg,
            LogRecord::Copy { .. } => 0,
        }
    }

    /// The object and block the record changes (an attribute, object or
    /// freed record: its object, and block 0; an entry: its directory, and
    /// the object it names or 0).
    pub fn target(&self) -> (u64, u64) {
        match self {
            LogRecord::Block { object, blkid, .. }
            | LogRecord::Hole { object, blkid, .. }
            | LogRecord::Copy { object, blkid, .. }
            | LogRecord::Written { object, blkid, .. } => (*object, *blkid),
            LogRecord::Attr { object, .. }
            | LogRecord::Object { object, .. }
            | LogRecord::Freed { object, .. }
            | LogRecord::Xattrs { object, .. }
            | LogRecord::Sealed { object, .. } => (*object, 0),
            LogRecord::Entry { dir, target, .. } => {
                (*dir, target.map_or(0, |target| target.object))
            }
        }
    }

    fn encode(&self, out: &mut [u8]) {
        out.fill(0);
        let (object, blkid) = self.target();
        put_u64(out, 8, object);
        put_u64(out, 16, blkid);
        match self {
            LogRecord::Block { pointer, .. } => {
                out[0] = KIND_BLOCK;
                put_u64(out, 24, pointer.birth_txg);
                pointer
                    .encode(&mut out[RECORD_HEAD_BYTES..RECORD_HEAD_BYTES + BLOCK_POINTER_BYTES]);
            }
            LogRecord::Hole { txg, .. } => {
                out[0] = KIND_HOLE;
                put_u64(out, 24, *txg);
            }
            LogRecord::Copy { data, .. } => {
                out[0] = KIND_COPY;
                put_u32(out, 4, data.len() as u32);
                out[RECORD_HEAD_BYTES..RECORD_HEAD_BYTES + data.len()].copy_from_slice(data);
            }
            LogRecord::Written { txg, data, .. } => {
                out[0] = KIND_WRITTEN;
                put_u32(out, 4, data.len() as u32);
                put_u64(out, 24, *txg);
                out[RECORD_HEAD_BYTES..RECORD_HEAD_BYTES + data.len()].copy_from_slice(data);
            }
            LogRecord::Attr {
                txg,
                length,
                sealed: Some(sealed),
                ..
            } => {
                out[0] = KIND_ATTR_SEALED;
                put_u64(out, 24, *txg);
                let body = RECORD_HEAD_BYTES;
                out[body..body + ATTR_SEALED_BODY_BYTES].copy_from_slice(&sealed.body(*length));
            }
            LogRecord::Attr {
                txg,
                length,
                mtime,
                ctime,
                ..
            } => {
                out[0] = KIND_ATTR;
                put_u64(out, 24, *txg);
                let body = RECORD_HEAD_BYTES;
                put_u64(out, body, *length);
                out[body + 8..body + 8 + TIMES_BYTES].copy_from_slice(&times_bytes(*mtime, *ctime));
            }
            LogRecord::Object { txg, state, .. } => {
                let znode_bytes = object_znode_bytes(&state.znode);
                out[0] = if znode_bytes == ZNODE_BYTES {
                    KIND_OBJECT
                } else {
                    KIND_OBJECT_EXT
                };
                out[1] = state.block_shift;
                put_u64(out, 24, *txg);
                let body = RECORD_HEAD_BYTES;
                put_u64(out, body, state.length);
                out[body + 8..body + 8 + znode_bytes]
                    .copy_from_slice(&state.znode.encode().0[..znode_bytes]);
            }
            LogRecord::Freed { txg, .. } => {
                out[0] = KIND_FREED;
                put_u64(out, 24, *txg);
            }
            LogRecord::Entry {
                txg, name, target, ..
            } => {
                out[0] = KIND_ENTRY;
                out[1] = target.map_or(0, |target| target.kind);
                out[2] = name.len() as u8;
                put_u64(out, 24, *txg);
                let body = RECORD_HEAD_BYTES;
                put_u64(out, body, target.map_or(0, |target| target.cookie));
                out[body + 8..body + 8 + name.len()].copy_from_slice(name);
            }
            LogRecord::Xattrs { txg, list, .. } => {
                out[0] = KIND_XATTRS;
                put_u32(out, 4, list.len() as u32);
                put_u64(out, 24, *txg);
                out[RECORD_HEAD_BYTES..RECORD_HEAD_BYTES + list.len()].copy_from_slice(list);
            }
            LogRecord::Sealed { txg, sealed, .. } => {
                out[0] = KIND_SEALED;
                put_u32(out, 4, sealed.len() as u32);
                put_u64(out, 24, *txg);
                out[RECORD_HEAD_BYTES..RECORD_HEAD_BYTES + sealed.len()].copy_from_slice(sealed);
            }
        }
    }
}

/// The header fields of a log block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LogBlockHeader {
    pub chain_guid: u64,
    pub seq: u64,
    /// The block after this one (allocated, maybe never written).
    pub next: LogPointer,
    /// The commit (FLUSH) that wrote it: the head's cancellations name
    /// copies by commit and block.
    pub commit: u64,
    /// The last block of its commit: a chain that ends at a block without
    /// it ends inside a commit (blocks written before this flag existed
    /// have it clear).
    pub ends_commit: bool,
}

/// Header flag: the block is the last of its commit.
const FLAG_ENDS_COMMIT: u32 = 1;

/// Bytes a block needs for `records` (header included), before rounding.
pub fn block_bytes_for(records: &[LogRecord]) -> usize {
    LOG_HEADER_BYTES + records.iter().map(LogRecord::encoded_bytes).sum::<usize>()
}

/// Writes a log block holding `records` into `out` (the whole block: the rest
/// is zeroed). Panics if they do not fit: the caller sizes blocks with
/// [`block_bytes_for`].
pub fn encode_block(header: &LogBlockHeader, records: &[LogRecord], out: &mut [u8]) {
    let used = block_bytes_for(records);
    assert!(
        used <= out.len(),
        "{used} bytes of records in a {}-byte log block",
        out.len()
    );
    out.fill(0);
    put_u64(out, 0, LOG_BLOCK_MAGIC);
    put_u64(out, 8, header.chain_guid);
    put_u64(out, 16, header.seq);
    put_u32(out, 24, (used - LOG_HEADER_BYTES) as u32);
    put_u32(out, 28, records.len() as u32);
    put_u32(out, 32, header.next.dva.vdev);
    put_u32(out, 36, header.next.dva.asize);
    put_u64(out, 40, header.next.dva.offset);
    put_u32(out, 48, header.next.bytes);
    put_u32(
        out,
        52,
        if header.ends_commit {
            FLAG_ENDS_COMMIT
        } else {
            0
        },
    );
    put_u64(out, 56, header.commit);
    let mut at = LOG_HEADER_BYTES;
    for record in records {
        let length = record.encoded_bytes();
        record.encode(&mut out[at..at + length]);
        at += length;
    }
    let checksum = embedded(&out[..used]);
    out[64..80].copy_from_slice(&checksum);
}

/// True when `bytes` start like block `seq` of chain `chain_guid` (whatever
/// the rest holds): a block of the chain that is torn or damaged, worth
/// reading again from another side or through parity.
pub fn names_block(bytes: &[u8], chain_guid: u64, seq: u64) -> bool {
    bytes.len() >= LOG_HEADER_BYTES
        && get_u64(bytes, 0) == LOG_BLOCK_MAGIC
        && get_u64(bytes, 8) == chain_guid
        && get_u64(bytes, 16) == seq
}

/// Whether `bytes` hold a log block whose checksum matches (of any chain,
/// at any place in it): what a scrub of a claimed chain checks.
pub fn verifies_itself(bytes: &[u8]) -> bool {
    if bytes.len() < LOG_HEADER_BYTES || get_u64(bytes, 0) != LOG_BLOCK_MAGIC {
        return false;
    }
    let used = LOG_HEADER_BYTES + get_u32(bytes, 24) as usize;
    used <= bytes.len() && embedded_checksum_holds(&bytes[..used])
}

/// Whether the checksum a log block embeds (header bytes 64..80) is that of
/// its `used` bytes with those 16 bytes zeroed.
fn embedded_checksum_holds(used: &[u8]) -> bool {
    let mut copy = used.to_vec();
    copy[64..80].fill(0);
    embedded(&copy) == used[64..80]
}

/// Decodes the log block in `bytes` if it is block `seq` of chain
/// `chain_guid` and intact; an error says why it is not (replay ends there).
pub fn decode_block(
    bytes: &[u8],
    chain_guid: u64,
    seq: u64,
) -> Result<(LogBlockHeader, Vec<LogRecord>), FormatError> {
    const WHAT: &str = "intent log block";
    if bytes.len() < LOG_HEADER_BYTES {
        return Err(invalid(WHAT, format!("{} bytes", bytes.len())));
    }
    if get_u64(bytes, 0) != LOG_BLOCK_MAGIC {
        return Err(FormatError::BadMagic(WHAT));
    }
    let payload = get_u32(bytes, 24) as usize;
    let used = LOG_HEADER_BYTES + payload;
    if used > bytes.len() {
        return Err(invalid(
            WHAT,
            format!("{payload} bytes of records in {} bytes", bytes.len()),
        ));
    }
    if !embedded_checksum_holds(&bytes[..used]) {
        return Err(FormatError::ChecksumMismatch(WHAT));
    }
    let header = LogBlockHeader {
        chain_guid: get_u64(bytes, 8),
        seq: get_u64(bytes, 16),
        next: LogPointer {
            dva: Dva {
                vdev: get_u32(bytes, 32),
                asize: get_u32(bytes, 36),
                offset: get_u64(bytes, 40),
            },
            bytes: get_u32(bytes, 48),
        },
        commit: get_u64(bytes, 56),
        ends_commit: get_u32(bytes, 52) & FLAG_ENDS_COMMIT != 0,
    };
    if header.chain_guid != chain_guid {
        return Err(invalid(
            WHAT,
            format!("chain {:#x}, expected {chain_guid:#x}", header.chain_guid),
        ));
    }
    if header.seq != seq {
        return Err(invalid(
            WHAT,
            format!("sequence {}, expected {seq}", header.seq),
        ));
    }
    let count = get_u32(bytes, 28) as usize;
    let mut records = Vec::with_capacity(count.min(payload / RECORD_HEAD_BYTES));
    let mut at = LOG_HEADER_BYTES;
    for _ in 0..count {
        let (record, length) = decode_record(bytes, at, used)?;
        records.push(record);
        at += RECORD_HEAD_BYTES + length;
    }
    Ok((header, records))
}

/// Decodes the record at `at` of `bytes`, whose records end at `used`:
/// the record and the bytes of its body.
fn decode_record(bytes: &[u8], at: usize, used: usize) -> Result<(LogRecord, usize), FormatError> {
    const WHAT: &str = "intent log block";
    if at + RECORD_HEAD_BYTES > used {
        return Err(invalid(WHAT, "a record runs past the block"));
    }
    let head = &bytes[at..at + RECORD_HEAD_BYTES];
    let object = get_u64(head, 8);
    let blkid = get_u64(head, 16);
    let txg = get_u64(head, 24);
    let body = at + RECORD_HEAD_BYTES;
    let (record, length) = match head[0] {
        KIND_BLOCK => {
            if body + BLOCK_POINTER_BYTES > used {
                return Err(invalid(WHAT, "a block record runs past the block"));
            }
            let pointer = BlockPointer::decode(&bytes[body..body + BLOCK_POINTER_BYTES])?;
            if pointer.is_hole() || pointer.birth_txg != txg {
                return Err(invalid(WHAT, "a block record without a block"));
            }
            (
                LogRecord::Block {
                    object,
                    blkid,
                    pointer,
                },
                BLOCK_POINTER_BYTES,
            )
        }
        KIND_HOLE => (LogRecord::Hole { object, blkid, txg }, 0),
        KIND_COPY | KIND_WRITTEN => {
            let length = get_u32(head, 4) as usize;
            if body + length.next_multiple_of(8) > used {
                return Err(invalid(WHAT, "a copied record runs past the block"));
            }
            let data = bytes[body..body + length].to_vec();
            let record = if head[0] == KIND_COPY {
                LogRecord::Copy {
                    object,
                    blkid,
                    data,
                }
            } else {
                LogRecord::Written {
                    object,
                    blkid,
                    txg,
                    data,
                }
            };
            (record, length.next_multiple_of(8))
        }
        KIND_ATTR => {
            if body + ATTR_BODY_BYTES > used {
                return Err(invalid(WHAT, "an attribute record runs past the block"));
            }
            let (mtime, ctime) = times_from_bytes(
                bytes[body + 8..body + 8 + TIMES_BYTES]
                    .try_into()
                    .expect("times bytes"),
            );
            (
                LogRecord::Attr {
                    object,
                    txg,
                    length: get_u64(bytes, body),
                    mtime,
                    ctime,
                    sealed: None,
                },
                ATTR_BODY_BYTES,
            )
        }
        KIND_ATTR_SEALED => {
            if body + ATTR_SEALED_BODY_BYTES > used {
                return Err(invalid(WHAT, "an attribute record runs past the block"));
            }
            let (length, sealed) =
                SealedTimes::from_body(&bytes[body..body + ATTR_SEALED_BODY_BYTES])?;
            (
                LogRecord::Attr {
                    object,
                    txg,
                    length,
                    mtime: Timestamp::default(),
                    ctime: Timestamp::default(),
                    sealed: Some(sealed),
                },
                ATTR_SEALED_BODY_BYTES,
            )
        }
        KIND_OBJECT | KIND_OBJECT_EXT => {
            let (body_bytes, znode_bytes) = if head[0] == KIND_OBJECT {
                (OBJECT_BODY_BYTES, ZNODE_BYTES)
            } else {
                (OBJECT_EXT_BODY_BYTES, ZNODE_EXT_BYTES)
            };
            if body + body_bytes > used {
                return Err(invalid(WHAT, "an object record runs past the block"));
            }
            let mut bonus = Bonus::default();
            bonus.0[..znode_bytes].copy_from_slice(&bytes[body + 8..body + 8 + znode_bytes]);
            let state = ObjectState {
                block_shift: head[1],
                length: get_u64(bytes, body),
                znode: Znode::decode(&bonus)?,
            };
            (LogRecord::Object { object, txg, state }, body_bytes)
        }
        KIND_FREED => (LogRecord::Freed { object, txg }, 0),
        KIND_ENTRY => {
            let length = head[2] as usize;
            let padded = 8 + length.next_multiple_of(8);
            if body + padded > used {
                return Err(invalid(WHAT, "an entry record runs past the block"));
            }
            let name = bytes[body + 8..body + 8 + length].to_vec();
            if !valid_entry_name(&name) {
                return Err(invalid(WHAT, "an entry record with an invalid name"));
            }
            let target = (head[1] != 0).then(|| EntryTarget {
                object: blkid,
                kind: head[1],
                cookie: get_u64(bytes, body),
            });
            (
                LogRecord::Entry {
                    dir: object,
                    txg,
                    name,
                    target,
                },
                padded,
            )
        }
        KIND_XATTRS => {
            let length = get_u32(head, 4) as usize;
            if body + length.next_multiple_of(8) > used {
                return Err(invalid(WHAT, "an xattr record runs past the block"));
            }
            let list = bytes[body..body + length].to_vec();
            if !list.is_empty() {
                super::xattr::decode(&list)?;
            }
            (
                LogRecord::Xattrs { object, txg, list },
                length.next_multiple_of(8),
            )
        }
        KIND_SEALED => {
            let length = get_u32(head, 4) as usize;
            if length < SEALING_BYTES || body + length.next_multiple_of(8) > used {
                return Err(invalid(WHAT, "a sealed record runs past the block"));
            }
            (
                LogRecord::Sealed {
                    object,
                    txg,
                    sealed: bytes[body..body + length].to_vec(),
                },
                length.next_multiple_of(8),
            )
        }
        kind => return Err(invalid(WHAT, format!("record kind {kind}"))),
    };
    Ok((record, length))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::bp::{IV_BYTES, MAC_BYTES};
    use crate::format::{ChecksumAlgo, ObjectType};

    fn pointer(txg: u64) -> BlockPointer {
        BlockPointer {
            dvas: [
                Dva {
                    vdev: 0,
                    asize: 16384,
                    offset: 1 << 20,
                },
                Dva::default(),
                Dva::default(),
            ],
            birth_txg: txg,
            physical_birth: 0,
            logical_size: 16384,
            physical_size: 16384,
            object_type: ObjectType::VolumeData,
            checksum_algo: ChecksumAlgo::Xxh3,
            fill: 1,
            checksum: ChecksumAlgo::Xxh3.compute(&[7u8; 16384]),
            ..BlockPointer::default()
        }
    }

    fn sample() -> (LogBlockHeader, Vec<LogRecord>) {
        let header = LogBlockHeader {
            chain_guid: 0xfeed,
            seq: 9,
            next: LogPointer {
                dva: Dva {
                    vdev: 1,
                    asize: 8192,
                    offset: 4 << 20,
                },
                bytes: 8192,
            },
            commit: 77,
            ends_commit: true,
        };
        let records = vec![
            LogRecord::Block {
                object: 5,
                blkid: 3,
                pointer: pointer(12),
            },
            LogRecord::Hole {
                object: 5,
                blkid: 4,
                txg: 12,
            },
            LogRecord::Copy {
                object: 5,
                blkid: 6,
                data: vec![0xab; 1001],
            },
            LogRecord::Copy {
                object: 5,
                blkid: 7,
                data: vec![0xcd; 512],
            },
            LogRecord::Written {
                object: 9,
                blkid: 2,
                txg: 12,
                data: vec![0x5a; 256],
            },
            LogRecord::Attr {
                object: 9,
                txg: 12,
                length: (1 << 40) + 3,
                mtime: Timestamp {
                    seconds: -5,
                    nanos: 999_999_999,
                },
                ctime: Timestamp {
                    seconds: 1 << 33,
                    nanos: 1,
                },
                sealed: None,
            },
            LogRecord::Attr {
                object: 9,
                txg: 13,
                length: 77,
                mtime: Timestamp::default(),
                ctime: Timestamp::default(),
                sealed: Some(SealedTimes {
                    crypt: BlockCrypt {
                        salt: 0x0102_0304_0506_0708,
                        iv: [0x11; IV_BYTES],
                        mac: [0x22; MAC_BYTES],
                    },
                    ciphertext: [0x33; TIMES_BYTES],
                }),
            },
            LogRecord::Object {
                object: 10,
                txg: 13,
                state: ObjectState {
                    block_shift: 13,
                    length: 5000,
                    znode: Znode {
                        mode: crate::format::znode::S_IFREG | 0o640,
                        uid: 7,
                        nlink: 2,
                        parent: 1,
                        generation: 10,
                        ..Znode::default()
                    },
                },
            },
            LogRecord::Object {
                object: 12,
                txg: 13,
                state: ObjectState {
                    block_shift: 12,
                    length: 0,
                    znode: Znode {
                        mode: crate::format::znode::S_IFDIR | 0o755,
                        nlink: 2,
                        parent: 1,
                        project: 77,
                        flags: crate::format::znode::ZNODE_PROJINHERIT,
                        ..Znode::default()
                    },
                },
            },
            LogRecord::Freed {
                object: 11,
                txg: 13,
            },
            LogRecord::Entry {
                dir: 1,
                txg: 13,
                name: b"a name".to_vec(),
                target: Some(EntryTarget {
                    object: 10,
                    kind: 8,
                    cookie: (0x1234 << 32) | 1,
                }),
            },
            LogRecord::Entry {
                dir: 1,
                txg: 13,
                name: vec![b'x'; 255],
                target: None,
            },
            LogRecord::Xattrs {
                object: 10,
                txg: 13,
                list: crate::format::xattr::encode(&[crate::format::xattr::Xattr {
                    name: b"user.colour".to_vec(),
                    value: b"blue".to_vec(),
                }]),
            },
            LogRecord::Xattrs {
                object: 12,
                txg: 13,
                list: Vec::new(),
            },
        ];
        (header, records)
    }

    #[test]
    fn a_block_round_trips() {
        let (header, records) = sample();
        let mut block = vec![0u8; LOG_BLOCK_BYTES_MIN];
        encode_block(&header, &records, &mut block);
        let (decoded, decoded_records) = decode_block(&block, 0xfeed, 9).unwrap();
        assert_eq!(decoded, header);
        assert_eq!(decoded_records, records);
    }

    /// A sealed record keeps kind 12, its length, object and txg in the
    /// clear head and its bytes as given; a record's own bytes round-trip
    /// through `record_bytes` (what is sealed), and a sealed record or a
    /// trailing byte is refused there.
    #[test]
    fn a_sealed_record_keeps_its_head_in_the_clear() {
        let (header, mut records) = sample();
        let sealed = LogRecord::Sealed {
            object: 41,
            txg: 13,
            sealed: (0..77).collect(),
        };
        records.push(sealed.clone());
        let mut block = vec![0u8; LOG_BLOCK_BYTES_MIN];
        encode_block(&header, &records, &mut block);
        assert_eq!(decode_block(&block, 0xfeed, 9).unwrap().1, records);
        let at = block_bytes_for(&records) - sealed.encoded_bytes();
        assert_eq!(block[at], KIND_SEALED);
        assert_eq!(get_u32(&block, at + 4), 77);
        assert_eq!(get_u64(&block, at + 8), 41);
        assert_eq!(get_u64(&block, at + 24), 13);
        assert_eq!(block[at + RECORD_HEAD_BYTES + 76], 76);
        for record in &records[..records.len() - 1] {
            assert_eq!(&record_from_bytes(&record_bytes(record)).unwrap(), record);
        }
        assert!(record_from_bytes(&record_bytes(&sealed)).is_err());
        let mut longer = record_bytes(&records[0]);
        longer.extend_from_slice(&[0; 8]);
        assert!(record_from_bytes(&longer).is_err());
    }

    #[test]
    fn replay_stops_at_a_torn_stale_or_foreign_block() {
        let (header, records) = sample();
        let mut block = vec![0u8; LOG_BLOCK_BYTES_MIN];
        encode_block(&header, &records, &mut block);
        // Another chain, or the same chain's block from an earlier lap.
        assert!(decode_block(&block, 0xbeef, 9).is_err());
        assert!(decode_block(&block, 0xfeed, 10).is_err());
        // A torn write: the second half of the records is still old bytes.
        let mut torn = block.clone();
        torn[200] ^= 1;
        assert_eq!(
            decode_block(&torn, 0xfeed, 9).unwrap_err(),
            FormatError::ChecksumMismatch("intent log block")
        );
        // Never written: zeros, or any other block's bytes.
        assert!(decode_block(&[0u8; 4096], 0xfeed, 9).is_err());
        assert!(decode_block(&[0xffu8; 4096], 0xfeed, 9).is_err());
        // A length past the block is refused before anything is read there.
        let mut long = block.clone();
        put_u32(&mut long, 24, 1 << 30);
        assert!(decode_block(&long, 0xfeed, 9).is_err());
    }

    #[test]
    fn block_bytes_count_every_record() {
        let (header, records) = sample();
        let needed = block_bytes_for(&records);
        assert_eq!(
            needed,
            80 + (32 + 128)
                + 32
                + (32 + 1008)
                + (32 + 512)
                + (32 + 256)
                + (32 + 32)
                + (32 + 72)
                + (32 + 128)
                + (32 + 136)
                + 32
                + (32 + 16)
                + (32 + 8 + 256)
                + (32 + 32)
                + 32
        );
        let mut exact = vec![0u8; needed];
        encode_block(&header, &records, &mut exact);
        assert!(decode_block(&exact, 0xfeed, 9).is_ok());
    }
}
