//! The `.zfs` directory at a filesystem's root, as OpenZFS shows it with
//! `snapdir=hidden`: found by name, not listed. `.zfs/snapshot` lists the
//! filesystem's snapshots, and `.zfs/snapshot/NAME/` is snapshot NAME,
//! read-only (writes get `EROFS`, links and renames out of it `EXDEV`).
//! As in OpenZFS, root's `mkdir .zfs/snapshot/NAME` takes snapshot NAME and
//! `rmdir` destroys it (as `ironpool snapshot` and `destroy` would).
//!
//! FUSE names every inode by a 64-bit node id, and a snapshot's objects
//! have the numbers of the head's. So node ids carry a slot in their top
//! 16 bits: 0 for the head (its object numbers stay below
//! [`OBJECTS_MAX`]), a per-mount number for each snapshot looked up
//! (given at its first lookup, kept with the snapshot's guid so a
//! destroyed snapshot, or another made under its name, is told apart:
//! `ESTALE`), and [`CONTROL_SLOT`] for the two directories themselves.

use std::rc::Rc;

use super::{proto, Session};
use crate::format::znode::S_IFDIR;
use crate::pool::filesystem::{Attr, Filesystem, FsError, OBJECTS_MAX, ROOT_OBJECT};
use crate::pool::PoolError;

/// Bits of a node id below the slot.
const SLOT_SHIFT: u32 = OBJECTS_MAX.trailing_zeros();
/// The slot of `.zfs` and `.zfs/snapshot`.
const CONTROL_SLOT: u64 = 0xFFFF;
/// `.zfs`.
pub(super) const ZFS_DIR: u64 = (CONTROL_SLOT << SLOT_SHIFT) | 1;
/// `.zfs/snapshot`.
const SNAPSHOT_DIR: u64 = (CONTROL_SLOT << SLOT_SHIFT) | 2;
/// Snapshots one mount gives slots to (every slot but 0 and the control
/// one); past that, lookups of new ones fail with `ENOSPC` until the
/// filesystem is mounted again.
const SLOTS_MAX: usize = (CONTROL_SLOT - 1) as usize;
/// How long the kernel may cache what the control directories hold (names,
/// absent names, attributes): a snapshot made or destroyed shows within a
/// second. A snapshot's own contents never change, and are cached as the
/// head's are.
const CONTROL_VALID_SECONDS: u64 = 1;
/// The name of the control directory in the root.
pub(super) const CONTROL_NAME: &[u8] = b".zfs";
/// `d_type` of a directory in a listing.
const DT_DIR: u8 = 4;

/// The snapshots a mount gave slots to: slot `index + 1` is entry `index`,
/// a snapshot's name and guid.
pub(super) type Slots = Vec<(String, u64)>;

/// What a node id names.
pub(super) enum Route {
    /// Object `ino` of `fs` (the head, or a snapshot's in slot `slot`).
    Fs {
        fs: Rc<Filesystem>,
        ino: u64,
        slot: u64,
    },
    /// `.zfs` or `.zfs/snapshot`.
    Control(u64),
}

/// The node id of object `ino` of the filesystem in slot `slot`.
pub(super) fn node_id(slot: u64, ino: u64) -> u64 {
    (slot << SLOT_SHIFT) | ino
}

/// The slot and the object number of node id `node`.
pub(super) fn split(node: u64) -> (u64, u64) {
    (node >> SLOT_SHIFT, node & (OBJECTS_MAX - 1))
}

/// Which filesystem and object node id `node` names.
pub(super) async fn route(session: &Session, node: u64) -> Result<Route, FsError> {
    let (slot, ino) = split(node);
    if slot == 0 {
        return Ok(Route::Fs {
            fs: session.fs.clone(),
            ino,
            slot,
        });
    }
    if slot == CONTROL_SLOT {
        return Ok(Route::Control(node));
    }
    let (name, guid) = session
        .snapshot_slots
        .borrow()
        .get(slot as usize - 1)
        .cloned()
        .ok_or(FsError::Stale)?;
    let fs = snapshot(session, &name, Some(guid)).await?;
    Ok(Route::Fs { fs, ino, slot })
}

