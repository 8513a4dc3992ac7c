//! Target `label`: `format::label::Label::decode` on a label's config area.
//!
//! Input: the config area, which may stop after the config document (decode
//! reads no further). When the only fault is the checksum, the checksum is
//! recomputed and the input decoded again, so mutations reach the header and
//! JSON checks behind it.

use ironpool::format::checksum::embedded;
use ironpool::format::label::{Label, CONFIG_BYTES_MAX};
use ironpool::format::{FormatError, LABEL_CONFIG_BYTES};

/// The header before the config document (see the layout in `format::label`).
const HEADER_BYTES: usize = 64;
/// Where the header's checksum sits.
const CHECKSUM_OFFSET: usize = 48;

pub fn check(data: &[u8]) {
    match Label::decode(data) {
        Ok(label) => check_decoded(&label),
        Err(FormatError::ChecksumMismatch(_)) => {
            let sealed = seal(data).expect("a checksum is only checked once the header and length are sane");
            match Label::decode(&sealed) {
                Ok(label) => check_decoded(&label),
                Err(FormatError::ChecksumMismatch(_)) => panic!("label checksum still wrong after sealing: layout drifted from format::label"),
                Err(_) => {}
            }
        }
        Err(_) => {}
    }
}

/// `data` with its checksum recomputed, if it is long enough to hold one.
pub fn seal(data: &[u8]) -> Option<Vec<u8>> {
    if data.len() < HEADER_BYTES {
        return None;
    }
    let length = u32::from_le_bytes(data[12..16].try_into().expect("4 bytes")) as usize;
    if length > CONFIG_BYTES_MAX || HEADER_BYTES + length > data.len() {
        return None;
    }
    let mut covered = data[..CHECKSUM_OFFSET].to_vec();
    covered.extend_from_slice(&data[HEADER_BYTES..HEADER_BYTES + length]);
    let mut sealed = data.to_vec();
    sealed[CHECKSUM_OFFSET..HEADER_BYTES].copy_from_slice(&embedded(&covered));
    Some(sealed)
}

/// A decoded label re-encodes, and the encoding decodes to the same label.
fn check_decoded(label: &Label) {
    let _ = label.config.guid_sum();
    assert!(label.config.find_leaf(label.leaf_guid).is_some(), "decoded label whose device is not in its config");
    let bytes = label.encode().unwrap_or_else(|error| panic!("decoded label does not re-encode: {error}: {label:?}"));
    assert_eq!(bytes.len() as u64, LABEL_CONFIG_BYTES);
    let again = Label::decode(&bytes).unwrap_or_else(|error| panic!("re-encoded label does not decode: {error}: {label:?}"));
    assert_eq!(again, *label, "label does not round trip");
}
