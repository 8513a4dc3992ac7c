//! Target `fuse_request`: the FUSE request decoder (`fuse::proto::header` and
//! `request`), fed what one read of `/dev/fuse` returns, as `fuse::reader`
//! does.
//!
//! Input: one request. It is decoded as given and, since random bytes almost
//! never carry their own length in the header, again with the header's length
//! set to the input's, so that mutated bodies reach every opcode's decoding.
//!
//! Properties: a header is accepted exactly when the input holds one and its
//! length is the input's; names carry no NUL; a decoded request re-encodes
//! (`encode_request`, below, the kernel's layout) to bytes that decode to the
//! same request.

use ironpool::fuse::proto::*;

pub fn check(data: &[u8]) {
    check_as_given(data);
    if data.len() >= IN_HEADER_BYTES {
        let mut sealed = data.to_vec();
        sealed[..4].copy_from_slice(&(data.len() as u32).to_le_bytes());
        check_as_given(&sealed);
    }
}

fn check_as_given(data: &[u8]) {
    let header = match header(data) {
        Ok(header) => header,
        Err(_) => {
            let whole = data.len() >= IN_HEADER_BYTES
                && u32::from_le_bytes(data[..4].try_into().expect("4 bytes")) as usize == data.len();
            assert!(!whole, "a whole request's header refused");
            return;
        }
    };
    assert_eq!(header.len as usize, data.len());
    check_apart(data);
    let Ok(decoded) = request(&header, data) else { return };
    for name in names(&decoded) {
        assert!(!name.contains(&0), "a name with a NUL: {decoded:?}");
    }
    let bytes = encode_request(&header, &decoded);
    let again_header = ironpool::fuse::proto::header(&bytes).expect("re-encoded header decodes");
    assert_eq!(again_header, InHeader { len: bytes.len() as u32, ..header });
    let again = request(&again_header, &bytes).expect("re-encoded request decodes");
    assert_eq!(again, decoded, "request does not round trip");
}

/// A request read in two pieces, a WRITE's headers and its payload apart
/// (as `fuse::reader` reads one after a WRITE of the same size), decodes
/// as the same request read whole, or is refused as it is whole.
fn check_apart(data: &[u8]) {
    if data.len() < WRITE_HEADERS_BYTES {
        assert_eq!(write_payload_size(data), None);
        return;
    }
    let (head, payload) = data.split_at(WRITE_HEADERS_BYTES);
    let Some(size) = write_payload_size(head) else { return };
    assert_eq!(size, payload.len(), "a write's payload size is the rest of it");
    let header = header_apart(head, payload.len()).expect("a whole write's header apart");
    assert_eq!(header, ironpool::fuse::proto::header(data).expect("its header whole"));
    match (write_apart(&header, head, payload), request(&header, data)) {
        (Ok(apart), Ok(whole)) => assert_eq!(apart, whole, "a write apart decodes differently"),
        (Err(_), Err(_)) => {}
        (apart, whole) => panic!("apart {apart:?}, whole {whole:?}"),
    }
}

/// Every name a request carries.
fn names<'a>(request: &Request<'a>) -> Vec<&'a [u8]> {
    match *request {
        Request::Lookup { name }
        | Request::Unlink { name }
        | Request::Rmdir { name }
        | Request::Mknod { name, .. }
        | Request::Mkdir { name, .. }
        | Request::Link { name, .. }
        | Request::Create { name, .. }
        | Request::Setxattr { name, .. }
        | Request::Getxattr { name, .. }
        | Request::Removexattr { name } => vec![name],
        Request::Symlink { name, target } => vec![name, target],
        Request::Rename { name, new_name, .. } => vec![name, new_name],
        _ => Vec::new(),
    }
}

fn u32s(out: &mut Vec<u8>, values: &[u32]) {
    values.iter().for_each(|value| out.extend_from_slice(&value.to_le_bytes()));
}

fn u64s(out: &mut Vec<u8>, values: &[u64]) {
    values.iter().for_each(|value| out.extend_from_slice(&value.to_le_bytes()));
}

fn c_str(out: &mut Vec<u8>, name: &[u8]) {
    out.extend_from_slice(name);
    out.push(0);
}