/// The snapshots of the mounted filesystem, oldest first: names and guids.
fn snapshots(session: &Session) -> Vec<(String, u64)> {
    let pool = &session.pool;
    let short = session.fs.short_name();
    pool.directory()
        .lineage(&short)
        .map(|lineage| {
            lineage
                .snapshots
                .iter()
                .map(|snapshot| (snapshot.name.clone(), snapshot.guid))
                .collect()
        })
        .unwrap_or_default()
}

/// Snapshot `name` of the mounted filesystem, opened read-only; with
/// `guid`, only if it is still that snapshot.
async fn snapshot(
    session: &Session,
    name: &str,
    guid: Option<u64>,
) -> Result<Rc<Filesystem>, FsError> {
    let found = snapshots(session)
        .into_iter()
        .find(|(existing, _)| existing == name);
    match (found, guid) {
        (None, None) => return Err(FsError::NotFound),
        (None, Some(_)) => return Err(FsError::Stale),
        (Some((_, current)), Some(guid)) if current != guid => return Err(FsError::Stale),
        _ => {}
    }
    let full = format!("{}@{name}", session.fs.name());
    Ok(session.pool.snapshot_filesystem(&full).await?)
}

/// The slot of snapshot `name` (`guid`), given now if it has none.
fn slot_of(session: &Session, name: &str, guid: u64) -> Result<u64, FsError> {
    let mut slots = session.snapshot_slots.borrow_mut();
    if let Some(index) = slots.iter().position(|(_, existing)| *existing == guid) {
        return Ok(index as u64 + 1);
    }
    if slots.len() >= SLOTS_MAX {
        return Err(FsError::NoSpace);
    }
    slots.push((name.to_string(), guid));
    Ok(slots.len() as u64)
}

/// The attributes of a control directory: the root's times, read-only.
async fn control_attr(session: &Session, node: u64) -> Result<Attr, FsError> {
    let mut attr = session.fs.getattr(session.fs.root()).await?;
    attr.ino = node;
    attr.size = 2 + if node == ZFS_DIR {
        1
    } else {
        snapshots(session).len() as u64
    };
    attr.blocks = 0;
    attr.znode.mode = S_IFDIR | 0o555;
    attr.znode.nlink = 2;
    attr.znode.uid = 0;
    attr.znode.gid = 0;
    Ok(attr)
}

/// The entry of a control directory.
pub(super) async fn control_entry(session: &Session, node: u64) -> Result<Vec<u8>, FsError> {
    let attr = control_attr(session, node).await?;
    Ok(proto::entry_out(
        &super::to_fuse(&attr),
        0,
        CONTROL_VALID_SECONDS,
    ))
}

/// The entry of snapshot `name` (`guid`) in `.zfs/snapshot`: its root.
async fn snapshot_entry(session: &Session, name: &str, guid: u64) -> Result<Vec<u8>, FsError> {
    let fs = snapshot(session, name, Some(guid)).await?;
    let slot = slot_of(session, name, guid)?;
    let mut attr = fs.getattr(fs.root()).await?;
    attr.ino = node_id(slot, attr.ino);
    Ok(proto::entry_out(
        &super::to_fuse(&attr),
        attr.znode.generation,
        CONTROL_VALID_SECONDS,
    ))
}

/// The guid of snapshot `name` of the mounted filesystem, if it has one.
fn guid_of(session: &Session, name: &str) -> Option<u64> {
    snapshots(session)
        .into_iter()
        .find(|(existing, _)| existing == name)
        .map(|(_, guid)| guid)
}

