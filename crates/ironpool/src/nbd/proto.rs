//! The NBD wire protocol: constants, and pure functions that parse requests and
//! options and encode replies. Nothing here does I/O, so all of it is unit-tested
//! and fuzzed directly.
//!
//! Reference: the NBD protocol specification (NetworkBlockDevice/nbd, doc/proto.md).
//! All integers are big-endian.

/// "NBDMAGIC": first word of the server greeting.
pub const NBD_MAGIC: u64 = 0x4e42_444d_4147_4943;
/// "IHAVEOPT": second word of the greeting and first word of every option.
pub const IHAVEOPT: u64 = 0x4948_4156_454f_5054;
/// Magic of option replies.
pub const OPTION_REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
pub const REQUEST_MAGIC: u32 = 0x2560_9513;
pub const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
pub const STRUCTURED_REPLY_MAGIC: u32 = 0x668e_33ef;

// Handshake flags (server) and client flags.
pub const FLAG_FIXED_NEWSTYLE: u16 = 1 << 0;
pub const FLAG_NO_ZEROES: u16 = 1 << 1;
pub const CLIENT_FLAG_FIXED_NEWSTYLE: u32 = 1 << 0;
pub const CLIENT_FLAG_NO_ZEROES: u32 = 1 << 1;

// Options.
pub const OPT_EXPORT_NAME: u32 = 1;
pub const OPT_ABORT: u32 = 2;
pub const OPT_LIST: u32 = 3;
pub const OPT_STARTTLS: u32 = 5;
pub const OPT_INFO: u32 = 6;
pub const OPT_GO: u32 = 7;
pub const OPT_STRUCTURED_REPLY: u32 = 8;
pub const OPT_LIST_META_CONTEXT: u32 = 9;
pub const OPT_SET_META_CONTEXT: u32 = 10;

// Option replies.
pub const REP_ACK: u32 = 1;
pub const REP_SERVER: u32 = 2;
pub const REP_INFO: u32 = 3;
pub const REP_META_CONTEXT: u32 = 4;
pub const REP_ERR_UNSUP: u32 = 0x8000_0001;
pub const REP_ERR_POLICY: u32 = 0x8000_0002;
pub const REP_ERR_INVALID: u32 = 0x8000_0003;
pub const REP_ERR_UNKNOWN: u32 = 0x8000_0006;
pub const REP_ERR_SHUTDOWN: u32 = 0x8000_0007;
pub const REP_ERR_TOO_BIG: u32 = 0x8000_0009;

// Info types.
pub const INFO_EXPORT: u16 = 0;
pub const INFO_NAME: u16 = 1;
pub const INFO_DESCRIPTION: u16 = 2;
pub const INFO_BLOCK_SIZE: u16 = 3;

// Transmission flags.
pub const TRANSMIT_HAS_FLAGS: u16 = 1 << 0;
pub const TRANSMIT_READ_ONLY: u16 = 1 << 1;
pub const TRANSMIT_SEND_FLUSH: u16 = 1 << 2;
pub const TRANSMIT_SEND_FUA: u16 = 1 << 3;
pub const TRANSMIT_SEND_TRIM: u16 = 1 << 5;
pub const TRANSMIT_SEND_WRITE_ZEROES: u16 = 1 << 6;
pub const TRANSMIT_SEND_DF: u16 = 1 << 7;
pub const TRANSMIT_CAN_MULTI_CONN: u16 = 1 << 8;
pub const TRANSMIT_SEND_CACHE: u16 = 1 << 10;

// Commands.
pub const CMD_READ: u16 = 0;
pub const CMD_WRITE: u16 = 1;
pub const CMD_DISC: u16 = 2;
pub const CMD_FLUSH: u16 = 3;
pub const CMD_TRIM: u16 = 4;
pub const CMD_CACHE: u16 = 5;
pub const CMD_WRITE_ZEROES: u16 = 6;
pub const CMD_BLOCK_STATUS: u16 = 7;

// Command flags.
pub const CMD_FLAG_FUA: u16 = 1 << 0;
pub const CMD_FLAG_NO_HOLE: u16 = 1 << 1;
pub const CMD_FLAG_DF: u16 = 1 << 2;
pub const CMD_FLAG_REQ_ONE: u16 = 1 << 3;

