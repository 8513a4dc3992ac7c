//! Locks of a file's blocks for reads and writes.

use std::cell::RefCell;

use rustc_hash::{FxHashMap, FxHashSet};

use crate::rt::sync::Notify;

/// Locks of data operations on files: a read or write locks the blocks it
/// touches, so that operations on different blocks of one file run at once
/// (a queue depth of 64 on one file reaches the devices); growing a file's
/// first block locks the whole file.
#[derive(Default)]
pub(super) struct FileLocks {
    files: RefCell<FxHashMap<u64, FileLockState>>,
    released: Notify,
}

#[derive(Default)]
struct FileLockState {
    whole: bool,
    blocks: FxHashSet<u64>,
}

/// What a [`FileLocks`] guard holds: blocks of a file, or all of it.
enum Held {
    Blocks(std::ops::RangeInclusive<u64>),
    Whole,
}

pub(super) struct FileGuard<'a> {
    locks: &'a FileLocks,
    ino: u64,
    held: Held,
}

impl FileLocks {
    /// Locks blocks `blocks` of file `ino`, waiting for those held.
    pub(super) async fn blocks(
        &self,
        ino: u64,
        blocks: std::ops::RangeInclusive<u64>,
    ) -> FileGuard<'_> {
        loop {
            let released = self.released.notified();
            {
                let mut files = self.files.borrow_mut();
                let state = files.entry(ino).or_default();
                if !state.whole && !blocks.clone().any(|blkid| state.blocks.contains(&blkid)) {
                    state.blocks.extend(blocks.clone());
                    return FileGuard {
                        locks: self,
                        ino,
                        held: Held::Blocks(blocks),
                    };
                }
            }
            released.await;
        }
    }

    /// Locks all of file `ino`, once nothing of it is held.
    pub(super) async fn whole(&self, ino: u64) -> FileGuard<'_> {
        loop {
            let released = self.released.notified();
            {
                let mut files = self.files.borrow_mut();
                let state = files.entry(ino).or_default();
                if !state.whole && state.blocks.is_empty() {
                    state.whole = true;
                    return FileGuard {
                        locks: self,
                        ino,
                        held: Held::Whole,
                    };
                }
            }
            released.await;
        }
    }
}

impl Drop for FileGuard<'_> {
    fn drop(&mut self) {
        let mut files = self.locks.files.borrow_mut();
        if let Some(state) = files.get_mut(&self.ino) {
            match &self.held {
                Held::Whole => state.whole = false,
                Held::Blocks(blocks) => {
                    for blkid in blocks.clone() {
                        state.blocks.remove(&blkid);
                    }
                }
            }
            if !state.whole && state.blocks.is_empty() {
                files.remove(&self.ino);
            }
        }
        drop(files);
        self.locks.released.notify_all();
    }
}