/// Serves a request to `.zfs` or `.zfs/snapshot`.
pub(super) async fn serve(
    session: &Session,
    header: &proto::InHeader,
    node: u64,
    request: proto::Request<'_>,
) -> Result<Vec<u8>, FsError> {
    use proto::Request;
    let full = |name: &[u8]| -> Result<String, FsError> {
        let name = std::str::from_utf8(name)
            .map_err(|_| FsError::Invalid("a snapshot name is UTF-8".into()))?;
        Ok(format!("{}@{name}", session.fs.name()))
    };
    match request {
        // Root only, as the administrator's commands are.
        Request::Mkdir { .. } | Request::Rmdir { .. }
            if node == SNAPSHOT_DIR && header.uid != 0 =>
        {
            Err(FsError::NotPermitted(
                "only root takes or destroys snapshots".into(),
            ))
        }
        Request::Mkdir { name, .. } if node == SNAPSHOT_DIR => {
            let full = full(name)?;
            session
                .pool
                .snapshot(&[full])
                .await
                .map_err(|error| match error {
                    PoolError::VolumeExists(_) => FsError::Exists,
                    PoolError::InvalidName(name) => {
                        FsError::Invalid(format!("snapshot name {name}"))
                    }
                    error => error.into(),
                })?;
            let name = std::str::from_utf8(name).unwrap_or_default();
            let guid = guid_of(session, name).ok_or(FsError::NotFound)?;
            snapshot_entry(session, name, guid).await
        }
        Request::Rmdir { name } if node == SNAPSHOT_DIR => {
            let full = full(name)?;
            session
                .pool
                .destroy_snapshot(&full)
                .await
                .map_err(|error| match error {
                    PoolError::NoSuchSnapshot(_) => FsError::NotFound,
                    // Clones, or a send in flight, keep it.
                    PoolError::InvalidArgument(why) => FsError::NotPermitted(why),
                    error => error.into(),
                })?;
            Ok(Vec::new())
        }
        Request::Lookup { name } => {
            let name = std::str::from_utf8(name).map_err(|_| FsError::NotFound);
            match (node, name) {
                (_, Ok(".")) => control_entry(session, node).await,
                (ZFS_DIR, Ok("snapshot")) => control_entry(session, SNAPSHOT_DIR).await,
                (SNAPSHOT_DIR, Ok(name)) => match guid_of(session, name) {
                    Some(guid) => snapshot_entry(session, name, guid).await,
                    None => Ok(proto::negative_entry_out(CONTROL_VALID_SECONDS)),
                },
                _ => Ok(proto::negative_entry_out(CONTROL_VALID_SECONDS)),
            }
        }
        Request::Getattr => Ok(proto::attr_out(
            &super::to_fuse(&control_attr(session, node).await?),
            CONTROL_VALID_SECONDS,
        )),
        // (ENOSYS here would turn STATX off for the whole mount.)
        Request::Statx => Ok(proto::statx_out(
            &super::to_fuse(&control_attr(session, node).await?),
            CONTROL_VALID_SECONDS,
        )),
        Request::Opendir => Ok(proto::open_out(0, 0)),
        // READDIRPLUS here gives no node (a zero entry): the kernel takes
        // these entries as a plain listing and looks names up itself.
        Request::Readdir { offset, size, plus } => {
            let limit = (size as usize).min(super::READDIR_BYTES_MAX);
            let mut names: Vec<(u64, Vec<u8>)> =
                vec![(node, b".".to_vec()), (session.fs.root(), b"..".to_vec())];
            if node == ZFS_DIR {
                names.push((SNAPSHOT_DIR, b"snapshot".to_vec()));
            } else {
                for (name, guid) in snapshots(session) {
                    let slot = slot_of(session, &name, guid)?;
                    names.push((node_id(slot, ROOT_OBJECT), name.into_bytes()));
                }
            }
            let mut out = Vec::with_capacity(limit);
            let none = proto::negative_entry_out(0);
            for (index, (ino, name)) in names.iter().enumerate().skip(offset as usize) {
                let next = index as u64 + 1;
                let pushed = if plus {
                    proto::push_direntplus(&mut out, limit, &none, *ino, next, DT_DIR, name)
                } else {
                    proto::push_dirent(&mut out, limit, *ino, next, DT_DIR, name)
                };
                if !pushed {
                    break;
                }
            }
            Ok(out)
        }
        Request::Statfs => super::statfs(session),
        Request::Releasedir
        | Request::Release
        | Request::Access { .. }
        | Request::Forget(_)
        | Request::Interrupt => Ok(Vec::new()),
        Request::Flush => Err(FsError::NotSupported),
        Request::Getxattr { .. } => Err(FsError::NoAttribute),
        Request::Listxattr { size } => super::sized(Vec::new(), size),
        _ => Err(FsError::ReadOnly),
    }
}