// Structured reply chunks.
pub const REPLY_FLAG_DONE: u16 = 1 << 0;
pub const REPLY_TYPE_NONE: u16 = 0;
pub const REPLY_TYPE_OFFSET_DATA: u16 = 1;
pub const REPLY_TYPE_OFFSET_HOLE: u16 = 2;
pub const REPLY_TYPE_BLOCK_STATUS: u16 = 5;
pub const REPLY_TYPE_ERROR: u16 = 0x8001;

// base:allocation flags.
pub const STATE_HOLE: u32 = 1 << 0;
pub const STATE_ZERO: u32 = 1 << 1;

// Errors.
pub const EPERM: u32 = 1;
pub const EIO: u32 = 5;
pub const ENOMEM: u32 = 12;
pub const EINVAL: u32 = 22;
pub const ENOSPC: u32 = 28;
pub const EOVERFLOW: u32 = 75;
pub const ENOTSUP: u32 = 95;
pub const ESHUTDOWN: u32 = 108;

/// The one metadata context served.
pub const CONTEXT_BASE_ALLOCATION: &str = "base:allocation";
/// Its id on the wire.
pub const CONTEXT_BASE_ALLOCATION_ID: u32 = 1;

/// Size of a request header.
pub const REQUEST_HEADER_BYTES: usize = 28;
/// Size of an option request header.
pub const OPTION_HEADER_BYTES: usize = 16;
/// Largest READ or WRITE payload (the spec's default maximum, 32 MiB).
pub const PAYLOAD_BYTES_MAX: u32 = 32 * 1024 * 1024;
/// Largest option data accepted: options carry names and context queries (at
/// most 4 KiB strings each); 64 KiB is ample and bounds what a client can make us
/// buffer before transmission starts.
pub const OPTION_BYTES_MAX: u32 = 64 * 1024;
/// Longest string (export name, query) the spec allows.
pub const STRING_BYTES_MAX: usize = 4096;
/// Largest length of one block-status descriptor that stays 512-aligned.
pub const EXTENT_BYTES_MAX: u64 = 0xFFFF_FE00;

/// An option header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OptionHeader {
    pub option: u32,
    pub length: u32,
}

/// Why input from a client was refused. `Disconnect` means the stream cannot be
/// trusted any more (bad magic, impossible length).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ProtocolError {
    #[error("bad magic {0:#x}")]
    BadMagic(u64),
    #[error("{0}")]
    Disconnect(String),
}

fn be_u16(bytes: &[u8], offset: usize) -> u16 {
    u16::from_be_bytes([bytes[offset], bytes[offset + 1]])
}

fn be_u32(bytes: &[u8], offset: usize) -> u32 {
    let mut word = [0u8; 4];
    word.copy_from_slice(&bytes[offset..offset + 4]);
    u32::from_be_bytes(word)
}

fn be_u64(bytes: &[u8], offset: usize) -> u64 {
    let mut word = [0u8; 8];
    word.copy_from_slice(&bytes[offset..offset + 8]);
    u64::from_be_bytes(word)
}

/// The server's greeting.
pub fn greeting() -> Vec<u8> {
    let mut out = Vec::with_capacity(18);
    out.extend_from_slice(&NBD_MAGIC.to_be_bytes());
    out.extend_from_slice(&IHAVEOPT.to_be_bytes());
    out.extend_from_slice(&(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES).to_be_bytes());
    out
}

/// Checks the client's flags word; returns whether it asked for no zeroes.
pub fn parse_client_flags(bytes: &[u8; 4]) -> Result<bool, ProtocolError> {
    let flags = u32::from_be_bytes(*bytes);
    if flags & !(CLIENT_FLAG_FIXED_NEWSTYLE | CLIENT_FLAG_NO_ZEROES) != 0 {
        return Err(ProtocolError::Disconnect(format!(
            "unknown client flags {flags:#x}"
        )));
    }
    Ok(flags & CLIENT_FLAG_NO_ZEROES != 0)
}

/// Parses an option header (16 bytes).
pub fn parse_option_header(
    bytes: &[u8; OPTION_HEADER_BYTES],
) -> Result<OptionHeader, ProtocolError> {
    let magic = be_u64(bytes, 0);
    if magic != IHAVEOPT {
        return Err(ProtocolError::BadMagic(magic));
    }
    Ok(OptionHeader {
        option: be_u32(bytes, 8),
        length: be_u32(bytes, 12),
    })
}

