//! CPU work off the engine thread: compression and decompression of
//! blocks, and the sealing and opening of an encrypted dataset's large
//! blocks and batches.
//!
//! The engine thread runs every I/O of the pool; a 128 KiB zstd compression on it
//! would hold up every other request for a millisecond. Work handed to
//! [`run`] goes to a small pool of worker threads instead, and the task that
//! asked waits for it like it waits for a device: the engine keeps submitting
//! and completing other I/O meanwhile, and several blocks compress in parallel.
//!
//! Under the simulator the work runs inline, so a seed still fixes every step.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::task::{Context, Poll, Waker};

/// Worker threads at most: compression and the sealing and opening of
/// encrypted blocks are the users, and past four threads the engine thread
/// (one core) is the limit anyway.
pub const OFFLOAD_THREADS_MAX: usize = 4;
/// Jobs waiting for a worker at most. Past this the caller does the work
/// itself: a full queue means the workers are saturated, and running inline is
/// the backpressure that keeps memory bounded.
pub const OFFLOAD_QUEUE_MAX: usize = 1024;

type Job = Box<dyn FnOnce() + Send>;

struct Workers {
    queue: Mutex<VecDeque<Job>>,
    ready: Condvar,
    /// Worker threads that started: with none, every job runs inline
    /// (a job queued would wait forever, and dropping its future would
    /// block the engine).
    started: std::sync::atomic::AtomicUsize,
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A job that panicked on a worker leaves the queue itself consistent.
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn workers() -> &'static Workers {
    static WORKERS: OnceLock<&'static Workers> = OnceLock::new();
    WORKERS.get_or_init(|| {
        let workers: &'static Workers = Box::leak(Box::new(Workers {
            queue: Mutex::new(VecDeque::new()),
            ready: Condvar::new(),
            started: std::sync::atomic::AtomicUsize::new(0),
        }));
        let count = std::thread::available_parallelism()
            .map(usize::from)
            .unwrap_or(1)
            .clamp(1, OFFLOAD_THREADS_MAX);
        for index in 0..count {
            let spawned = std::thread::Builder::new()
                .name(format!("ironpool-cpu-{index}"))
                .spawn(move || loop {
                    let job = {
                        let mut queue = lock(&workers.queue);
                        loop {
                            if let Some(job) = queue.pop_front() {
                                break job;
                            }
                            queue = workers
                                .ready
                                .wait(queue)
                                .unwrap_or_else(|poisoned| poisoned.into_inner());
                        }
                    };
                    job();
                });
            // Without a worker, jobs would wait forever: fall back to none (every
            // job then runs inline, see `run`).
            if spawned.is_err() {
                break;
            }
            workers
                .started
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        workers
    })
}

struct Slot<T> {
    state: Mutex<SlotState<T>>,
    finished: Condvar,
}

struct SlotState<T> {
    result: Option<std::thread::Result<T>>,
    done: bool,
    waker: Option<Waker>,
}

/// The result of work handed to a worker.
///
/// Dropping it before the work is done waits for the work to finish: the work may
/// read memory the dropping task owns (see [`run_borrowing`]).
pub struct Offloaded<T> {
    slot: Option<Arc<Slot<T>>>,
    inline: Option<T>,
    /// Whether dropping it waits for the work: work that owns everything it
    /// touches (see [`run_apart`]) need not be waited for.
    wait_on_drop: bool,
}

// The result is only moved, never pinned in place.
impl<T> Unpin for Offloaded<T> {}

