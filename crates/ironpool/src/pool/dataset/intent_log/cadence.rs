//! How a dataset's client flushes, and which answers given to it are
//! durable: the cadence that turns on logging ahead of a FLUSH
//! ([`Pool::log_ahead`](crate::pool::Pool::log_ahead), [`Pool::fs_log_ahead`](crate::pool::Pool::fs_log_ahead)), holding a file's direct
//! writes or making them durable first, and lets an `fsync` that finds
//! every answer before it durable commit nothing.

use super::{IntentLog, LOG_AHEAD_STREAK};

/// A dataset's recent FLUSH pattern: WRITEs since the last FLUSH, how many
/// FLUSHes in a row came after exactly one, and how many came at most
/// [`DURABLE_WRITES_FSYNC_GAP_MAX`](super::DURABLE_WRITES_FSYNC_GAP_MAX) writes apart; direct writes in flight.
#[derive(Clone, Copy, Default)]
pub(super) struct Cadence {
    writes_since_flush: u32,
    streak: u32,
    close_streak: u32,
    /// FLUSHes in a row at most [`DURABLE_WRITES_FSYNC_GAP_MAX`](super::DURABLE_WRITES_FSYNC_GAP_MAX) writes
    /// apart, whatever ran beside them (`close_streak` counts only those
    /// after writes in parallel).
    near_streak: u32,
    writes_in_flight: u32,
    /// The most direct writes in flight at once since the last FLUSH.
    peak_in_flight: u32,
}

/// The most a run of close `fsync`s counts ([`Cadence`]): a client that
/// stops calling `fsync` often leaves the mode after three far ones.
const CLOSE_STREAK_MAX: u32 = 4 * LOG_AHEAD_STREAK;

/// A run of close FLUSHes (`streak`) after one that came `gap` writes after
/// the last: unchanged right after another (no write between), one longer
/// when at most `gap_max` writes apart, halved when further.
fn close_streak_after(streak: u32, gap: u32, gap_max: u32) -> u32 {
    match gap {
        0 => streak,
        gap if gap <= gap_max => (streak + 1).min(CLOSE_STREAK_MAX),
        _ => streak / 2,
    }
}

/// Answers a filesystem gave that may rest on changes not yet durable,
/// counted: `answered` counts them (every answer but a WRITE made durable
/// before it was answered and an `fsync`'s; a write written behind counts
/// again once linked), `durable` is the count read by the last commit of
/// every change before it ([`Pool::fs_log_commit`](crate::pool::Pool::fs_log_commit)) as it began.
#[derive(Clone, Copy, Default)]
pub(super) struct Vouched {
    answered: u64,
    durable: u64,
}

impl IntentLog {
    /// Notes a WRITE arriving, for [`Pool::log_ahead`](crate::pool::Pool::log_ahead) and [`Pool::fs_log_ahead`](crate::pool::Pool::fs_log_ahead).
    pub(crate) fn note_write_arrived(&self) {
        let mut cadence = self.cadence.get();
        cadence.writes_since_flush = cadence.writes_since_flush.saturating_add(1);
        self.cadence.set(cadence);
    }

    /// Notes a FLUSH arriving, for [`Pool::log_ahead`](crate::pool::Pool::log_ahead) and [`Pool::fs_log_ahead`](crate::pool::Pool::fs_log_ahead),
    /// and for [`IntentLog::writes_durable_first`] (a run of FLUSHes at most
    /// `gap_max` writes apart).
    pub(crate) fn note_flush_arrived(&self, gap_max: u32) {
        let mut cadence = self.cadence.get();
        cadence.streak = match cadence.writes_since_flush {
            1 => cadence.streak.saturating_add(1),
            _ => 0,
        };
        // A FLUSH right after another (no write between) neither adds to
        // nor ends a run of close ones; one after writes that came one at a
        // time ends it; one after more writes than that halves it, so that
        // a burst (the writes the kernel held back while an `fsync` was
        // out) does not end the mode at once.
        let gap = cadence.writes_since_flush;
        cadence.close_streak = match gap {
            0 => cadence.close_streak,
            _ if cadence.peak_in_flight < 2 => 0,
            _ => close_streak_after(cadence.close_streak, gap, gap_max),
        };
        cadence.near_streak = close_streak_after(cadence.near_streak, gap, gap_max);
        cadence.peak_in_flight = cadence.writes_in_flight;
        cadence.writes_since_flush = 0;
        self.cadence.set(cadence);
    }

    /// Whether the client flushes after every write, and the write just
    /// answered is the only one since its last FLUSH.
    pub(crate) fn flush_expected(&self) -> bool {
        let cadence = self.cadence.get();
        cadence.streak >= LOG_AHEAD_STREAK && cadence.writes_since_flush == 1
    }

