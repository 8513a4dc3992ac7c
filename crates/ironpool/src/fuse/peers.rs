//! Mount sessions of one filesystem alive at the same time, and what each
//! tells the others' kernels.
//!
//! A filesystem has two sessions at once when its mount moves (`set
//! mountpoint`) or is unmounted and mounted again while a file stays open
//! on the old mount: the old session lives until that file is closed.
//! Each kernel caches names, absent names and attributes for a day
//! (`ATTR_VALID_SECONDS`), which holds only while every change goes
//! through that kernel. So a change made through one session is told to
//! the kernels of the others: the entries it changed (`FUSE_NOTIFY_INVAL_
//! ENTRY`) and the nodes whose attributes or data it changed
//! (`FUSE_NOTIFY_INVAL_INODE`). While another session is alive, replies
//! give the kernel nothing to cache (`valid_seconds`), so these
//! notifications cover what was cached before. With one session (the usual
//! case) nothing is sent and nothing is looked up.
//!
//! The notifications go after the request's reply, from a task of their
//! own, each written by an io_uring worker thread, not the loop: the other
//! kernel takes the directory's lock (an entry) or the file's page locks (a
//! node) to apply one, and may hold them while it waits for a reply of this
//! server, so a request that waited for its notifications before replying,
//! or a loop that wrote one itself, would wait for itself through the other
//! mount.

use std::cell::RefCell;
use std::rc::{Rc, Weak};

use super::proto::{self, Request};
use super::Session;
use crate::pool::filesystem::Filesystem;
use crate::rt::uring as rt_uring;

thread_local! {
    /// The sessions served by this engine thread (every mount's): few, a
    /// mount per filesystem and for a while the ones they replaced.
    static SESSIONS: RefCell<Vec<Weak<Session>>> = const { RefCell::new(Vec::new()) };
}

/// Counts `session` among the live ones (a mount started).
pub(super) fn register(session: &Rc<Session>) {
    SESSIONS.with(|sessions| {
        let mut sessions = sessions.borrow_mut();
        sessions.retain(|weak| weak.strong_count() > 0);
        sessions.push(Rc::downgrade(session));
    });
}

/// `session` ended: the others no longer tell it anything.
pub(super) fn unregister(session: &Session) {
    SESSIONS.with(|sessions| {
        sessions.borrow_mut().retain(|weak| {
            weak.upgrade()
                .is_some_and(|live| !std::ptr::eq(&*live, session))
        });
    });
}

/// Whether `other` is another live session of `session`'s filesystem.
fn is_peer(session: &Session, other: &Session) -> bool {
    !std::ptr::eq(other, session) && Rc::ptr_eq(&other.fs, &session.fs) && !other.ended.get()
}

/// Whether `session` is its filesystem's only live session (asked for
/// every reply: nothing is collected).
pub(super) fn alone(session: &Session) -> bool {
    SESSIONS.with(|sessions| {
        !sessions
            .borrow()
            .iter()
            .filter_map(Weak::upgrade)
            .any(|other| is_peer(session, &other))
    })
}

/// The other live sessions of `session`'s filesystem.
pub(super) fn of(session: &Session) -> Vec<Rc<Session>> {
    SESSIONS.with(|sessions| {
        sessions
            .borrow()
            .iter()
            .filter_map(Weak::upgrade)
            .filter(|other| is_peer(session, other))
            .collect()
    })
}

/// What a request left stale in another kernel's cache.
pub(super) enum Stale {
    /// A node's attributes or data.
    Node(u64),
    /// A name in a directory (there now, or gone).
    Entry(u64, Vec<u8>),
}

/// What `request` to node `node` of `fs` (the head, not a snapshot) will
/// leave stale in other kernels, if it succeeds. A removal or a rename
/// over a name looks up the node it takes the name from first (its link
/// count changes).
pub(super) async fn stale_after(fs: &Filesystem, node: u64, request: &Request<'_>) -> Vec<Stale> {
    match *request {
        Request::Setattr(_)
        | Request::Write { .. }
        | Request::Fallocate { .. }
        | Request::Ioctl { .. }
        | Request::Setxattr { .. }
        | Request::Removexattr { .. } => vec![Stale::Node(node)],
        // (The source is only read.)
        Request::CopyFileRange { node_out, .. } => {
            vec![Stale::Node(super::snapdir::split(node_out).1)]
        }
        Request::Symlink { name, .. }
        | Request::Mknod { name, .. }
        | Request::Mkdir { name, .. }
        | Request::Create { name, .. } => {
            vec![Stale::Entry(node, name.to_vec()), Stale::Node(node)]
        }
        Request::Link { old_node, name } => vec![
            Stale::Entry(node, name.to_vec()),
            Stale::Node(node),
            Stale::Node(crate::fuse::snapdir::split(old_node).1),
        ],
        Request::Unlink { name } | Request::Rmdir { name } => {
            let mut stale = vec![Stale::Entry(node, name.to_vec()), Stale::Node(node)];
            stale.extend(named(fs, node, name).await);
            stale
        }
        Request::Rename {
            new_dir,
            name,
            new_name,
            ..
        } => {
            let new_dir = crate::fuse::snapdir::split(new_dir).1;
            let mut stale = vec![
                Stale::Entry(node, name.to_vec()),
                Stale::Entry(new_dir, new_name.to_vec()),
                Stale::Node(node),
                Stale::Node(new_dir),
            ];
            stale.extend(named(fs, node, name).await);
            stale.extend(named(fs, new_dir, new_name).await);
            stale
        }
        _ => Vec::new(),
    }
}

/// The node `name` in `parent` names now, as something other kernels may
/// cache the attributes of.
async fn named(fs: &Filesystem, parent: u64, name: &[u8]) -> Option<Stale> {
    let attr = fs.lookup(parent, name).await.ok()?;
    Some(Stale::Node(attr.ino))
}

/// Tells each of `peers` what `stale` says changed, in a task of its own
/// (see the module's comment on why not before the reply). A node or
/// directory a kernel does not know (`ENOENT`) had nothing cached. A peer
/// whose session ended meanwhile is skipped: its device is closed once no
/// task holds its session (the session owns it), so no write can reach a
/// descriptor number reused since.
pub(super) fn tell(peers: Vec<Rc<Session>>, stale: Vec<Stale>) {
    crate::rt::spawn(async move {
        for peer in &peers {
            tell_one(peer, &stale).await;
        }
    });
}

async fn tell_one(peer: &Session, stale: &[Stale]) {
    for what in stale {
        if peer.ended.get() {
            return;
        }
        let bytes = match what {
            Stale::Node(node) => proto::notify_inval_inode(*node),
            Stale::Entry(parent, name) => proto::notify_inval_entry(*parent, name),
        };
        let pieces = vec![rt_uring::WriteBytes::Owned(bytes)];
        if let Err(error) = rt_uring::writev_bytes_from_worker(peer.fd, pieces).await {
            if error.raw_os_error() != Some(libc::ENOENT) {
                eprintln!("ironpool: {}: fuse notification: {error}", peer.fs.name());
            }
        }
    }
}
