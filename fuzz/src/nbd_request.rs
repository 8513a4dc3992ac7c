//! Target `nbd_request`: the transmission phase, walked the way `nbd::server`
//! reads it: 28-byte request headers, a WRITE's payload skipped, DISC ending it.
//!
//! Input: the client's byte stream after the handshake. A WRITE payload longer
//! than the rest of the input takes what remains.

use ironpool::nbd::proto::{
    allowed_flags, parse_request, ProtocolError, Request, CMD_DISC, CMD_WRITE, PAYLOAD_BYTES_MAX, REQUEST_HEADER_BYTES, REQUEST_MAGIC,
};

/// Requests walked per input: bounds the work on long runs of empty requests.
const REQUESTS_PER_INPUT_MAX: usize = 64;

pub fn check(data: &[u8]) {
    let mut rest = data;
    for _ in 0..REQUESTS_PER_INPUT_MAX {
        let Some((header, after)) = rest.split_first_chunk::<REQUEST_HEADER_BYTES>() else { return };
        let request = match parse_request(header) {
            Ok(request) => request,
            Err(error) => {
                let magic = u32::from_be_bytes(header[..4].try_into().expect("4 bytes"));
                assert_ne!(magic, REQUEST_MAGIC, "request with the right magic refused: {error}");
                assert_eq!(error, ProtocolError::BadMagic(magic as u64));
                return;
            }
        };
        assert_eq!(encode_request(&request), *header, "request does not round trip: {request:?}");
        // Total on every command: the server asks it of whatever arrives.
        let _ = allowed_flags(request.command, false) | allowed_flags(request.command, true);
        if request.command == CMD_DISC {
            return;
        }
        rest = after;
        if request.command == CMD_WRITE {
            if request.length > PAYLOAD_BYTES_MAX {
                return; // the server disconnects
            }
            rest = &rest[(request.length as usize).min(rest.len())..];
        }
    }
}

/// A request header as a client writes it.
pub fn encode_request(request: &Request) -> [u8; REQUEST_HEADER_BYTES] {
    let mut out = [0u8; REQUEST_HEADER_BYTES];
    out[0..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes());
    out[4..6].copy_from_slice(&request.flags.to_be_bytes());
    out[6..8].copy_from_slice(&request.command.to_be_bytes());
    out[8..16].copy_from_slice(&request.cookie.to_be_bytes());
    out[16..24].copy_from_slice(&request.offset.to_be_bytes());
    out[24..28].copy_from_slice(&request.length.to_be_bytes());
    out
}