impl<T> Future for Offloaded<T> {
    type Output = T;
    fn poll(mut self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<T> {
        let this = &mut *self;
        if let Some(value) = this.inline.take() {
            return Poll::Ready(value);
        }
        let slot = this.slot.as_ref().expect("polled after completion");
        let mut state = lock(&slot.state);
        if state.done {
            let result = state.result.take().expect("a finished job has a result");
            drop(state);
            this.slot = None;
            return match result {
                Ok(value) => Poll::Ready(value),
                Err(panic) => std::panic::resume_unwind(panic),
            };
        }
        crate::rt::register_waker(&mut state.waker, context.waker());
        Poll::Pending
    }
}

impl<T> Drop for Offloaded<T> {
    fn drop(&mut self) {
        if !self.wait_on_drop {
            return;
        }
        if let Some(slot) = self.slot.take() {
            let mut state = lock(&slot.state);
            while !state.done {
                state = slot
                    .finished
                    .wait(state)
                    .unwrap_or_else(|poisoned| poisoned.into_inner());
            }
        }
    }
}

/// A slot for the result of one job, and the job that runs `work` into it.
fn job_with_slot<T: Send + 'static>(
    work: impl FnOnce() -> T + Send + 'static,
) -> (Arc<Slot<T>>, Job) {
    let slot = Arc::new(Slot {
        state: Mutex::new(SlotState {
            result: None,
            done: false,
            waker: None,
        }),
        finished: Condvar::new(),
    });
    let job_slot = slot.clone();
    let job: Job = Box::new(move || {
        // A panic in the work is caught here (the worker lives on) and raised
        // again in the task that waits for it.
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(work));
        let mut state = lock(&job_slot.state);
        state.result = Some(result);
        state.done = true;
        let waker = state.waker.take();
        drop(state);
        job_slot.finished.notify_all();
        if let Some(waker) = waker {
            waker.wake();
        }
    });
    (slot, job)
}

/// Runs `work` on a worker thread (inline under the simulator, when the
/// workers are saturated, or when none could be started) and resolves to
/// its result.
pub fn run<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> Offloaded<T> {
    if super::is_simulated() {
        return Offloaded {
            slot: None,
            inline: Some(work()),
            wait_on_drop: true,
        };
    }
    let workers = workers();
    let (slot, job) = job_with_slot(work);
    let mut queue = lock(&workers.queue);
    let none_started = workers.started.load(std::sync::atomic::Ordering::Relaxed) == 0;
    if queue.len() >= OFFLOAD_QUEUE_MAX || none_started {
        drop(queue);
        // Saturated, or no worker: do it here (the job fills the slot
        // synchronously).
        job();
        let result = lock(&slot.state)
            .result
            .take()
            .expect("an inline job has a result");
        return match result {
            Ok(value) => Offloaded {
                slot: None,
                inline: Some(value),
                wait_on_drop: true,
            },
            Err(panic) => std::panic::resume_unwind(panic),
        };
    }
    queue.push_back(job);
    drop(queue);
    workers.ready.notify_one();
    Offloaded {
        slot: Some(slot),
        inline: None,
        wait_on_drop: true,
    }
}

/// Runs `work` on a thread of its own, never on the engine thread: for
/// system calls that may wait for this very engine, such as a `mount(2)`,
/// `mkdir` or `stat` of a path inside one of its own FUSE mounts (a
/// nested filesystem's mountpoint), which would deadlock inline. They are
/// rare (administrative), so a thread each costs nothing that matters; an
/// error spawning it is the work's error. Dropping the result does not wait.
pub fn run_apart<T: Send + 'static>(
    work: impl FnOnce() -> std::io::Result<T> + Send + 'static,
) -> Offloaded<std::io::Result<T>> {
    let (slot, job) = job_with_slot(work);
    let spawned = std::thread::Builder::new()
        .name("ironpool-apart".into())
        .spawn(job);
    match spawned {
        Ok(_) => Offloaded {
            slot: Some(slot),
            inline: None,
            wait_on_drop: false,
        },
        Err(error) => Offloaded {
            slot: None,
            inline: Some(Err(error)),
            wait_on_drop: false,
        },
    }
}

/// A byte range handed to a worker by address, for work over a buffer the
/// engine keeps (a client's write, a block just read) without copying it.
#[derive(Clone, Copy)]
pub struct Borrowed {
    pointer: usize,
    length: usize,
}

impl Borrowed {
    /// The bytes.
    ///
    /// # Safety
    /// Only inside a job of [`run_borrowing`] that received it: the memory is
    /// alive and unchanged until that job finishes.
    pub unsafe fn bytes(&self) -> &[u8] {
        // SAFETY: the caller of run_borrowing guarantees the range outlives the job.
        unsafe { std::slice::from_raw_parts(self.pointer as *const u8, self.length) }
    }
}

