//! What a commit does to a log's state: the chain it writes into, the
//! commits it opens and ends, the changes it takes and gives back, and the
//! counters it keeps. The commits themselves (`pool::datasets::intent_log`)
//! act on volumes and filesystems and sit in a room above; they change
//! the log's state only through these methods, so the rules of the chain
//! (one commit at a time takes its place in it, in the order opened; a
//! chain restarts only when empty) are kept here, beside the state.

use super::{CommitWait, FileChanges, InFlight, IntentLog, LogStats};
use crate::format::intent_log::LogPointer;

impl IntentLog {
    /// Starts a new chain named `guid` at `head` (its first block, sequence
    /// 1), usable once txg `txg`, which names it in the directory, is
    /// durable.
    pub(in crate::pool) fn begin_chain(&self, guid: u64, head: LogPointer, txg: u64) {
        let mut state = self.state.borrow_mut();
        // (Commits in flight in an abandoned chain end in failure.)
        assert!(state.written.is_empty(), "a chain restarts only when empty");
        state.chain_guid = guid;
        state.next = Some((1, head));
        state.head_txg = txg;
    }

    /// Whether the log has a chain at all (a dataset without one starts it
    /// at its first commit).
    pub(in crate::pool) fn has_chain(&self) -> bool {
        self.state.borrow().next.is_some()
    }

    /// The chain's guid and the next block a commit writes, when the txg
    /// naming the chain's head is `durable` or older (a commit written
    /// into a chain whose head is not durable would be found by no replay).
    pub(in crate::pool) fn usable_next(&self, durable: u64) -> Option<(u64, (u64, LogPointer))> {
        let state = self.state.borrow();
        match state.next {
            Some(next) if state.head_txg <= durable => Some((state.chain_guid, next)),
            _ => None,
        }
    }

    /// The guid of the chain commits write into now.
    pub(in crate::pool) fn chain_guid(&self) -> u64 {
        self.state.borrow().chain_guid
    }

    /// Opens the next commit: from here until its blocks are freed, the
    /// txg its changes need is kept with it ([`CommitWait`]).
    pub(in crate::pool) fn open_commit(&self) -> u64 {
        let mut state = self.state.borrow_mut();
        state.next_commit += 1;
        let commit = state.next_commit;
        state.commits.insert(commit, CommitWait::default());
        commit
    }

    /// Raises the txg commit `commit` needs durable before its blocks can
    /// be freed to `txg`.
    pub(in crate::pool) fn commit_needs_txg(&self, commit: u64, txg: u64) {
        if let Some(wait) = self.state.borrow_mut().commits.get_mut(&commit) {
            wait.max_txg = wait.max_txg.max(txg);
        }
    }

    /// Notes that commit `commit` copies the held blocks `copies`, as
    /// ((object, block number), version): each is its block's live copy
    /// until a newer change is linked, and the commit's blocks are kept
    /// until they are linked.
    pub(in crate::pool) fn note_copies(
        &self,
        commit: u64,
        copies: impl IntoIterator<Item = ((u64, u64), u64)>,
    ) {
        let mut state = self.state.borrow_mut();
        let mut count = 0;
        for (key, version) in copies {
            state
                .live_copies
                .entry(key)
                .or_default()
                .push((commit, version));
            count += 1;
        }
        let copies = count;
        if let Some(wait) = state.commits.get_mut(&commit) {
            wait.copies_pending += copies;
        }
    }

    /// Forgets commit `commit`, which will not be written (it gave its
    /// changes back, or had none).
    pub(in crate::pool) fn drop_commit(&self, commit: u64) {
        self.state.borrow_mut().forget_commit(commit);
    }

    /// Forgets commit `commit`, which had nothing to write, and returns
    /// the last commit in flight before it (the one it shares) and the
    /// count of failed commits so far (to tell whether that one failed).
    pub(in crate::pool) fn drop_empty_commit(&self, commit: u64) -> (Option<u64>, u64) {
        let mut state = self.state.borrow_mut();
        state.commits.remove(&commit);
        (
            state.in_flight.back().map(|entry| entry.commit),
            state.failed_commits,
        )
    }

    /// How many commits failed since the log was opened.
    pub(in crate::pool) fn failed_commits(&self) -> u64 {
        self.state.borrow().failed_commits
    }

    /// The commit at the front of those in flight (the one whose turn it
    /// is to end).
    pub(in crate::pool) fn front_in_flight(&self) -> Option<u64> {
        self.state
            .borrow()
            .in_flight
            .front()
            .map(|entry| entry.commit)
    }

    /// Commit `commit` takes its place in chain `guid` with `blocks` (in
    /// chain order), and `next` becomes the block the next commit writes.
    /// Commits take their place in the order they were opened (both under
    /// the commit lock): `wait_ended` and the order of answers count on it.
    pub(in crate::pool) fn enter_chain(
        &self,
        commit: u64,
        guid: u64,
        blocks: Vec<(u64, LogPointer)>,
        next: (u64, LogPointer),
    ) {
        let mut state = self.state.borrow_mut();
        assert!(
            state
                .in_flight
                .back()
                .is_none_or(|last| last.commit < commit),
            "commit {commit} reserved in the chain after a later one"
        );
        assert_eq!(
            guid, state.chain_guid,
            "commit {commit} reserved in a chain that is not the log's"
        );
        assert!(
            next.0 > blocks.last().map_or(0, |(seq, _)| *seq),
            "commit {commit}: the next block does not follow its blocks"
        );
        state.next = Some(next);
        state.in_flight.push_back(InFlight {
            commit,
            chain_guid: guid,
            blocks,
        });
    }

