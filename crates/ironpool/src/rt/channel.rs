//! A channel between tasks, on one runtime or between threads each running
//! its own.
//!
//! The NBD front end (sockets, parsing, replies) and the engine (the pool,
//! devices) hand each other requests and replies through these channels, on
//! the engine's thread by default or on two (`serve --nbd-thread`). A sender
//! pushes under a short lock and wakes the receiving task through its waker:
//! on one thread that queues the task directly, across threads it reaches the
//! other runtime through its eventfd. Receivers take everything queued at
//! once, so one wake carries a batch.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

struct Shared<T> {
    queue: Mutex<State<T>>,
}

struct State<T> {
    items: VecDeque<T>,
    waker: Option<Waker>,
    senders: usize,
    receiver_alive: bool,
}

/// The sending side; clone it for several senders.
pub struct Sender<T> {
    shared: Arc<Shared<T>>,
}

/// The receiving side.
pub struct Receiver<T> {
    shared: Arc<Shared<T>>,
}

/// A new channel. Unbounded: callers bound what they send (the front end bounds
/// requests in flight per connection and payload bytes per server).
pub fn channel<T>() -> (Sender<T>, Receiver<T>) {
    let shared = Arc::new(Shared {
        queue: Mutex::new(State {
            items: VecDeque::new(),
            waker: None,
            senders: 1,
            receiver_alive: true,
        }),
    });
    (
        Sender {
            shared: shared.clone(),
        },
        Receiver { shared },
    )
}

fn lock<T>(shared: &Shared<T>) -> std::sync::MutexGuard<'_, State<T>> {
    // A panic while holding this lock leaves a consistent VecDeque behind.
    match shared.queue.lock() {
        Ok(guard) => guard,
        Err(poisoned) => poisoned.into_inner(),
    }
}

impl<T> Sender<T> {
    /// Queues `item`; returns it back if the receiver is gone.
    pub fn send(&self, item: T) -> Result<(), T> {
        let waker = {
            let mut state = lock(&self.shared);
            if !state.receiver_alive {
                return Err(item);
            }
            state.items.push_back(item);
            state.waker.take()
        };
        if let Some(waker) = waker {
            waker.wake();
        }
        Ok(())
    }
}

impl<T> Clone for Sender<T> {
    fn clone(&self) -> Sender<T> {
        lock(&self.shared).senders += 1;
        Sender {
            shared: self.shared.clone(),
        }
    }
}

impl<T> Drop for Sender<T> {
    fn drop(&mut self) {
        let waker = {
            let mut state = lock(&self.shared);
            state.senders -= 1;
            if state.senders == 0 {
                state.waker.take()
            } else {
                None
            }
        };
        if let Some(waker) = waker {
            waker.wake();
        }
    }
}

impl<T> Receiver<T> {
    /// Everything queued, waiting until there is something. An empty batch means
    /// every sender is gone.
    pub fn recv_batch(&mut self) -> RecvBatch<'_, T> {
        RecvBatch { receiver: self }
    }
}

impl<T> Drop for Receiver<T> {
    fn drop(&mut self) {
        let mut state = lock(&self.shared);
        state.receiver_alive = false;
        state.items.clear();
    }
}

pub struct RecvBatch<'a, T> {
    receiver: &'a mut Receiver<T>,
}

impl<T> Future for RecvBatch<'_, T> {
    type Output = Vec<T>;
    fn poll(self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<Vec<T>> {
        let mut state = lock(&self.receiver.shared);
        if !state.items.is_empty() {
            return Poll::Ready(state.items.drain(..).collect());
        }
        if state.senders == 0 {
            return Poll::Ready(Vec::new());
        }
        crate::rt::register_waker(&mut state.waker, context.waker());
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rt::Runtime;

    #[test]
    fn carries_batches_between_runtimes_on_two_threads() {
        let (to_worker, mut worker_inbox) = channel::<u64>();
        let (to_main, mut main_inbox) = channel::<u64>();
        let worker = std::thread::spawn(move || {
            let runtime = Runtime::new_uring(64).unwrap();
            runtime.block_on(async move {
                let mut total = 0;
                loop {
                    let batch = worker_inbox.recv_batch().await;
                    if batch.is_empty() {
                        break;
                    }
                    for value in batch {
                        total += value;
                        to_main.send(value * 2).unwrap();
                    }
                }
                total
            })
        });
        let runtime = Runtime::new_uring(64).unwrap();
        let received = runtime.block_on(async move {
            for value in 1..=1000u64 {
                to_worker.send(value).unwrap();
            }
            let mut received = Vec::new();
            while received.len() < 1000 {
                received.extend(main_inbox.recv_batch().await);
            }
            drop(to_worker);
            received
        });
        assert_eq!(worker.join().unwrap(), 500500);
        assert_eq!(received.iter().sum::<u64>(), 1001000);
    }
}