/// An option reply with its data.
pub fn option_reply(option: u32, reply: u32, data: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(20 + data.len());
    out.extend_from_slice(&OPTION_REPLY_MAGIC.to_be_bytes());
    out.extend_from_slice(&option.to_be_bytes());
    out.extend_from_slice(&reply.to_be_bytes());
    out.extend_from_slice(&(data.len() as u32).to_be_bytes());
    out.extend_from_slice(data);
    out
}

/// INFO / GO request data.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InfoRequest {
    pub name: String,
    pub requests: Vec<u16>,
}

/// Parses INFO / GO data: u32 name length, name, u16 count, count u16 info types.
pub fn parse_info_request(data: &[u8]) -> Result<InfoRequest, String> {
    if data.len() < 6 {
        return Err("INFO/GO data shorter than 6 bytes".into());
    }
    let name_length = be_u32(data, 0) as usize;
    if name_length > STRING_BYTES_MAX || name_length > data.len() - 6 {
        return Err(format!("export name length {name_length} does not fit"));
    }
    let name = std::str::from_utf8(&data[4..4 + name_length])
        .map_err(|_| "export name is not UTF-8".to_string())?
        .to_string();
    let count = be_u16(data, 4 + name_length) as usize;
    let rest = &data[6 + name_length..];
    if rest.len() != count * 2 {
        return Err(format!("{count} info requests in {} bytes", rest.len()));
    }
    let requests = rest
        .chunks_exact(2)
        .map(|pair| u16::from_be_bytes([pair[0], pair[1]]))
        .collect();
    Ok(InfoRequest { name, requests })
}

/// LIST_META_CONTEXT / SET_META_CONTEXT data.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MetaContextRequest {
    pub export: String,
    pub queries: Vec<String>,
}

/// Reads length-prefixed fields from option data, refusing to overrun it.
struct Reader<'a> {
    data: &'a [u8],
    position: usize,
}

impl Reader<'_> {
    fn u32(&mut self, what: &str) -> Result<u32, String> {
        if self.data.len() < self.position + 4 {
            return Err(format!("{what} missing"));
        }
        let value = be_u32(self.data, self.position);
        self.position += 4;
        Ok(value)
    }

    fn string(&mut self, what: &str) -> Result<String, String> {
        let length = self.u32(what)? as usize;
        if length > STRING_BYTES_MAX || self.data.len() - self.position < length {
            return Err(format!("{what} of {length} bytes overruns the option"));
        }
        let text = std::str::from_utf8(&self.data[self.position..self.position + length])
            .map_err(|_| format!("{what} is not UTF-8"))?;
        self.position += length;
        Ok(text.to_string())
    }
}

/// Parses meta context data: u32 export length, export, u32 count, then count
/// times (u32 length, query).
pub fn parse_meta_context_request(data: &[u8]) -> Result<MetaContextRequest, String> {
    let mut reader = Reader { data, position: 0 };
    let export = reader.string("export name")?;
    let count = reader.u32("query count")? as usize;
    let mut queries = Vec::new();
    for _ in 0..count {
        queries.push(reader.string("query")?);
    }
    if reader.position != data.len() {
        return Err(format!(
            "{} stray bytes after the queries",
            data.len() - reader.position
        ));
    }
    Ok(MetaContextRequest { export, queries })
}

/// The contexts a query selects (only `base:allocation` exists here).
pub fn matches_base_allocation(query: &str) -> bool {
    query == CONTEXT_BASE_ALLOCATION || query == "base:"
}

/// A transmission request header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Request {
    pub flags: u16,
    pub command: u16,
    pub cookie: u64,
    pub offset: u64,
    pub length: u32,
}

/// Parses a request header (28 bytes).
pub fn parse_request(bytes: &[u8; REQUEST_HEADER_BYTES]) -> Result<Request, ProtocolError> {
    let magic = be_u32(bytes, 0);
    if magic != REQUEST_MAGIC {
        return Err(ProtocolError::BadMagic(magic as u64));
    }
    Ok(Request {
        flags: be_u16(bytes, 4),
        command: be_u16(bytes, 6),
        cookie: be_u64(bytes, 8),
        offset: be_u64(bytes, 16),
        length: be_u32(bytes, 24),
    })
}