/// Like [`run`], for work that reads `bytes` in place.
///
/// # Safety
/// `bytes` must stay alive and unmodified until the returned future completes or
/// is dropped (dropping waits for the work), and the future must not be leaked
/// (`mem::forget`) while the work may still run.
pub unsafe fn run_borrowing<T: Send + 'static>(
    bytes: &[u8],
    work: impl FnOnce(Borrowed) -> T + Send + 'static,
) -> Offloaded<T> {
    let borrowed = Borrowed {
        pointer: bytes.as_ptr() as usize,
        length: bytes.len(),
    };
    run(move || work(borrowed))
}

/// Like [`run_borrowing`], for work that reads several byte ranges in
/// place (a batch of blocks), each handed over as a [`Borrowed`] in order:
/// one handoff for the batch, whose cost (a worker's wakeup and the
/// engine's) a single small block would not repay.
///
/// # Safety
/// As [`run_borrowing`], for every range of `ranges`.
pub unsafe fn run_borrowing_many<T: Send + 'static>(
    ranges: &[&[u8]],
    work: impl FnOnce(Vec<Borrowed>) -> T + Send + 'static,
) -> Offloaded<T> {
    let borrowed: Vec<Borrowed> = ranges
        .iter()
        .map(|bytes| Borrowed {
            pointer: bytes.as_ptr() as usize,
            length: bytes.len(),
        })
        .collect();
    run(move || work(borrowed))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rt::Runtime;

    #[test]
    fn work_runs_on_workers_and_wakes_the_task() {
        let runtime = Runtime::new_uring(64).unwrap();
        let engine = std::thread::current().id();
        let results = runtime.block_on(async move {
            let jobs: Vec<_> = (0..64u64)
                .map(|value| run(move || (value * value, std::thread::current().id())))
                .collect();
            futures_util::future::join_all(jobs).await
        });
        for (value, (square, thread)) in results.into_iter().enumerate() {
            assert_eq!(square, (value * value) as u64);
            assert_ne!(thread, engine, "work ran on the engine thread");
        }
    }

    #[test]
    fn borrowed_bytes_are_read_in_place() {
        let runtime = Runtime::new_uring(64).unwrap();
        let data = vec![7u8; 1 << 20];
        let sum = runtime.block_on(async {
            // SAFETY: `data` outlives the awaited future.
            unsafe {
                run_borrowing(&data, |bytes| {
                    bytes.bytes().iter().map(|byte| *byte as u64).sum::<u64>()
                })
            }
            .await
        });
        assert_eq!(sum, 7 << 20);
    }

    #[test]
    fn several_borrowed_ranges_are_read_in_place_in_order() {
        let runtime = Runtime::new_uring(64).unwrap();
        let (one, two) = (vec![1u8; 4096], vec![2u8; 8192]);
        let sums = runtime.block_on(async {
            // SAFETY: both vectors outlive the awaited future.
            unsafe {
                run_borrowing_many(&[&one, &two], |ranges| {
                    ranges
                        .iter()
                        .map(|range| range.bytes().iter().map(|byte| *byte as u64).sum::<u64>())
                        .collect::<Vec<_>>()
                })
            }
            .await
        });
        assert_eq!(sums, vec![4096, 16384]);
    }

    #[test]
    fn dropping_the_future_waits_for_the_work() {
        let runtime = Runtime::new_uring(64).unwrap();
        let finished = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = finished.clone();
        runtime.block_on(async move {
            let pending = run(move || {
                std::thread::sleep(std::time::Duration::from_millis(50));
                flag.store(true, std::sync::atomic::Ordering::SeqCst);
            });
            drop(pending);
        });
        assert!(finished.load(std::sync::atomic::Ordering::SeqCst));
    }

    #[test]
    fn runs_inline_under_the_simulator() {
        let runtime = Runtime::new_sim(1);
        let engine = std::thread::current().id();
        let thread = runtime.block_on(async { run(|| std::thread::current().id()).await });
        assert_eq!(thread, engine);
    }
}
