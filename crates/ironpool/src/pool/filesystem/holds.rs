//! Who holds a filesystem's objects besides their names: the handles each
//! mount session has open (FUSE OPEN/CREATE to RELEASE) and the nodes each
//! session's kernel remembers (FUSE's lookup count: every entry reply gives
//! one, FORGET takes them back).
//!
//! An object whose last name goes while anything holds it lives on, with no
//! links, until the last hold lets go (`Filesystem::free_if_orphan`). Holds
//! are kept per session because one filesystem may have two at once: a
//! mount moved (`set mountpoint`) or unmounted and mounted again while a
//! file stays open on the old one keeps the old session alive beside the
//! new. When one session ends, only its own holds go; the objects the other
//! still holds stay.

use std::cell::{Cell, RefCell};

use rustc_hash::FxHashMap;

/// One mount session of a filesystem (a FUSE connection), for the holds it
/// takes. The default one (0) stands for a single mount where no session
/// was begun (the simulator's filesystems).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct SessionId(u64);

/// What one session holds: counts per object.
#[derive(Default)]
struct SessionHolds {
    open: FxHashMap<u64, u64>,
    kernel: FxHashMap<u64, u64>,
}

/// Which kind of hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Hold {
    /// An open handle.
    Open,
    /// A node the kernel remembers.
    Kernel,
}

/// The holds of every live session of one filesystem. Sessions are few (a
/// mount, and for a while the one it replaced), so a question about one
/// object asks each.
#[derive(Default)]
pub(super) struct Holds {
    /// The next session's number (0 is the default session).
    next: Cell<u64>,
    sessions: RefCell<FxHashMap<SessionId, SessionHolds>>,
}

impl Holds {
    /// A new session, holding nothing yet.
    pub(super) fn begin(&self) -> SessionId {
        let number = self.next.get() + 1;
        self.next.set(number);
        let session = SessionId(number);
        self.sessions
            .borrow_mut()
            .insert(session, SessionHolds::default());
        session
    }

    /// Whether any session holds object `ino`.
    pub(super) fn is_held(&self, ino: u64) -> bool {
        self.sessions
            .borrow()
            .values()
            .any(|holds| holds.open.contains_key(&ino) || holds.kernel.contains_key(&ino))
    }

    /// `session` takes one more hold of `kind` on `ino`.
    pub(super) fn take(&self, session: SessionId, kind: Hold, ino: u64) {
        let mut sessions = self.sessions.borrow_mut();
        let holds = sessions.entry(session).or_default();
        let counts = match kind {
            Hold::Open => &mut holds.open,
            Hold::Kernel => &mut holds.kernel,
        };
        *counts.entry(ino).or_default() += 1;
    }

    /// `session` lets go of `count` holds of `kind` on `ino`; true when
    /// that was its last one of the kind (the object may be free to go
    /// now, if no other hold is left), false when some are left or there
    /// were none.
    pub(super) fn let_go(&self, session: SessionId, kind: Hold, ino: u64, count: u64) -> bool {
        let mut sessions = self.sessions.borrow_mut();
        let Some(holds) = sessions.get_mut(&session) else {
            return false;
        };
        let counts = match kind {
            Hold::Open => &mut holds.open,
            Hold::Kernel => &mut holds.kernel,
        };
        let Some(held) = counts.get_mut(&ino) else {
            return false;
        };
        *held = held.saturating_sub(count);
        if *held > 0 {
            return false;
        }
        counts.remove(&ino);
        true
    }

    /// `session` ended: every hold it had goes, the other sessions' stay.
    pub(super) fn end(&self, session: SessionId) {
        self.sessions.borrow_mut().remove(&session);
    }

    /// Objects `session` holds (open or remembered): for tests and
    /// statistics.
    #[cfg(test)]
    fn held_by(&self, session: SessionId) -> usize {
        self.sessions.borrow().get(&session).map_or(0, |holds| {
            holds
                .open
                .keys()
                .chain(holds.kernel.keys())
                .collect::<rustc_hash::FxHashSet<_>>()
                .len()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One session's end lets go of its own holds only: an object the
    /// other session holds stays held (a mount moved while a file stayed
    /// open on the old one freed the new mount's files).
    #[test]
    fn a_session_ending_keeps_the_other_sessions_holds() {
        let holds = Holds::default();
        let old = holds.begin();
        let new = holds.begin();
        assert_ne!(old, new);
        holds.take(old, Hold::Open, 7);
        holds.take(new, Hold::Open, 8);
        holds.take(new, Hold::Kernel, 9);
        holds.take(old, Hold::Kernel, 9);
        holds.end(old);
        assert!(!holds.is_held(7));
        assert!(holds.is_held(8) && holds.is_held(9));
        assert_eq!(holds.held_by(new), 2);
        // A let-go counts down this session's holds only.
        holds.take(new, Hold::Open, 8);
        assert!(!holds.let_go(new, Hold::Open, 8, 1));
        assert!(holds.let_go(new, Hold::Open, 8, 1));
        assert!(!holds.is_held(8));
        assert!(
            !holds.let_go(old, Hold::Kernel, 9, 1),
            "ended: holds nothing"
        );
        assert!(holds.let_go(new, Hold::Kernel, 9, 5));
        assert!(!holds.is_held(9));
    }
}
