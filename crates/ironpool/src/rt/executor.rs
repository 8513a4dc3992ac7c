//! A single-threaded task executor.
//!
//! Every piece of engine state has one owner: the thread that runs this executor.
//! Tasks are plain futures polled from the loop; they are never polled inline from a
//! completion, so the stack stays bounded and there is no re-entrancy. The ready
//! queue is FIFO, which together with a deterministic driver (the simulator) makes a
//! whole run reproducible from one seed.
//!
//! A task may also be spawned to run at the end of the current round, before the
//! driver's turn (`spawn_at_round_end`): the device queue's dispatch is one. It sees
//! the I/O the round's tasks queued (so neighbours still aggregate), and the device
//! operations it starts reach the kernel in the same turn, instead of one round later
//! each for the dispatch and for the first poll of the I/O's task. In a long pass
//! the round end also comes every `ROUND_END_EVERY_POLLS` polls, and the driver
//! hands its I/O to the kernel then, so that I/O does not wait for the whole pass.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};

type LocalFuture = Pin<Box<dyn Future<Output = ()>>>;

/// Passes over the tasks spawned for the end of a round, at most, before the driver's
/// turn: a dispatch spawns device I/O tasks for the same round (two passes); a
/// device I/O that fails at once queues another dispatch. Past this many, the rest
/// wait for the next round: a round always ends and the driver gets its turn.
const ROUND_END_PASSES_MAX: usize = 4;

/// Passes over the ready tasks in one round, at most: the first polls those
/// ready when the round starts, each later one those the passes before made
/// ready (an NBD reply goes from the engine's channel to the connection's
/// outbox to its send in three tasks, which one pass would spread over three
/// rounds, each with a driver turn). Bounded so the driver still gets a turn
/// to submit and reap after a bounded amount of work.
const READY_PASSES_MAX: usize = 3;

/// Task polls in a pass, at most, before the round-end tasks run and the I/O
/// they start is handed to the kernel (`run_ready`'s `submit`): a request's
/// device I/O then waits for at most this many other tasks, not for the whole
/// pass. At QD64 a pass holds dozens of FUSE requests and replies (5-10 us
/// each here), and a read queued early waited for all of them: fio's 4K
/// direct reads at QD64 on a file got 8-14% more IOPS with 4 than with whole
/// passes (7 alternating rounds, 4K and 16K records). Small, so the latency it
/// adds stays a few polls; not smaller, since each early hand-over is a
/// system call. Neighbouring I/O of one task still aggregates, and I/O that
/// waits for a slot in the vdev queue aggregates there as before.
const ROUND_END_EVERY_POLLS: usize = 4;

/// Wakes that arrive from another thread (rare: only helper threads) are queued
/// here and the loop is told through `remote_pending`.
pub(crate) struct Remote {
    executor_id: usize,
    queue: Mutex<Vec<usize>>,
    pub(crate) pending: AtomicBool,
    /// Written by a remote wake so a parked driver returns (an eventfd).
    pub(crate) notify: Box<dyn Fn() + Send + Sync>,
}

impl Remote {
    /// Wakes the loop if called from another thread (on the loop's own thread the
    /// loop is running, so there is nothing to wake).
    pub(crate) fn notify_if_foreign(&self) {
        let on_owner = LOCAL_EXECUTOR_ID.with(|id| id.get() == self.executor_id);
        if !on_owner {
            (self.notify)();
        }
    }
}

struct TaskHeader {
    task_id: usize,
    scheduled: AtomicBool,
    remote: Arc<Remote>,
}

static NEXT_EXECUTOR_ID: AtomicUsize = AtomicUsize::new(1);

thread_local! {
    /// The executor running on this thread (0: none) and its local ready queue.
    static LOCAL_EXECUTOR_ID: Cell<usize> = const { Cell::new(0) };
    static LOCAL_READY: RefCell<VecDeque<usize>> = const { RefCell::new(VecDeque::new()) };
    /// Tasks spawned to run at the end of the current round.
    static LOCAL_ROUND_END: RefCell<VecDeque<usize>> = const { RefCell::new(VecDeque::new()) };
}

