//! The runtime: a single-threaded executor over one of two drivers.
//!
//! - [`uring`]: the real driver, a completion-based io_uring core. Every device and
//!   socket operation is a pre-allocated in-flight record whose index is the
//!   `user_data`; one submit per loop turn; completions wake tasks, which run from
//!   the loop.
//! - [`sim`]: a deterministic simulated clock. Timers (and the simulated devices,
//!   which are timers plus memory) fire in virtual time, in an order fixed by the
//!   seed, so a whole engine run replays exactly.
//!
//! No thread ever blocks on a device: the only blocking call is the driver's wait
//! for the next completion when no task can run.

pub mod buf;
pub mod channel;
pub mod executor;
pub mod offload;
pub mod sim;
pub mod sync;
pub mod uring;

use std::cell::RefCell;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

pub use executor::JoinHandle;
use executor::{Executor, JoinState};

/// A point in the runtime's clock, in nanoseconds since the runtime started.
/// Virtual under the simulator.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Instant(pub u64);

impl Instant {
    /// Time elapsed from `earlier` to `self` (zero if `earlier` is later).
    pub fn duration_since(self, earlier: Instant) -> Duration {
        Duration::from_nanos(self.0.saturating_sub(earlier.0))
    }

    /// The instant `duration` after this one (saturating at the end of time).
    pub fn saturating_add(self, duration: Duration) -> Instant {
        Instant(
            self.0
                .saturating_add(duration.as_nanos().min(u64::MAX as u128) as u64),
        )
    }
}

// One driver per thread, never moved: the size difference costs nothing.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Driver {
    Uring(uring::UringDriver),
    Sim(sim::SimDriver),
}

pub(crate) struct RuntimeInner {
    pub(crate) executor: Executor,
    pub(crate) driver: Driver,
}

thread_local! {
    static CURRENT: RefCell<Option<Rc<RuntimeInner>>> = const { RefCell::new(None) };
}

/// Runs `f` with the runtime of this thread.
///
/// Panics when called outside [`Runtime::block_on`]: engine code only runs inside
/// a runtime, so this is a programming error, not an operating condition.
pub(crate) fn with_current<R>(f: impl FnOnce(&RuntimeInner) -> R) -> R {
    CURRENT.with(|current| {
        let current = current.borrow();
        let inner = current
            .as_ref()
            .expect("ironpool runtime function called outside Runtime::block_on");
        f(inner)
    })
}

/// Where the simulator's wall clock starts (2026-01-01T00:00:00Z): timestamps
/// written to disk under the simulator are this plus virtual time, so a seed
/// replays bit for bit on any day.
const SIM_WALL_CLOCK_EPOCH_NS: u64 = 1_767_225_600 * 1_000_000_000;

/// The simulated runtime of this thread, if the current one is simulated; None
/// outside any runtime or on a real one (never panics: identity and timestamp
/// helpers are also called from plain code).
fn current_sim<R>(f: impl FnOnce(&sim::SimDriver) -> R) -> Option<R> {
    CURRENT.with(
        |current| match current.borrow().as_ref().map(|inner| &inner.driver) {
            Some(Driver::Sim(driver)) => Some(f(driver)),
            _ => None,
        },
    )
}

/// Nanoseconds since the Unix epoch, for timestamps stored on disk (uberblocks,
/// snapshots, scrub records). Virtual under the simulator, so that runs of one
/// seed write the same bytes.
pub fn wall_clock_ns() -> u64 {
    if let Some(now) = current_sim(|driver| driver.now().0) {
        return SIM_WALL_CLOCK_EPOCH_NS + now;
    }
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|elapsed| elapsed.as_nanos() as u64)
        .unwrap_or(0)
}