    /// Takes every block change noted since the last commit (object,
    /// block, txg linked), for a commit to log.
    pub(in crate::pool) fn take_unlogged(&self) -> Vec<(u64, u64, u64)> {
        std::mem::take(&mut self.state.borrow_mut().unlogged)
    }

    /// Puts changes taken for a commit that did not happen back in front
    /// of those noted since, in txg order (commits after it in flight may
    /// have failed and given theirs back first).
    pub(in crate::pool) fn requeue_unlogged(&self, taken: &[(u64, u64, u64)]) {
        let mut state = self.state.borrow_mut();
        let newer = std::mem::take(&mut state.unlogged);
        state.unlogged = taken.iter().copied().chain(newer).collect();
        // Stable: of one txg, the order linked stays.
        state.unlogged.sort_by_key(|(_, _, txg)| *txg);
    }

    /// Takes what a filesystem's commit logs: the block changes, the
    /// files' changes noted since the last commit, and the count of
    /// reshapes so far (a commit that finds it moved gives them back).
    pub(in crate::pool) fn take_file_changes(&self) -> (Vec<(u64, u64, u64)>, FileChanges, u64) {
        let mut state = self.state.borrow_mut();
        state.small_write_bytes = 0;
        state.xattr_bytes = 0;
        let taken = FileChanges {
            attrs: std::mem::take(&mut state.attrs),
            small_writes: std::mem::take(&mut state.small_writes),
            objects: std::mem::take(&mut state.objects),
            entries: std::mem::take(&mut state.entries),
            xattrs: std::mem::take(&mut state.xattrs),
        };
        (std::mem::take(&mut state.unlogged), taken, state.reshapes)
    }

    /// Whether a file's block grew or a file was freed since `reshapes`
    /// was read, or a change the log does not carry came after `durable`:
    /// a commit's records may then not fit what it took.
    pub(in crate::pool) fn moved_since(&self, reshapes: u64, durable: u64) -> bool {
        self.state.borrow().reshapes != reshapes || self.unloggable_after(durable)
    }

    /// Whether a change the log does not carry was made after `durable`:
    /// commits go through a txg until it is durable.
    pub(in crate::pool) fn unloggable_after(&self, durable: u64) -> bool {
        self.state.borrow().unloggable_since > durable
    }

    /// Whether the chain (its next block, blocks written, commits in
    /// flight) has a block on top-level vdev `vdev`.
    pub(in crate::pool) fn uses_vdev(&self, vdev: u32) -> bool {
        let state = self.state.borrow();
        state
            .next
            .is_some_and(|(_, pointer)| pointer.dva.vdev == vdev)
            || state
                .written
                .iter()
                .any(|(_, pointer, _)| pointer.dva.vdev == vdev)
            || state.in_flight.iter().any(|entry| {
                entry
                    .blocks
                    .iter()
                    .any(|(_, pointer)| pointer.dva.vdev == vdev)
            })
    }

    /// Forgets the whole chain and the commits' bookkeeping, and returns
    /// its blocks (written ones and the next) to be freed.
    pub(in crate::pool) fn abandon_chain(&self) -> Vec<LogPointer> {
        let mut state = self.state.borrow_mut();
        let mut blocks: Vec<LogPointer> = state
            .written
            .drain(..)
            .map(|(_, pointer, _)| pointer)
            .collect();
        state.commits.clear();
        state.live_copies.clear();
        state.pending_cancels.clear();
        state.cancelled.clear();
        blocks.extend(state.next.take().map(|(_, pointer)| pointer));
        blocks
    }

    /// Counts into the log's statistics (`iostat --json`).
    pub(in crate::pool) fn count(&self, change: impl FnOnce(&mut LogStats)) {
        change(&mut self.state.borrow_mut().stats);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A link of a file's held version cancels the live copy of its block
    /// only when that copy holds an older version: a copy of the version
    /// linked holds the tree's bytes, and a copy of a newer one holds bytes
    /// the tree does not have yet (replay must apply it). Any other link
    /// (a write through) cancels it.
    #[test]
    fn a_link_cancels_only_copies_of_older_versions() {
        let log = IntentLog::default();
        let commit = log.open_commit();
        log.note_copies(commit, [((7, 3), 5), ((7, 4), 5)]);
        log.note_version_linked(7, 3, 5, 10);
        log.note_version_linked(7, 4, 4, 10);
        assert!(log.state.borrow().pending_cancels.is_empty());
        log.note_version_linked(7, 4, 6, 11);
        log.note_superseded(7, 3, 12);
        // Each copy is cancelled once, from the txg of the link.
        log.note_superseded(7, 4, 13);
        assert_eq!(
            log.state.borrow().pending_cancels,
            vec![(11, commit, (7, 4)), (12, commit, (7, 3))]
        );
        // The commit is told of both links before its blocks can go.
        assert_eq!(log.state.borrow().commits[&commit].copies_pending, 2);
    }

    /// An older copy of a block stays known when a newer commit that
    /// copied the block is given up (never written): it is the block's
    /// last record in the chain again, and a newer link must cancel it.
    #[test]
    fn a_copy_under_a_commit_given_up_is_still_cancelled() {
        let log = IntentLog::default();
        let older = log.open_commit();
        log.note_copies(older, [((9, 1), 5)]);
        let newer = log.open_commit();
        log.note_copies(newer, [((9, 1), 6)]);
        log.drop_commit(newer);
        log.note_version_linked(9, 1, 7, 20);
        assert_eq!(
            log.state.borrow().pending_cancels,
            vec![(20, older, (9, 1))]
        );
    }
}