impl Wake for TaskHeader {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref()
    }

    fn wake_by_ref(self: &Arc<Self>) {
        if self.scheduled.swap(true, Ordering::AcqRel) {
            return;
        }
        let on_owner = LOCAL_EXECUTOR_ID.with(|id| id.get() == self.remote.executor_id);
        if on_owner {
            LOCAL_READY.with(|ready| ready.borrow_mut().push_back(self.task_id));
        } else {
            // A poisoned lock means another thread panicked while pushing; the
            // queue itself is still a valid Vec, so keep going.
            let mut queue = match self.remote.queue.lock() {
                Ok(guard) => guard,
                Err(poisoned) => poisoned.into_inner(),
            };
            queue.push(self.task_id);
            drop(queue);
            self.remote.pending.store(true, Ordering::Release);
            (self.remote.notify)();
        }
    }
}

struct TaskSlot {
    future: Option<LocalFuture>,
    header: Arc<TaskHeader>,
    waker: Waker,
}

/// The executor: a slab of tasks and the FIFO of those ready to run.
pub struct Executor {
    id: usize,
    tasks: RefCell<Vec<Option<TaskSlot>>>,
    free_slots: RefCell<Vec<usize>>,
    live_tasks: Cell<usize>,
    remote: Arc<Remote>,
}

impl Executor {
    pub(crate) fn new(notify: Box<dyn Fn() + Send + Sync>) -> Executor {
        let id = NEXT_EXECUTOR_ID.fetch_add(1, Ordering::Relaxed);
        Executor {
            id,
            tasks: RefCell::new(Vec::new()),
            free_slots: RefCell::new(Vec::new()),
            live_tasks: Cell::new(0),
            remote: Arc::new(Remote {
                executor_id: id,
                queue: Mutex::new(Vec::new()),
                pending: AtomicBool::new(false),
                notify,
            }),
        }
    }

    pub(crate) fn remote(&self) -> Arc<Remote> {
        self.remote.clone()
    }

    /// Makes this executor the one that wakes on this thread deliver to.
    pub(crate) fn enter(&self) {
        LOCAL_EXECUTOR_ID.with(|id| id.set(self.id));
        LOCAL_READY.with(|ready| ready.borrow_mut().clear());
        LOCAL_ROUND_END.with(|ready| ready.borrow_mut().clear());
    }

    pub(crate) fn leave(&self) {
        LOCAL_EXECUTOR_ID.with(|id| id.set(0));
    }

    /// Number of tasks spawned and not yet finished.
    pub fn live_tasks(&self) -> usize {
        self.live_tasks.get()
    }

    /// Adds a task; with `round_end`, it is first polled at the end of the current
    /// round (see the module's comment), else in the next round.
    pub(crate) fn spawn_boxed(&self, future: LocalFuture, round_end: bool) {
        let slot_index = match self.free_slots.borrow_mut().pop() {
            Some(index) => index,
            None => {
                let mut tasks = self.tasks.borrow_mut();
                tasks.push(None);
                tasks.len() - 1
            }
        };
        // A task for the round's end goes in its queue already scheduled, as a
        // wake would mark it: a wake before its first poll must not queue it
        // twice. (Spawned from another thread, it is woken as any other.)
        let round_end = round_end && LOCAL_EXECUTOR_ID.with(|id| id.get() == self.id);
        let header = Arc::new(TaskHeader {
            task_id: slot_index,
            scheduled: AtomicBool::new(round_end),
            remote: self.remote.clone(),
        });
        let waker = Waker::from(header.clone());
        self.tasks.borrow_mut()[slot_index] = Some(TaskSlot {
            future: Some(future),
            header,
            waker: waker.clone(),
        });
        self.live_tasks.set(self.live_tasks.get() + 1);
        if round_end {
            LOCAL_ROUND_END.with(|ready| ready.borrow_mut().push_back(slot_index));
        } else {
            waker.wake();
        }
    }

    fn drain_remote(&self) {
        if !self.remote.pending.swap(false, Ordering::AcqRel) {
            return;
        }
        let ids: Vec<usize> = {
            let mut queue = match self.remote.queue.lock() {
                Ok(guard) => guard,
                Err(poisoned) => poisoned.into_inner(),
            };
            std::mem::take(&mut *queue)
        };
        LOCAL_READY.with(|ready| ready.borrow_mut().extend(ids));
    }