/// Nanoseconds since the Unix epoch from the kernel's coarse clock, for a
/// file's times: the clock the kernel stamps a cached file's mtime and
/// ctime with (`current_time()`, one tick of `CONFIG_HZ`), as OpenZFS's
/// znodes are stamped. With the kernel's writeback cache both stamp the
/// same files, and a finer server clock would let a time the kernel sets
/// after one the server set be earlier. Virtual under the simulator.
pub fn file_clock_ns() -> u64 {
    if let Some(now) = current_sim(|driver| driver.now().0) {
        return SIM_WALL_CLOCK_EPOCH_NS + now;
    }
    let mut time = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: writes only `time`, which outlives the call.
    if unsafe { libc::clock_gettime(libc::CLOCK_REALTIME_COARSE, &mut time) } != 0 {
        return wall_clock_ns();
    }
    (time.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(time.tv_nsec as u64)
}

/// A draw from the simulator's seeded generator when running under it (None
/// otherwise): identities (guids) drawn in a simulation must replay too.
pub fn simulated_random_u64() -> Option<u64> {
    current_sim(|driver| driver.random_u64())
}

/// True inside a simulated runtime (false outside any runtime: never panics).
pub fn in_simulation() -> bool {
    current_sim(|_| ()).is_some()
}

/// True when the current runtime is the simulator (used by tests and assertions).
pub fn is_simulated() -> bool {
    with_current(|inner| matches!(inner.driver, Driver::Sim(_)))
}

/// A runtime owns an executor and a driver; `block_on` runs a future to completion
/// on the current thread, together with every task it spawns.
pub struct Runtime {
    inner: Rc<RuntimeInner>,
}

impl Runtime {
    /// A runtime on a real io_uring with `ring_entries` submission slots.
    pub fn new_uring(ring_entries: u32) -> std::io::Result<Runtime> {
        let (driver, notify) = uring::UringDriver::new(ring_entries)?;
        buf::start_buffer_warmer();
        let executor = Executor::new(notify);
        Ok(Runtime {
            inner: Rc::new(RuntimeInner {
                executor,
                driver: Driver::Uring(driver),
            }),
        })
    }

    /// A deterministic simulated runtime; `seed` fixes every random choice.
    pub fn new_sim(seed: u64) -> Runtime {
        let executor = Executor::new(Box::new(|| {}));
        Runtime {
            inner: Rc::new(RuntimeInner {
                executor,
                driver: Driver::Sim(sim::SimDriver::new(seed)),
            }),
        }
    }

    /// Runs `future` and every task it spawns until `future` completes.
    ///
    /// Under the simulator, a state where no task can run and no timer is pending
    /// is a deadlock, which is a bug: it panics with a message saying so.
    pub fn block_on<F: Future>(&self, future: F) -> F::Output {
        let previous = CURRENT.with(|current| current.borrow_mut().replace(self.inner.clone()));
        self.inner.executor.enter();
        let main_wake = Arc::new(MainWake {
            woken: AtomicBool::new(true),
            remote: self.inner.executor.remote(),
        });
        let waker = Waker::from(main_wake.clone());
        let mut context = Context::from_waker(&waker);
        let mut future = std::pin::pin!(future);
        let output = loop {
            if main_wake.woken.swap(false, Ordering::AcqRel) {
                if let Poll::Ready(output) = future.as_mut().poll(&mut context) {
                    break output;
                }
            }
            match &self.inner.driver {
                Driver::Uring(driver) => self.inner.executor.run_ready(&|| driver.submit_queued()),
                // The simulator starts queued I/O when its clock moves.
                Driver::Sim(_) => self.inner.executor.run_ready(&|| {}),
            };
            let runnable =
                main_wake.woken.load(Ordering::Acquire) || self.inner.executor.has_ready();
            match &self.inner.driver {
                Driver::Uring(driver) => driver.turn(!runnable),
                Driver::Sim(driver) => {
                    if !runnable && !driver.advance() {
                        panic!("simulation deadlock: no task can run and no timer is pending");
                    }
                }
            }
        };
        self.inner.executor.leave();
        CURRENT.with(|current| *current.borrow_mut() = previous);
        output
    }

    /// Drops every spawned task (their destructors run). Used by the simulator to
    /// model a crash: everything in memory is gone, only the devices remain.
    pub fn drop_all_tasks(&self) {
        let previous = CURRENT.with(|current| current.borrow_mut().replace(self.inner.clone()));
        self.inner.executor.drop_all();
        CURRENT.with(|current| *current.borrow_mut() = previous);
    }

    /// Virtual time of a simulated runtime (real time of a uring one).
    pub fn now(&self) -> Instant {
        match &self.inner.driver {
            Driver::Uring(driver) => driver.now(),
            Driver::Sim(driver) => driver.now(),
        }
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        self.drop_all_tasks();
    }
}

struct MainWake {
    woken: AtomicBool,
    remote: Arc<executor::Remote>,
}

impl Wake for MainWake {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.woken.store(true, Ordering::Release);
        self.remote.notify_if_foreign();
    }
}

