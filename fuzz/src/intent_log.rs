//! Target `intent_log`: `format::intent_log::decode_block`.
//!
//! Input: one log block. Its chain guid and sequence are taken from the input
//! itself, and it is decoded twice: as it is (which only a block whose XXH3
//! matches passes), and with its checksum field recomputed over the length
//! its header gives, so the fuzzer reaches the record parser as a block that
//! verifies but holds anything would.

use ironpool::format::checksum::embedded;
use ironpool::format::intent_log::{block_bytes_for, decode_block, encode_block, LOG_HEADER_BYTES};

pub fn check(data: &[u8]) {
    let word = |at: usize| -> u64 {
        data.get(at..at + 8)
            .map(|bytes| u64::from_le_bytes(bytes.try_into().expect("8 bytes")))
            .unwrap_or(0)
    };
    let (guid, seq) = (word(8), word(16));
    if let Ok(decoded) = decode_block(data, guid, seq) {
        round_trip(&decoded, guid, seq);
    }
    if data.len() < LOG_HEADER_BYTES {
        return;
    }
    let payload = u32::from_le_bytes(data[24..28].try_into().expect("4 bytes")) as usize;
    let Some(used) = payload.checked_add(LOG_HEADER_BYTES).filter(|used| *used <= data.len()) else {
        return;
    };
    let mut block = data.to_vec();
    block[64..80].fill(0);
    let checksum = embedded(&block[..used]);
    block[64..80].copy_from_slice(&checksum);
    if let Ok(decoded) = decode_block(&block, guid, seq) {
        round_trip(&decoded, guid, seq);
    }
}

/// A decoded block encodes to the bytes it says it needs and decodes again
/// to the same header and records.
fn round_trip(decoded: &(ironpool::format::intent_log::LogBlockHeader, Vec<ironpool::format::intent_log::LogRecord>), guid: u64, seq: u64) {
    let (header, records) = decoded;
    let mut again = vec![0u8; block_bytes_for(records)];
    encode_block(header, records, &mut again);
    let (header_again, records_again) =
        decode_block(&again, guid, seq).unwrap_or_else(|error| panic!("re-encoded log block does not decode: {error}"));
    assert_eq!(&header_again, header, "log block header does not round trip");
    assert_eq!(&records_again, records, "log records do not round trip");
}