    /// True when some task is ready to be polled.
    pub(crate) fn has_ready(&self) -> bool {
        self.drain_remote();
        LOCAL_READY.with(|ready| !ready.borrow().is_empty())
            || LOCAL_ROUND_END.with(|ready| !ready.borrow().is_empty())
    }

    /// Polls every task that is ready now, then those spawned for the end of
    /// this round; then, up to [`READY_PASSES_MAX`] passes in all, the tasks
    /// made ready while doing so, so the driver gets its turn after a bounded
    /// amount of work. Within a pass, the round-end tasks also run after
    /// every [`ROUND_END_EVERY_POLLS`] polls, followed by `submit` (the
    /// driver handing what they queued to the kernel; none in the
    /// simulator). Returns the number of tasks polled.
    pub(crate) fn run_ready(&self, submit: &dyn Fn()) -> usize {
        let mut polled = 0;
        for pass in 0..READY_PASSES_MAX {
            self.drain_remote();
            let count = LOCAL_READY.with(|ready| ready.borrow().len());
            // Only the first pass has the round's spawned tasks to run too.
            if pass > 0 && count == 0 {
                break;
            }
            for index in 0..count {
                let Some(task_id) = LOCAL_READY.with(|ready| ready.borrow_mut().pop_front()) else {
                    break;
                };
                self.poll_task(task_id);
                polled += 1;
                // The pass's last poll is followed by the round end anyway.
                if (index + 1) % ROUND_END_EVERY_POLLS == 0 && index + 1 < count {
                    polled += self.run_round_end();
                    submit();
                }
            }
            polled += self.run_round_end();
            if LOCAL_ROUND_END.with(|ready| !ready.borrow().is_empty()) {
                break;
            }
        }
        // Those left run first in the next round.
        let left = LOCAL_ROUND_END.with(|ready| std::mem::take(&mut *ready.borrow_mut()));
        LOCAL_READY.with(|ready| {
            let mut ready = ready.borrow_mut();
            for task_id in left.into_iter().rev() {
                ready.push_front(task_id);
            }
        });
        polled
    }

    /// Runs the tasks spawned for the end of the round, and those they spawn
    /// for it, up to [`ROUND_END_PASSES_MAX`] batches; returns how many.
    fn run_round_end(&self) -> usize {
        let mut polled = 0;
        for _ in 0..ROUND_END_PASSES_MAX {
            let batch = LOCAL_ROUND_END.with(|ready| std::mem::take(&mut *ready.borrow_mut()));
            if batch.is_empty() {
                break;
            }
            for task_id in batch {
                self.poll_task(task_id);
                polled += 1;
            }
        }
        polled
    }

    fn poll_task(&self, task_id: usize) {
        // Take the future out of its slot so that the task may spawn others (which
        // borrows the slab) while it is being polled.
        let (mut future, waker, header) = {
            let mut tasks = self.tasks.borrow_mut();
            let Some(Some(slot)) = tasks.get_mut(task_id) else {
                return; // A stale wake for a finished task.
            };
            let Some(future) = slot.future.take() else {
                return;
            };
            (future, slot.waker.clone(), slot.header.clone())
        };
        header.scheduled.store(false, Ordering::Release);
        let mut context = Context::from_waker(&waker);
        match future.as_mut().poll(&mut context) {
            Poll::Ready(()) => {
                self.tasks.borrow_mut()[task_id] = None;
                self.free_slots.borrow_mut().push(task_id);
                self.live_tasks.set(self.live_tasks.get() - 1);
            }
            Poll::Pending => {
                if let Some(Some(slot)) = self.tasks.borrow_mut().get_mut(task_id) {
                    slot.future = Some(future);
                }
            }
        }
    }

    /// Drops every task without running it further (a simulated crash, or the end
    /// of a runtime). Futures' destructors run here.
    pub(crate) fn drop_all(&self) {
        let tasks: Vec<Option<TaskSlot>> = std::mem::take(&mut *self.tasks.borrow_mut());
        self.free_slots.borrow_mut().clear();
        self.live_tasks.set(0);
        drop(tasks);
        LOCAL_READY.with(|ready| ready.borrow_mut().clear());
        LOCAL_ROUND_END.with(|ready| ready.borrow_mut().clear());
    }
}