/// A request as the kernel lays it out (`include/uapi/linux/fuse.h`): the
/// header's opcode picks the layout (RENAME or RENAME2, FORGET or
/// BATCH_FORGET); fields the decoder does not keep are zero.
pub fn encode_request(header: &InHeader, request: &Request) -> Vec<u8> {
    let mut body = Vec::new();
    match *request {
        Request::Init { major, minor, max_readahead, flags } => u32s(&mut body, &[major, minor, max_readahead, flags]),
        Request::Lookup { name } | Request::Unlink { name } | Request::Rmdir { name } | Request::Removexattr { name } => {
            c_str(&mut body, name)
        }
        Request::Setattr(change) => {
            // valid, padding, fh, size, lock_owner, atime, mtime, ctime,
            // atimensec, mtimensec, ctimensec, mode, unused, uid, gid, unused.
            u32s(&mut body, &[change.valid, 0]);
            u64s(&mut body, &[0, change.size, 0, change.atime.0, change.mtime.0, change.ctime.0]);
            u32s(&mut body, &[change.atime.1, change.mtime.1, change.ctime.1, change.mode, 0, change.uid, change.gid, 0]);
        }
        Request::Symlink { name, target } => {
            c_str(&mut body, name);
            c_str(&mut body, target);
        }
        Request::Mknod { name, mode, rdev, umask } => {
            u32s(&mut body, &[mode, rdev, umask, 0]);
            c_str(&mut body, name);
        }
        Request::Mkdir { name, mode, umask } => {
            u32s(&mut body, &[mode, umask]);
            c_str(&mut body, name);
        }
        Request::Rename { new_dir, name, new_name, flags } => {
            u64s(&mut body, &[new_dir]);
            if header.opcode == RENAME2 {
                u32s(&mut body, &[flags, 0]);
            }
            c_str(&mut body, name);
            c_str(&mut body, new_name);
        }
        Request::Link { old_node, name } => {
            u64s(&mut body, &[old_node]);
            c_str(&mut body, name);
        }
        Request::Open { flags } => u32s(&mut body, &[flags, 0]),
        Request::Create { name, flags, mode, umask } => {
            u32s(&mut body, &[flags, mode, umask, 0]);
            c_str(&mut body, name);
        }
        // The kernel names the file; the decoder does not keep the name.
        Request::Tmpfile { flags, mode, umask } => {
            u32s(&mut body, &[flags, mode, umask, 0]);
            c_str(&mut body, b"tmpfile");
        }
        Request::Read { fh, offset, size, flags } => {
            // fh, offset, size, read_flags, lock_owner, flags, padding.
            u64s(&mut body, &[fh, offset]);
            u32s(&mut body, &[size, 0]);
            u64s(&mut body, &[0]);
            u32s(&mut body, &[flags, 0]);
        }
        Request::Write { fh, offset, write_flags, flags, data } => {
            // fh, offset, size, write_flags, lock_owner, flags, padding.
            u64s(&mut body, &[fh, offset]);
            u32s(&mut body, &[data.len() as u32, write_flags]);
            u64s(&mut body, &[0]);
            u32s(&mut body, &[flags, 0]);
            body.extend_from_slice(data);
        }
        Request::Fsync { datasync } => {
            u64s(&mut body, &[0]);
            u32s(&mut body, &[u32::from(datasync), 0]);
        }
        // READDIR and READDIRPLUS share `fuse_read_in`; the opcode tells.
        Request::Readdir { offset, size, .. } => {
            u64s(&mut body, &[0, offset]);
            u32s(&mut body, &[size, 0]);
            u64s(&mut body, &[0]);
            u32s(&mut body, &[0, 0]);
        }
        Request::Fallocate { offset, length, mode } => {
            u64s(&mut body, &[0, offset, length]);
            u32s(&mut body, &[mode, 0]);
        }
        Request::Lseek { offset, whence } => {
            u64s(&mut body, &[0, offset]);
            u32s(&mut body, &[whence, 0]);
        }
        // fh_in, off_in, nodeid_out, fh_out, off_out, len, flags.
        Request::CopyFileRange { offset_in, node_out, offset_out, length, flags } => {
            u64s(&mut body, &[0, offset_in, node_out, 0, offset_out, length, flags])
        }
        Request::Ioctl { flags, cmd, out_size, data } => {
            // fh, flags, cmd, arg, in_size, out_size; then the argument.
            u64s(&mut body, &[0]);
            u32s(&mut body, &[flags, cmd]);
            u64s(&mut body, &[0]);
            u32s(&mut body, &[data.len() as u32, out_size]);
            body.extend_from_slice(data);
        }
        Request::Access { mask } => u32s(&mut body, &[mask, 0]),
        // getattr_flags, reserved, fh, sx_flags, sx_mask: none kept.
        Request::Statx => body.extend_from_slice(&[0; 24]),
        Request::Setxattr { name, value, flags } => {
            u32s(&mut body, &[value.len() as u32, flags]);
            c_str(&mut body, name);
            body.extend_from_slice(value);
        }
        Request::Getxattr { name, size } => {
            u32s(&mut body, &[size, 0]);
            c_str(&mut body, name);
        }
        Request::Listxattr { size } => u32s(&mut body, &[size, 0]),
        // FORGET: the node is the header's, its count the body; BATCH_FORGET:
        // a count, then each node and count.
        Request::Forget(ref nodes) if header.opcode == FORGET => u64s(&mut body, &[nodes[0].1]),
        Request::Forget(ref nodes) => {
            u32s(&mut body, &[nodes.len() as u32, 0]);
            for &(node, count) in nodes {
                u64s(&mut body, &[node, count]);
            }
        }
        Request::Destroy
        | Request::Getattr
        | Request::Readlink
        | Request::Statfs
        | Request::Release
        | Request::Flush
        | Request::Opendir
        | Request::Releasedir
        | Request::Fsyncdir
        | Request::Interrupt
        | Request::Unsupported(_) => {}
    }
    let mut out = Vec::with_capacity(IN_HEADER_BYTES + body.len());
    u32s(&mut out, &[(IN_HEADER_BYTES + body.len()) as u32, header.opcode]);
    u64s(&mut out, &[header.unique, header.nodeid]);
    u32s(&mut out, &[header.uid, header.gid, header.pid, 0]);
    out.extend_from_slice(&body);
    out
}