/// Stores `waker` in `slot` unless the one there already wakes the same task.
/// Futures inside a join (`join_all`, `FuturesUnordered`) are polled again
/// each time any sibling completes; cloning the waker on every such poll was
/// measured at 3% of the engine's CPU under random writes (an atomic count on
/// a shared `Arc` per clone).
pub fn register_waker(slot: &mut Option<std::task::Waker>, waker: &std::task::Waker) {
    match slot {
        Some(current) if current.will_wake(waker) => {}
        _ => *slot = Some(waker.clone()),
    }
}

/// Starts a task on the current runtime. It runs until done even if the handle is
/// dropped.
pub fn spawn<F>(future: F) -> JoinHandle<F::Output>
where
    F: Future + 'static,
    F::Output: 'static,
{
    spawn_with(future, false)
}

/// Spawns a task first polled at the end of the current round of the loop,
/// before the driver's turn, rather than in the next round: for work that
/// gathers what this round's tasks queued and starts device I/O (the vdev
/// queue's dispatch), so that the I/O reaches the kernel in this turn.
pub fn spawn_at_round_end<F>(future: F) -> JoinHandle<F::Output>
where
    F: Future + 'static,
    F::Output: 'static,
{
    spawn_with(future, true)
}

/// Futures larger than this are boxed on their own before their task is
/// built: a future is moved by value into the task's wrapper and the
/// wrapper into its box, and a large one (a FUSE request's is 7 KB, the
/// nesting of every operation it may run) costs a copy of all its bytes at
/// each move, which profiles of 16K file writes showed at 3% of the
/// engine's time. One allocation is cheaper than those copies; a small
/// future keeps the single box.
const SPAWN_INLINE_FUTURE_BYTES_MAX: usize = 512;

fn spawn_with<F>(future: F, round_end: bool) -> JoinHandle<F::Output>
where
    F: Future + 'static,
    F::Output: 'static,
{
    if std::mem::size_of::<F>() > SPAWN_INLINE_FUTURE_BYTES_MAX {
        spawn_task(Box::pin(future), round_end)
    } else {
        spawn_task(future, round_end)
    }
}

fn spawn_task<F>(future: F, round_end: bool) -> JoinHandle<F::Output>
where
    F: Future + 'static,
    F::Output: 'static,
{
    let state = Rc::new(JoinState {
        result: RefCell::new(None),
        waker: RefCell::new(None),
        finished: std::cell::Cell::new(false),
    });
    let task_state = state.clone();
    let task = async move {
        let output = future.await;
        *task_state.result.borrow_mut() = Some(output);
        task_state.finished.set(true);
        if let Some(waker) = task_state.waker.borrow_mut().take() {
            waker.wake();
        }
    };
    with_current(|inner| inner.executor.spawn_boxed(Box::pin(task), round_end));
    JoinHandle { state }
}

/// The current time of the runtime's clock.
pub fn now() -> Instant {
    with_current(|inner| match &inner.driver {
        Driver::Uring(driver) => driver.now(),
        Driver::Sim(driver) => driver.now(),
    })
}