/// The result side of a spawned task. Dropping it detaches the task.
pub struct JoinHandle<T> {
    pub(crate) state: Rc<JoinState<T>>,
}

pub(crate) struct JoinState<T> {
    pub(crate) result: RefCell<Option<T>>,
    pub(crate) waker: RefCell<Option<Waker>>,
    pub(crate) finished: Cell<bool>,
}

impl<T> JoinHandle<T> {
    /// True once the task has produced its output.
    pub fn is_finished(&self) -> bool {
        self.state.finished.get()
    }
}

impl<T> Future for JoinHandle<T> {
    type Output = T;
    fn poll(self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<T> {
        if let Some(result) = self.state.result.borrow_mut().take() {
            return Poll::Ready(result);
        }
        crate::rt::register_waker(&mut self.state.waker.borrow_mut(), context.waker());
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;
    use std::rc::Rc;

    use crate::rt::{self, Runtime};

    /// A task spawned for the end of a round runs after every task of that
    /// round (so a dispatch sees the I/O all of them queued) and before the
    /// next round (so the I/O it starts goes out in this turn), also when
    /// those tasks were made ready later than it was spawned.
    #[test]
    fn a_round_end_task_runs_after_the_round_and_before_the_next() {
        Runtime::new_sim(1).block_on(async {
            let order = Rc::new(RefCell::new(Vec::new()));
            let log = |name: &'static str| {
                let order = order.clone();
                move || order.borrow_mut().push(name)
            };
            let (first, second) = (log("first"), log("second"));
            let (round_end, next_round) = (log("round end"), log("next round"));
            let first_task = rt::spawn(async move {
                first();
                // Spawned first, yet it runs second: in the next round.
                rt::spawn(async move { next_round() });
                rt::spawn_at_round_end(async move { round_end() });
            });
            let second_task = rt::spawn(async move { second() });
            first_task.await;
            second_task.await;
            // Both spawned tasks have run once the next round is over.
            rt::yield_now().await;
            rt::yield_now().await;
            assert_eq!(
                *order.borrow(),
                ["first", "second", "round end", "next round"]
            );
        });
    }

    /// In a pass of many ready tasks, a round-end task runs after at most
    /// `ROUND_END_EVERY_POLLS` polls, not after the whole pass, and the
    /// driver's submit hook runs right after it.
    #[test]
    fn a_long_pass_reaches_the_round_end_every_few_polls() {
        use super::{Executor, ROUND_END_EVERY_POLLS};
        let runtime = Runtime::new_sim(1);
        let order = Rc::new(RefCell::new(Vec::<String>::new()));
        let tasks = 3 * ROUND_END_EVERY_POLLS + 1;
        runtime.block_on(async {
            let mut handles = Vec::new();
            for index in 0..tasks {
                let order = order.clone();
                handles.push(rt::spawn(async move {
                    order.borrow_mut().push(format!("task {index}"));
                    if index == 0 {
                        let order = order.clone();
                        rt::spawn_at_round_end(async move {
                            order.borrow_mut().push("round end".into());
                        });
                    }
                }));
            }
            for handle in handles {
                handle.await;
            }
        });
        let order = order.borrow();
        let round_end = order.iter().position(|entry| entry == "round end");
        assert_eq!(
            round_end,
            Some(ROUND_END_EVERY_POLLS),
            "the round end ran after {round_end:?} polls: {order:?}"
        );
        // The hook: a pass of `tasks` polls submits after every full group
        // of polls but the last (the turn submits that one).
        let executor = Executor::new(Box::new(|| {}));
        executor.enter();
        let submits = std::cell::Cell::new(0);
        for _ in 0..tasks {
            executor.spawn_boxed(Box::pin(async {}), false);
        }
        let polled = executor.run_ready(&|| submits.set(submits.get() + 1));
        executor.leave();
        assert_eq!(polled, tasks);
        assert_eq!(submits.get(), tasks / ROUND_END_EVERY_POLLS);
    }
}
