//! Target `nbd_handshake`: what a client sends before transmission, walked the
//! way `nbd::server` walks it: the 4-byte client flags, then options (a 16-byte
//! header and its data), whose data goes to the INFO/GO or META_CONTEXT parser.
//!
//! Input: the client's byte stream. An option whose declared length runs past
//! the end of the input is given the bytes that remain (the parsers see any
//! slice a client could send, whatever the header's arithmetic).

use ironpool::nbd::proto::{
    parse_client_flags, parse_info_request, parse_meta_context_request, parse_option_header, InfoRequest, MetaContextRequest, ProtocolError,
    CLIENT_FLAG_FIXED_NEWSTYLE, CLIENT_FLAG_NO_ZEROES, IHAVEOPT, OPTION_BYTES_MAX, OPTION_HEADER_BYTES, OPT_ABORT, OPT_EXPORT_NAME, OPT_GO, OPT_INFO,
    OPT_LIST_META_CONTEXT, OPT_SET_META_CONTEXT, STRING_BYTES_MAX,
};

/// Options walked per input: enough for any real handshake; bounds the work on
/// inputs that are long runs of empty options.
const OPTIONS_PER_INPUT_MAX: usize = 64;

pub fn check(data: &[u8]) {
    let Some((flags, mut rest)) = data.split_first_chunk::<4>() else { return };
    check_client_flags(flags);
    for _ in 0..OPTIONS_PER_INPUT_MAX {
        let Some((header_bytes, after)) = rest.split_first_chunk::<OPTION_HEADER_BYTES>() else { return };
        let header = match parse_option_header(header_bytes) {
            Ok(header) => header,
            Err(error) => {
                // Only a wrong magic is refused, and the error carries it.
                let magic = u64::from_be_bytes(header_bytes[..8].try_into().expect("8 bytes"));
                assert_ne!(magic, IHAVEOPT, "option header with the right magic refused: {error}");
                assert_eq!(error, ProtocolError::BadMagic(magic));
                return;
            }
        };
        assert_eq!(header_bytes[..8], IHAVEOPT.to_be_bytes());
        assert_eq!(header_bytes[8..12], header.option.to_be_bytes());
        assert_eq!(header_bytes[12..16], header.length.to_be_bytes());
        if header.length > OPTION_BYTES_MAX {
            return; // the server refuses the option and disconnects
        }
        let length = (header.length as usize).min(after.len());
        let (option_data, next) = after.split_at(length);
        match header.option {
            OPT_INFO | OPT_GO => check_info_request(option_data),
            OPT_LIST_META_CONTEXT | OPT_SET_META_CONTEXT => check_meta_context_request(option_data),
            OPT_EXPORT_NAME | OPT_ABORT => return, // the handshake ends
            _ => {}
        }
        rest = next;
    }
}

/// The flags word is accepted exactly when it has no unknown bit.
fn check_client_flags(flags: &[u8; 4]) {
    let word = u32::from_be_bytes(*flags);
    let known = CLIENT_FLAG_FIXED_NEWSTYLE | CLIENT_FLAG_NO_ZEROES;
    match parse_client_flags(flags) {
        Ok(no_zeroes) => {
            assert_eq!(word & !known, 0, "unknown client flags {word:#x} accepted");
            assert_eq!(no_zeroes, word & CLIENT_FLAG_NO_ZEROES != 0);
        }
        Err(error) => assert_ne!(word & !known, 0, "client flags {word:#x} refused: {error}"),
    }
}

/// What parses re-encodes to exactly the option data (the format has no slack).
pub fn check_info_request(data: &[u8]) {
    if let Ok(request) = parse_info_request(data) {
        assert!(request.name.len() <= STRING_BYTES_MAX);
        assert_eq!(encode_info_request(&request), data, "INFO/GO data does not round trip: {request:?}");
    }
}

/// What parses re-encodes to exactly the option data.
pub fn check_meta_context_request(data: &[u8]) {
    if let Ok(request) = parse_meta_context_request(data) {
        assert!(request.export.len() <= STRING_BYTES_MAX);
        assert!(request.queries.iter().all(|query| query.len() <= STRING_BYTES_MAX));
        assert_eq!(encode_meta_context_request(&request), data, "META_CONTEXT data does not round trip: {request:?}");
    }
}

/// INFO / GO data as a client writes it (NBD spec: name length, name, count, types).
pub fn encode_info_request(request: &InfoRequest) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&(request.name.len() as u32).to_be_bytes());
    out.extend_from_slice(request.name.as_bytes());
    out.extend_from_slice(&(request.requests.len() as u16).to_be_bytes());
    for info in &request.requests {
        out.extend_from_slice(&info.to_be_bytes());
    }
    out
}

/// META_CONTEXT data as a client writes it (export, count, then each query).
pub fn encode_meta_context_request(request: &MetaContextRequest) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&(request.export.len() as u32).to_be_bytes());
    out.extend_from_slice(request.export.as_bytes());
    out.extend_from_slice(&(request.queries.len() as u32).to_be_bytes());
    for query in &request.queries {
        out.extend_from_slice(&(query.len() as u32).to_be_bytes());
        out.extend_from_slice(query.as_bytes());
    }
    out
}

/// An option as a client writes it: header, then data.
pub fn encode_option(option: u32, data: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(OPTION_HEADER_BYTES + data.len());
    out.extend_from_slice(&IHAVEOPT.to_be_bytes());
    out.extend_from_slice(&option.to_be_bytes());
    out.extend_from_slice(&(data.len() as u32).to_be_bytes());
    out.extend_from_slice(data);
    out
}