    /// Whether the client flushes after every write, and no write came
    /// since its last FLUSH: the write arriving now will be flushed alone.
    pub(crate) fn flushes_after_each_write(&self) -> bool {
        let cadence = self.cadence.get();
        cadence.streak >= LOG_AHEAD_STREAK && cadence.writes_since_flush == 0
    }

    /// Whether the client has flushed often lately ([`LOG_AHEAD_STREAK`]
    /// times in a row, after every single write or at most `gap_max`
    /// writes apart) and has not stopped (no more writes since its last
    /// flush than that): a filesystem's direct writes then go through rather
    /// than being held, so that [`Pool::fs_log_ahead`](crate::pool::Pool::fs_log_ahead) can start each
    /// one's commit as it is answered, or
    /// [`IntentLog::writes_durable_first`] make them durable before they
    /// are answered (a held write left for the `fsync` to write out keeps
    /// the file's other writes out for a write-out and a commit: fio's 16K
    /// random writes at QD64 with `--fsync=32` ran at 20-22k IOPS held,
    /// 24.5-25.3k made durable first).
    pub(crate) fn flushes_often(&self, gap_max: u32) -> bool {
        let cadence = self.cadence.get();
        (cadence.streak >= LOG_AHEAD_STREAK && cadence.writes_since_flush <= 1)
            || (gap_max > 0
                && cadence.near_streak >= LOG_AHEAD_STREAK
                && cadence.writes_since_flush <= gap_max)
    }

    /// Notes a direct write of a filesystem arriving at the front end
    /// (before [`IntentLog::writes_durable_first`] is asked), to be ended by
    /// [`IntentLog::note_direct_write_done`].
    pub(crate) fn note_direct_write_began(&self) {
        let mut cadence = self.cadence.get();
        cadence.writes_in_flight = cadence.writes_in_flight.saturating_add(1);
        cadence.peak_in_flight = cadence.peak_in_flight.max(cadence.writes_in_flight);
        self.cadence.set(cadence);
    }

    /// Ends [`IntentLog::note_direct_write_began`].
    pub(crate) fn note_direct_write_done(&self) {
        let mut cadence = self.cadence.get();
        cadence.writes_in_flight = cadence.writes_in_flight.saturating_sub(1);
        self.cadence.set(cadence);
    }

    /// Whether a filesystem's direct write arriving now is to be made
    /// durable before it is answered: its client's `fsync`s have come at
    /// most `gap_max` writes apart lately (the pool's tunable
    /// `fs_durable_writes_fsync_gap`, 0: never), each
    /// after writes in parallel (a lone writer, QD1, would pay one commit
    /// per write where its `fsync` pays one for all of them), and no more
    /// than that many writes came since the last.
    pub(crate) fn writes_durable_first(&self, gap_max: u32) -> bool {
        let cadence = self.cadence.get();
        gap_max > 0
            && cadence.close_streak >= LOG_AHEAD_STREAK
            && cadence.writes_since_flush <= gap_max
    }

    /// Notes an answer given to a filesystem's client that may rest on
    /// changes not yet durable (any answer but a write made durable first
    /// and an `fsync`'s), or a write written behind now linked: the next
    /// `fsync` commits (see [`IntentLog::answers_durable`]). Called after
    /// the request's changes were noted in the log, before it is answered.
    pub(crate) fn note_answer_unsure(&self) {
        let mut vouched = self.vouched.get();
        vouched.answered += 1;
        self.vouched.set(vouched);
    }

    /// What a commit of every change so far reads as it begins, to give
    /// [`IntentLog::note_answers_durable`] once it succeeded.
    pub(crate) fn answers_so_far(&self) -> u64 {
        self.vouched.get().answered
    }

    /// A commit that began when [`IntentLog::answers_so_far`] was
    /// `answered` made every change before it durable.
    pub(crate) fn note_answers_durable(&self, answered: u64) {
        let mut vouched = self.vouched.get();
        debug_assert!(answered <= vouched.answered, "answers counted back");
        vouched.durable = vouched.durable.max(answered);
        self.vouched.set(vouched);
    }

    /// Whether every answer the client was given rests on durable changes
    /// only: each one that might not (see [`IntentLog::note_answer_unsure`])
    /// is covered by a commit that succeeded, the others being writes
    /// answered only once durable. An `fsync` arriving then has nothing to
    /// commit: what it must make durable is what was answered before it.
    pub(crate) fn answers_durable(&self) -> bool {
        let vouched = self.vouched.get();
        vouched.answered <= vouched.durable
    }
}
