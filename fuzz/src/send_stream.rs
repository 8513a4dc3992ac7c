//! Target `send_stream`: `format::stream::check_stream`, the receiver's checks of
//! a send stream, on an arbitrary byte string.
//!
//! Every record's checksum is chained to the one before, so nearly every
//! mutation is refused at the first checksum. The input is therefore also
//! resealed (every checksum recomputed along the chain) and checked again, so
//! mutations reach the record parsing and the stream rules behind the checksums.

use ironpool::format::stream::{check_stream, encode_header, Record, RecordKind, RECORD_HEADER_BYTES, RECORD_PAYLOAD_BYTES_MAX};

pub fn check(data: &[u8]) {
    check_accepted(data);
    if let Some(resealed) = reseal(data) {
        check_accepted(&resealed);
    }
}

/// What an accepted stream must look like: BEGIN first, END last, and END's
/// counts those of the records between.
fn check_accepted(data: &[u8]) {
    let Ok(records) = check_stream(data) else { return };
    assert!(matches!(records.first(), Some(Record::Begin(_))), "accepted stream without BEGIN first: {records:?}");
    let Some(Record::End(end)) = records.last() else { panic!("accepted stream without END last: {records:?}") };
    assert_eq!(end.records as usize, records.len() - 1);
    let written: u64 = records
        .iter()
        .map(|record| match record {
            Record::Write { count, .. } | Record::ObjectWrite { count, .. } => *count as u64,
            Record::WriteRaw(_) | Record::ObjectWriteRaw { .. } => 1,
            _ => 0,
        })
        .sum();
    let freed: u64 = records
        .iter()
        .map(|record| match record {
            Record::Free { count, .. } | Record::ObjectFree { count, .. } => *count,
            _ => 0,
        })
        .sum();
    assert_eq!((end.written_blocks, end.freed_blocks), (written, freed));
}

/// `data` with every record's checksum recomputed along the chain (None when a
/// header is unreadable: nothing to reseal).
pub fn reseal(data: &[u8]) -> Option<Vec<u8>> {
    let mut out = data.to_vec();
    let mut previous = [0u8; 16];
    let mut position = 0;
    while position + RECORD_HEADER_BYTES <= out.len() {
        let kind = match u32::from_le_bytes(out[position + 4..position + 8].try_into().ok()?) {
            1 => RecordKind::Begin,
            2 => RecordKind::Write,
            3 => RecordKind::Free,
            4 => RecordKind::End,
            5 => RecordKind::Object,
            6 => RecordKind::FreeObjects,
            7 => RecordKind::ObjectWrite,
            8 => RecordKind::ObjectFree,
            9 => RecordKind::WriteRaw,
            10 => RecordKind::ObjectWriteRaw,
            _ => return None,
        };
        let length = u64::from_le_bytes(out[position + 8..position + 16].try_into().ok()?);
        if length > RECORD_PAYLOAD_BYTES_MAX {
            return None;
        }
        let start = position + RECORD_HEADER_BYTES;
        let end = start.checked_add(length as usize)?;
        if end > out.len() {
            return Some(out);
        }
        let magic = out[position..position + 4].to_vec();
        let (header, checksum) = encode_header(kind, &[&out[start..end]], &previous);
        out[position..position + RECORD_HEADER_BYTES].copy_from_slice(&header);
        // Keep the input's magic (a mutated magic must still be refused).
        out[position..position + 4].copy_from_slice(&magic);
        previous = checksum;
        position = end;
    }
    Some(out)
}
