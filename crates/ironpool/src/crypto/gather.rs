//! Opens of sealed blocks read in one round, gathered into one handoff to
//! a worker (a large block alone is enough for one).
//!
//! A 16 KiB block opens in about 5 us on this project's test machine
//! (AES-256-GCM, about 3.4 GB/s), less than a handoff to a worker and back
//! costs the engine (about 9 us). But a 1 MiB read of 16 KiB blocks opens
//! 64 of them, and a deep queue of reads completes many in one round of
//! the engine's loop. So each open waits for the end of
//! the round ([`crate::rt::spawn_at_round_end`]); the opens of that round
//! then go to a worker together when they add up to
//! [`CRYPT_OFFLOAD_MIN_BYTES`], else run on the engine as before.
//! How many wait is bounded by the reads in flight (each read holds one).

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::Arc;

use aws_lc_rs::aead::LessSafeKey;

use super::{open_into_with, CryptoError, Sealed, CRYPT_OFFLOAD_MIN_BYTES};
use crate::rt::buf::{AlignedBuf, BufSlice};
use crate::rt::sync::{oneshot, OneshotSender};

/// What an open gives back: the plaintext buffer, and whether the MAC held.
type Opened = (AlignedBuf, Result<(), CryptoError>);

struct PendingOpen {
    key: Arc<LessSafeKey>,
    sealed: Sealed,
    aad: [u8; 27],
    /// The block as read: kept alive by the batch until it is opened.
    ciphertext: BufSlice,
    plaintext: AlignedBuf,
    reply: OneshotSender<Opened>,
}

/// The opens waiting for the end of the round (one per block store).
#[derive(Default)]
pub struct OpenGather {
    state: Rc<GatherState>,
}

#[derive(Default)]
struct GatherState {
    pending: RefCell<Vec<PendingOpen>>,
    /// A flush is spawned for the round's end.
    scheduled: Cell<bool>,
}

impl OpenGather {
    /// Opens `ciphertext` (as long as `plaintext`) under `key`, the block
    /// key of `sealed`'s salt, with `aad`, at the end of this round with
    /// the other opens of the round. Returns the plaintext buffer, and
    /// [`CryptoError::Authentication`] when the MAC fails.
    pub async fn open(
        &self,
        key: Arc<LessSafeKey>,
        sealed: Sealed,
        aad: [u8; 27],
        ciphertext: BufSlice,
        plaintext: AlignedBuf,
    ) -> Opened {
        if plaintext.len() < ciphertext.len() {
            return (plaintext, Err(CryptoError::Malformed("plaintext length")));
        }
        let (reply, answer) = oneshot();
        self.state.pending.borrow_mut().push(PendingOpen {
            key,
            sealed,
            aad,
            ciphertext,
            plaintext,
            reply,
        });
        if !self.state.scheduled.replace(true) {
            let mut unstarted = Unstarted(Some(self.state.clone()));
            crate::rt::spawn_at_round_end(async move {
                let state = unstarted.0.take().expect("the flush starts once");
                state.scheduled.set(false);
                let batch = std::mem::take(&mut *state.pending.borrow_mut());
                flush(batch).await;
            });
        }
        // None: the flush was dropped with its runtime's tasks before it
        // opened this block.
        answer.await.unwrap_or_else(|| {
            (
                AlignedBuf::for_overwrite(0),
                Err(CryptoError::Malformed(
                    "open abandoned: its flush was dropped",
                )),
            )
        })
    }
}

/// Held by a flush until it starts: a flush dropped before that (its
/// runtime's tasks dropped) lets the next open schedule another, and drops
/// the opens it would have answered (their waiters get None).
struct Unstarted(Option<Rc<GatherState>>);

impl Drop for Unstarted {
    fn drop(&mut self) {
        if let Some(state) = self.0.take() {
            state.scheduled.set(false);
            drop(std::mem::take(&mut *state.pending.borrow_mut()));
        }
    }
}

