//! Single-threaded coordination primitives: a notification, a counting semaphore,
//! a one-shot channel and a bounded queue. None of them lock; all state is owned
//! by the loop thread.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};

/// Wakes every waiter registered before `notify_all`. A waiter checks its
/// condition, and if it does not hold, awaits `notified()` and checks again.
#[derive(Default)]
pub struct Notify {
    generation: Cell<u64>,
    waiters: RefCell<Vec<Waker>>,
}

impl Notify {
    pub fn new() -> Notify {
        Notify::default()
    }

    pub fn notify_all(&self) {
        self.generation.set(self.generation.get() + 1);
        for waker in self.waiters.borrow_mut().drain(..) {
            waker.wake();
        }
    }

    /// Completes at the next `notify_all`.
    pub fn notified(&self) -> Notified<'_> {
        Notified {
            notify: self,
            generation: self.generation.get(),
        }
    }
}

pub struct Notified<'a> {
    notify: &'a Notify,
    generation: u64,
}

impl Future for Notified<'_> {
    type Output = ();
    fn poll(self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<()> {
        if self.notify.generation.get() != self.generation {
            return Poll::Ready(());
        }
        // Once per task: a waiter polled again (a loop that also waits on a
        // timer) must not add a waker each time, or an idle loop's list grows
        // without bound until the next notify_all.
        let mut waiters = self.notify.waiters.borrow_mut();
        if !waiters.iter().any(|waker| waker.will_wake(context.waker())) {
            waiters.push(context.waker().clone());
        }
        Poll::Pending
    }
}

/// A task waiting in a [`Semaphore`]: the units it wants, the flag set once
/// they are granted, and how to wake it.
type Waiter = (u64, Rc<Cell<bool>>, Option<Waker>);

/// A FIFO counting semaphore: bounds in-flight work (bytes or requests).
/// Acquiring more than the total capacity is clamped to the capacity so a single
/// oversized request still makes progress alone.
pub struct Semaphore {
    capacity: u64,
    available: Cell<u64>,
    queue: RefCell<VecDeque<Waiter>>,
}

impl Semaphore {
    pub fn new(capacity: u64) -> Rc<Semaphore> {
        Rc::new(Semaphore {
            capacity,
            available: Cell::new(capacity),
            queue: RefCell::new(VecDeque::new()),
        })
    }

    pub fn available(&self) -> u64 {
        self.available.get()
    }

    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Whether a task waits for units: whoever holds some may want to let
    /// them go sooner.
    pub fn has_waiters(&self) -> bool {
        !self.queue.borrow().is_empty()
    }

    /// Takes `amount` units, waiting in FIFO order.
    pub async fn acquire(self: &Rc<Self>, amount: u64) -> Permit {
        let amount = amount.min(self.capacity);
        if self.queue.borrow().is_empty() && self.available.get() >= amount {
            self.available.set(self.available.get() - amount);
            return Permit {
                semaphore: self.clone(),
                amount,
            };
        }
        let granted = Rc::new(Cell::new(false));
        self.queue
            .borrow_mut()
            .push_back((amount, granted.clone(), None));
        let waiter = SemaphoreWait {
            semaphore: self.clone(),
            amount,
            granted: granted.clone(),
            done: false,
        };
        waiter.await;
        Permit {
            semaphore: self.clone(),
            amount,
        }
    }

    /// Takes `amount` units if they are free now.
    pub fn try_acquire(self: &Rc<Self>, amount: u64) -> Option<Permit> {
        let amount = amount.min(self.capacity);
        if self.queue.borrow().is_empty() && self.available.get() >= amount {
            self.available.set(self.available.get() - amount);
            Some(Permit {
                semaphore: self.clone(),
                amount,
            })
        } else {
            None
        }
    }

    fn release(&self, amount: u64) {
        self.available.set(self.available.get() + amount);
        self.grant_waiters();
    }

    fn grant_waiters(&self) {
        let mut queue = self.queue.borrow_mut();
        while let Some((amount, granted, waker)) = queue.front_mut() {
            if self.available.get() < *amount {
                break;
            }
            self.available.set(self.available.get() - *amount);
            granted.set(true);
            if let Some(waker) = waker.take() {
                waker.wake();
            }
            queue.pop_front();
        }
    }
}

struct SemaphoreWait {
    semaphore: Rc<Semaphore>,
    amount: u64,
    granted: Rc<Cell<bool>>,
    done: bool,
}

impl Future for SemaphoreWait {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<()> {
        if self.granted.get() {
            self.done = true;
            return Poll::Ready(());
        }
        let mut queue = self.semaphore.queue.borrow_mut();
        if let Some(entry) = queue
            .iter_mut()
            .find(|entry| Rc::ptr_eq(&entry.1, &self.granted))
        {
            crate::rt::register_waker(&mut entry.2, context.waker());
        }
        Poll::Pending
    }
}

