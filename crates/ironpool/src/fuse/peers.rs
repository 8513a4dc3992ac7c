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
//! (`FUSE_NOTIFY_INVAL_INODE`). With one session (the usual case) nothing
//! is sent and nothing is looked up.

use std::cell::RefCell;
use std::rc::{Rc, Weak};

use super::proto::{self, Request};
use super::Session;
use crate::pool::filesystem::Filesystem;
use crate::rt::buf::{AlignedBuf, BufSlice};
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

/// The other live sessions of `session`'s filesystem.
pub(super) fn of(session: &Session) -> Vec<Rc<Session>> {
    SESSIONS.with(|sessions| {
        sessions
            .borrow()
            .iter()
            .filter_map(Weak::upgrade)
            .filter(|other| {
                !std::ptr::eq(&**other, session)
                    && Rc::ptr_eq(&other.fs, &session.fs)
                    && !other.ended.get()
            })
            .collect()
    })
}

/// What a request left stale in another kernel's cache.
pub(super) enum Stale<'a> {
    /// A node's attributes or data.
    Node(u64),
    /// A name in a directory (there now, or gone).
    Entry(u64, &'a [u8]),
}

/// What `request` to node `node` of `fs` (the head, not a snapshot) will
/// leave stale in other kernels, if it succeeds. A removal or a rename
/// over a name looks up the node it takes the name from first (its link
/// count changes).
pub(super) async fn stale_after<'a>(
    fs: &Filesystem,
    node: u64,
    request: &Request<'a>,
) -> Vec<Stale<'a>> {
    match *request {
        Request::Setattr(_)
        | Request::Write { .. }
        | Request::Setxattr { .. }
        | Request::Removexattr { .. } => vec![Stale::Node(node)],
        Request::Symlink { name, .. }
        | Request::Mknod { name, .. }
        | Request::Mkdir { name, .. }
        | Request::Create { name, .. } => vec![Stale::Entry(node, name), Stale::Node(node)],
        Request::Link { old_node, name } => vec![
            Stale::Entry(node, name),
            Stale::Node(node),
            Stale::Node(crate::fuse::snapdir::split(old_node).1),
        ],
        Request::Unlink { name } | Request::Rmdir { name } => {
            let mut stale = vec![Stale::Entry(node, name), Stale::Node(node)];
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
                Stale::Entry(node, name),
                Stale::Entry(new_dir, new_name),
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
async fn named<'a>(fs: &Filesystem, parent: u64, name: &[u8]) -> Option<Stale<'a>> {
    let attr = fs.lookup(parent, name).await.ok()?;
    Some(Stale::Node(attr.ino))
}

/// Tells each of `peers` what `stale` says changed. A node or directory a
/// kernel does not know (`ENOENT`) had nothing cached.
pub(super) async fn tell(peers: &[Rc<Session>], stale: &[Stale<'_>]) {
    for peer in peers {
        for what in stale {
            let bytes = match what {
                Stale::Node(node) => proto::notify_inval_inode(*node),
                Stale::Entry(parent, name) => proto::notify_inval_entry(*parent, name),
            };
            let bytes = BufSlice::whole(AlignedBuf::copy_from(&bytes).into_shared());
            if let Err(error) = rt_uring::writev_at(peer.fd, vec![bytes], u64::MAX).await {
                if error.raw_os_error() != Some(libc::ENOENT) {
                    eprintln!("ironpool: {}: fuse notification: {error}", peer.fs.name);
                }
            }
        }
    }
}