/// Opens `batch`: on a worker in one handoff when it is large enough,
/// else here; answers each.
async fn flush(batch: Vec<PendingOpen>) {
    let total: usize = batch.iter().map(|open| open.ciphertext.len()).sum();
    if total < CRYPT_OFFLOAD_MIN_BYTES {
        for mut open in batch {
            let size = open.ciphertext.len();
            let result = open_into_with(
                &open.key,
                &open.sealed,
                &open.aad,
                &open.ciphertext,
                &mut open.plaintext[..size],
            );
            open.reply.send((open.plaintext, result));
        }
        return;
    }
    let mut jobs = Vec::with_capacity(batch.len());
    let mut replies = Vec::with_capacity(batch.len());
    let mut ciphertexts = Vec::with_capacity(batch.len());
    for open in batch {
        jobs.push((open.key, open.sealed, open.aad, open.plaintext));
        replies.push(open.reply);
        ciphertexts.push(open.ciphertext);
    }
    let ranges: Vec<&[u8]> = ciphertexts.iter().map(|slice| &slice[..]).collect();
    // SAFETY: `ciphertexts` holds every range and lives until the awaited
    // future completes (dropping it waits for the work).
    let opened = unsafe {
        crate::rt::offload::run_borrowing_many(&ranges, move |ranges| {
            jobs.into_iter()
                .zip(ranges)
                .map(|((key, sealed, aad, mut plaintext), range)| {
                    // Inside the job that received the range.
                    let ciphertext = range.bytes();
                    let result = open_into_with(
                        &key,
                        &sealed,
                        &aad,
                        ciphertext,
                        &mut plaintext[..ciphertext.len()],
                    );
                    (plaintext, result)
                })
                .collect::<Vec<Opened>>()
        })
    }
    .await;
    drop(ciphertexts);
    for (reply, opened) in replies.into_iter().zip(opened) {
        reply.send(opened);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crypto::{block_aad, DatasetKey, MasterKey, Suite};
    use crate::format::bp::Compression;
    use crate::format::ObjectType;
    use crate::rt::Runtime;

    /// Blocks sealed under `key`: each block's bytes, its sealing, and
    /// its stored bytes.
    fn sealed_blocks(key: &DatasetKey, count: usize) -> Vec<(Vec<u8>, Sealed, BufSlice)> {
        (0..count)
            .map(|index| {
                let plaintext: Vec<u8> = (0..16384).map(|at| (at * 7 + index) as u8).collect();
                let mut stored = AlignedBuf::for_overwrite(plaintext.len());
                let sealed = key
                    .seal_into(&aad(), &plaintext, &mut stored)
                    .expect("sealed");
                (plaintext, sealed, BufSlice::whole(stored.into_shared()))
            })
            .collect()
    }

    fn aad() -> [u8; 27] {
        block_aad(ObjectType::VolumeData, 0, Compression::Off, 16384, 16384)
    }

    /// Opens that come in one round go together (on a worker, as eight
    /// 16 KiB blocks add up to 128 KiB), each answered with its own block;
    /// one whose bytes were altered fails its MAC alone. A round with one
    /// open opens it on the engine, with the same answer.
    #[test]
    fn opens_of_one_round_are_each_answered_and_a_forged_one_fails_alone() {
        let runtime = Runtime::new_uring(64).unwrap();
        runtime.block_on(async {
            let key = DatasetKey::new(MasterKey::generate(Suite::Aes256Gcm).unwrap());
            let mut blocks = sealed_blocks(&key, 8);
            let mut forged = blocks[5].2.to_vec();
            forged[100] ^= 1;
            blocks[5].2 = BufSlice::whole(AlignedBuf::copy_from(&forged).into_shared());
            let gather = OpenGather::default();
            let opens = blocks.iter().map(|(_, sealed, stored)| {
                let block_key = key.opening_key(sealed.salt).unwrap();
                gather.open(
                    block_key,
                    *sealed,
                    aad(),
                    stored.clone(),
                    AlignedBuf::for_overwrite(stored.len()),
                )
            });
            let opened = futures_util::future::join_all(opens).await;
            for (index, ((plaintext, _, _), (buffer, result))) in
                blocks.iter().zip(opened).enumerate()
            {
                match index {
                    5 => assert!(matches!(result, Err(CryptoError::Authentication))),
                    _ => {
                        result.unwrap();
                        assert_eq!(&buffer[..], &plaintext[..], "block {index}");
                    }
                }
            }
            let (plaintext, sealed, stored) = &sealed_blocks(&key, 1)[0];
            let (buffer, result) = gather
                .open(
                    key.opening_key(sealed.salt).unwrap(),
                    *sealed,
                    aad(),
                    stored.clone(),
                    AlignedBuf::for_overwrite(stored.len()),
                )
                .await;
            result.unwrap();
            assert_eq!(&buffer[..], &plaintext[..]);
        });
    }
}