/// The flags each command accepts (given what was negotiated).
pub fn allowed_flags(command: u16, structured: bool) -> u16 {
    match command {
        CMD_READ => CMD_FLAG_FUA | if structured { CMD_FLAG_DF } else { 0 },
        CMD_WRITE | CMD_TRIM => CMD_FLAG_FUA,
        CMD_WRITE_ZEROES => CMD_FLAG_FUA | CMD_FLAG_NO_HOLE,
        CMD_BLOCK_STATUS => CMD_FLAG_FUA | CMD_FLAG_REQ_ONE,
        CMD_FLUSH | CMD_CACHE | CMD_DISC => CMD_FLAG_FUA,
        _ => 0,
    }
}

/// A simple reply header.
pub fn simple_reply(cookie: u64, error: u32) -> Vec<u8> {
    let mut out = Vec::with_capacity(16);
    out.extend_from_slice(&SIMPLE_REPLY_MAGIC.to_be_bytes());
    out.extend_from_slice(&error.to_be_bytes());
    out.extend_from_slice(&cookie.to_be_bytes());
    out
}

/// A structured reply chunk header followed by `payload_prefix` (the payload's
/// fixed part; variable data is sent separately).
pub fn structured_chunk(
    cookie: u64,
    flags: u16,
    chunk_type: u16,
    payload_length: u32,
    payload_prefix: &[u8],
) -> Vec<u8> {
    let mut out = Vec::with_capacity(20 + payload_prefix.len());
    out.extend_from_slice(&STRUCTURED_REPLY_MAGIC.to_be_bytes());
    out.extend_from_slice(&flags.to_be_bytes());
    out.extend_from_slice(&chunk_type.to_be_bytes());
    out.extend_from_slice(&cookie.to_be_bytes());
    out.extend_from_slice(&payload_length.to_be_bytes());
    out.extend_from_slice(payload_prefix);
    out
}

/// A structured ERROR chunk (with DONE).
pub fn structured_error(cookie: u64, error: u32, message: &str) -> Vec<u8> {
    let message = &message.as_bytes()[..message.len().min(STRING_BYTES_MAX)];
    let mut payload = Vec::with_capacity(6 + message.len());
    payload.extend_from_slice(&error.to_be_bytes());
    payload.extend_from_slice(&(message.len() as u16).to_be_bytes());
    payload.extend_from_slice(message);
    structured_chunk(
        cookie,
        REPLY_FLAG_DONE,
        REPLY_TYPE_ERROR,
        payload.len() as u32,
        &payload,
    )
}

/// A BLOCK_STATUS chunk for `base:allocation` with `extents` of (length, flags).
pub fn block_status_chunk(cookie: u64, extents: &[(u32, u32)]) -> Vec<u8> {
    let mut payload = Vec::with_capacity(4 + extents.len() * 8);
    payload.extend_from_slice(&CONTEXT_BASE_ALLOCATION_ID.to_be_bytes());
    for (length, flags) in extents {
        payload.extend_from_slice(&length.to_be_bytes());
        payload.extend_from_slice(&flags.to_be_bytes());
    }
    structured_chunk(
        cookie,
        REPLY_FLAG_DONE,
        REPLY_TYPE_BLOCK_STATUS,
        payload.len() as u32,
        &payload,
    )
}

/// The INFO_EXPORT payload.
pub fn info_export(size: u64, flags: u16) -> Vec<u8> {
    let mut out = Vec::with_capacity(12);
    out.extend_from_slice(&INFO_EXPORT.to_be_bytes());
    out.extend_from_slice(&size.to_be_bytes());
    out.extend_from_slice(&flags.to_be_bytes());
    out
}

/// The INFO_BLOCK_SIZE payload.
pub fn info_block_size(minimum: u32, preferred: u32, maximum: u32) -> Vec<u8> {
    let mut out = Vec::with_capacity(14);
    out.extend_from_slice(&INFO_BLOCK_SIZE.to_be_bytes());
    out.extend_from_slice(&minimum.to_be_bytes());
    out.extend_from_slice(&preferred.to_be_bytes());
    out.extend_from_slice(&maximum.to_be_bytes());
    out
}