impl Drop for SemaphoreWait {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        if self.granted.get() {
            // Granted but dropped before it was observed: give the units back.
            self.semaphore.release(self.amount);
            return;
        }
        let mut queue = self.semaphore.queue.borrow_mut();
        if let Some(position) = queue
            .iter()
            .position(|entry| Rc::ptr_eq(&entry.1, &self.granted))
        {
            queue.remove(position);
            drop(queue);
            // Removing a waiter from the head may let the next one go.
            self.semaphore.grant_waiters();
        }
    }
}

/// Units held from a [`Semaphore`]; released on drop.
pub struct Permit {
    semaphore: Rc<Semaphore>,
    amount: u64,
}

impl Permit {
    pub fn amount(&self) -> u64 {
        self.amount
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        self.semaphore.release(self.amount);
    }
}

/// A one-shot channel: one value from a sender to a receiver.
pub fn oneshot<T>() -> (OneshotSender<T>, OneshotReceiver<T>) {
    let shared = Rc::new(OneshotShared {
        value: RefCell::new(None),
        waker: RefCell::new(None),
        closed: Cell::new(false),
    });
    (
        OneshotSender {
            shared: shared.clone(),
        },
        OneshotReceiver { shared },
    )
}

struct OneshotShared<T> {
    value: RefCell<Option<T>>,
    waker: RefCell<Option<Waker>>,
    closed: Cell<bool>,
}

pub struct OneshotSender<T> {
    shared: Rc<OneshotShared<T>>,
}

impl<T> OneshotSender<T> {
    pub fn send(self, value: T) {
        *self.shared.value.borrow_mut() = Some(value);
        // Drop runs next and wakes the receiver.
    }
}

impl<T> Drop for OneshotSender<T> {
    fn drop(&mut self) {
        self.shared.closed.set(true);
        if let Some(waker) = self.shared.waker.borrow_mut().take() {
            waker.wake();
        }
    }
}

pub struct OneshotReceiver<T> {
    shared: Rc<OneshotShared<T>>,
}

impl<T> Future for OneshotReceiver<T> {
    /// `None` when the sender was dropped without sending.
    type Output = Option<T>;
    fn poll(self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<Option<T>> {
        if let Some(value) = self.shared.value.borrow_mut().take() {
            return Poll::Ready(Some(value));
        }
        if self.shared.closed.get() {
            return Poll::Ready(None);
        }
        crate::rt::register_waker(&mut self.shared.waker.borrow_mut(), context.waker());
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rt::{self, Runtime};
    use std::time::Duration;

    #[test]
    fn semaphore_is_fifo_and_bounded() {
        let runtime = Runtime::new_sim(1);
        runtime.block_on(async {
            let semaphore = Semaphore::new(2);
            let order = Rc::new(RefCell::new(Vec::new()));
            let mut handles = Vec::new();
            for index in 0..5u64 {
                let semaphore = semaphore.clone();
                let order = order.clone();
                handles.push(rt::spawn(async move {
                    let _permit = semaphore.acquire(1).await;
                    order.borrow_mut().push(index);
                    assert!(semaphore.available() <= 1);
                    rt::sleep(Duration::from_millis(10)).await;
                }));
            }
            for handle in handles {
                handle.await;
            }
            assert_eq!(*order.borrow(), vec![0, 1, 2, 3, 4]);
            assert_eq!(semaphore.available(), 2);
        });
    }

    /// A loop that waits for a notification or a timeout, again and again,
    /// registers one waker, not one per turn: the txg sync task of an idle
    /// pool does this every txg_timeout, and the list grew by one each turn
    /// until ironpool-sim ran out of memory (24 GB) over simulated years.
    #[test]
    fn an_idle_waiting_loop_keeps_one_waker() {
        let runtime = Runtime::new_sim(4);
        runtime.block_on(async {
            let notify = Notify::new();
            for _ in 0..1000 {
                assert!(rt::timeout(Duration::from_millis(5), notify.notified())
                    .await
                    .is_none());
            }
            assert_eq!(notify.waiters.borrow().len(), 1);
            notify.notify_all();
            assert!(notify.waiters.borrow().is_empty());
        });
    }

    #[test]
    fn dropped_waiter_does_not_block_others() {
        let runtime = Runtime::new_sim(2);
        runtime.block_on(async {
            let semaphore = Semaphore::new(1);
            let held = semaphore.acquire(1).await;
            let waiting = rt::timeout(Duration::from_millis(5), semaphore.acquire(1)).await;
            assert!(waiting.is_none());
            drop(held);
            let again = rt::timeout(Duration::from_millis(5), semaphore.acquire(1)).await;
            assert!(again.is_some());
        });
    }

    #[test]
    fn oneshot_delivers_or_reports_a_dropped_sender() {
        let runtime = Runtime::new_sim(3);
        runtime.block_on(async {
            let (sender, receiver) = oneshot::<u32>();
            rt::spawn(async move {
                rt::sleep(Duration::from_millis(1)).await;
                sender.send(7);
            });
            assert_eq!(receiver.await, Some(7));
            let (sender, receiver) = oneshot::<u32>();
            drop(sender);
            assert_eq!(receiver.await, None);
        });
    }
}