/// Completes after `duration` (virtual time under the simulator).
pub fn sleep(duration: Duration) -> Sleep {
    with_current(|inner| match &inner.driver {
        Driver::Uring(_) => Box::pin(uring::timeout(duration)) as Sleep,
        Driver::Sim(driver) => Box::pin(driver.sleep(duration)),
    })
}

/// Yields to other ready tasks once.
pub async fn yield_now() {
    let mut yielded = false;
    std::future::poll_fn(move |context| {
        if yielded {
            Poll::Ready(())
        } else {
            yielded = true;
            context.waker().wake_by_ref();
            Poll::Pending
        }
    })
    .await
}

/// Draws a pseudo-random number: seeded under the simulator (deterministic), from a
/// per-runtime generator otherwise. Used for tie-breaking (which mirror child to
/// read) and never for anything on disk.
pub fn random_u64() -> u64 {
    with_current(|inner| match &inner.driver {
        Driver::Uring(driver) => driver.random_u64(),
        Driver::Sim(driver) => driver.random_u64(),
    })
}

/// A timer kept armed across waits. A loop that waits for "an event or a
/// deadline" and sees events often would, with [`timeout`], arm a kernel
/// timeout at every wait; each stays armed (or is removed, one more
/// operation) after the event wins. The txg sync loop, woken by every
/// filesystem change, armed a 5 s timeout per change (30,000 a second while
/// files were created); the NBD front end armed a 60 s one per reply.
/// This keeps one armed for as long as its deadline fits.
#[derive(Default)]
pub struct Timer {
    armed: Option<(Instant, Sleep)>,
}

/// What [`sleep`] returns.
pub type Sleep = Pin<Box<dyn Future<Output = ()>>>;

impl Timer {
    /// A timer with nothing armed.
    pub fn new() -> Timer {
        Timer::default()
    }

    /// Races `future` against `deadline`; `None` when the deadline passes
    /// first. The timer stays armed when `future` wins, for the next call
    /// with the same deadline; another deadline arms a new one.
    pub async fn timeout_at<F: Future>(
        &mut self,
        deadline: Instant,
        future: F,
    ) -> Option<F::Output> {
        self.race(now(), deadline, deadline, future).await
    }

    /// Races `future` against a deadline between `duration` and `duration +
    /// slack` from now; `None` when it passes first. The timer armed by an
    /// earlier call is kept while its deadline is in that range, so a loop
    /// calling this at any rate arms at most one timer per `slack`.
    pub async fn timeout_within<F: Future>(
        &mut self,
        duration: Duration,
        slack: Duration,
        future: F,
    ) -> Option<F::Output> {
        let now = now();
        let earliest = now.saturating_add(duration);
        self.race(now, earliest, earliest.saturating_add(slack), future)
            .await
    }

    /// Races `future` against the armed deadline if it is in `earliest..=
    /// latest`, else against a new one at `latest`.
    async fn race<F: Future>(
        &mut self,
        now: Instant,
        earliest: Instant,
        latest: Instant,
        future: F,
    ) -> Option<F::Output> {
        if latest <= now {
            self.armed = None;
            return None;
        }
        let sleeping = match &mut self.armed {
            Some((at, sleeping)) if (earliest..=latest).contains(at) => sleeping,
            armed => &mut armed.insert((latest, sleep(latest.duration_since(now)))).1,
        };
        let output = before(future, sleeping.as_mut()).await;
        if output.is_none() {
            self.armed = None;
        }
        output
    }
}

/// Races `future` against a timer; `None` when the timer wins.
pub async fn timeout<F: Future>(duration: Duration, future: F) -> Option<F::Output> {
    before(future, sleep(duration).as_mut()).await
}

/// `future`'s output if it completes before `timer`, else `None`.
async fn before<F: Future>(
    future: F,
    timer: Pin<&mut (dyn Future<Output = ()> + 'static)>,
) -> Option<F::Output> {
    use futures_util::future::{select, Either};
    match select(std::pin::pin!(future), timer).await {
        Either::Left((output, _)) => Some(output),
        Either::Right(((), _)) => None,
    }
}