/// The reply to the old EXPORT_NAME option.
pub fn export_name_reply(size: u64, flags: u16, no_zeroes: bool) -> Vec<u8> {
    let mut out = Vec::with_capacity(134);
    out.extend_from_slice(&size.to_be_bytes());
    out.extend_from_slice(&flags.to_be_bytes());
    if !no_zeroes {
        out.extend_from_slice(&[0u8; 124]);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn greeting_layout() {
        let bytes = greeting();
        assert_eq!(&bytes[..8], b"NBDMAGIC");
        assert_eq!(&bytes[8..16], b"IHAVEOPT");
        assert_eq!(&bytes[16..], &[0, 3]);
    }

    #[test]
    fn parses_requests_and_rejects_bad_magic() {
        let mut bytes = [0u8; REQUEST_HEADER_BYTES];
        bytes[..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes());
        bytes[4..6].copy_from_slice(&CMD_FLAG_FUA.to_be_bytes());
        bytes[6..8].copy_from_slice(&CMD_WRITE.to_be_bytes());
        bytes[8..16].copy_from_slice(&77u64.to_be_bytes());
        bytes[16..24].copy_from_slice(&4096u64.to_be_bytes());
        bytes[24..28].copy_from_slice(&512u32.to_be_bytes());
        let request = parse_request(&bytes).unwrap();
        assert_eq!(
            request,
            Request {
                flags: CMD_FLAG_FUA,
                command: CMD_WRITE,
                cookie: 77,
                offset: 4096,
                length: 512
            }
        );
        bytes[0] ^= 1;
        assert!(matches!(
            parse_request(&bytes),
            Err(ProtocolError::BadMagic(_))
        ));
    }

    #[test]
    fn parses_info_requests() {
        let mut data = Vec::new();
        data.extend_from_slice(&8u32.to_be_bytes());
        data.extend_from_slice(b"tank/vol");
        data.extend_from_slice(&2u16.to_be_bytes());
        data.extend_from_slice(&INFO_BLOCK_SIZE.to_be_bytes());
        data.extend_from_slice(&INFO_NAME.to_be_bytes());
        assert_eq!(
            parse_info_request(&data).unwrap(),
            InfoRequest {
                name: "tank/vol".into(),
                requests: vec![INFO_BLOCK_SIZE, INFO_NAME]
            }
        );
        assert!(parse_info_request(&data[..data.len() - 1]).is_err());
        let mut lying = data.clone();
        lying[3] = 200;
        assert!(parse_info_request(&lying).is_err());
    }

    #[test]
    fn parses_meta_context_requests() {
        let mut data = Vec::new();
        data.extend_from_slice(&3u32.to_be_bytes());
        data.extend_from_slice(b"a/b");
        data.extend_from_slice(&2u32.to_be_bytes());
        data.extend_from_slice(&15u32.to_be_bytes());
        data.extend_from_slice(b"base:allocation");
        data.extend_from_slice(&10u32.to_be_bytes());
        data.extend_from_slice(b"qemu:dirty");
        let parsed = parse_meta_context_request(&data).unwrap();
        assert_eq!(parsed.export, "a/b");
        assert_eq!(
            parsed.queries,
            vec!["base:allocation".to_string(), "qemu:dirty".to_string()]
        );
        assert!(parse_meta_context_request(&data[..data.len() - 2]).is_err());
        let mut extra = data.clone();
        extra.push(0);
        assert!(parse_meta_context_request(&extra).is_err());
    }

    #[test]
    fn flags_per_command() {
        assert_eq!(allowed_flags(CMD_READ, false) & CMD_FLAG_DF, 0);
        assert_ne!(allowed_flags(CMD_READ, true) & CMD_FLAG_DF, 0);
        assert_eq!(allowed_flags(99, true), 0);
    }

    proptest! {
        #[test]
        fn parsers_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = parse_info_request(&bytes);
            let _ = parse_meta_context_request(&bytes);
            if bytes.len() >= REQUEST_HEADER_BYTES {
                let header: [u8; REQUEST_HEADER_BYTES] = bytes[..REQUEST_HEADER_BYTES].try_into().unwrap();
                let _ = parse_request(&header);
            }
            if bytes.len() >= OPTION_HEADER_BYTES {
                let header: [u8; OPTION_HEADER_BYTES] = bytes[..OPTION_HEADER_BYTES].try_into().unwrap();
                let _ = parse_option_header(&header);
            }
        }
    }
}
