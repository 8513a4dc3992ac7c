//! The simulator's driver: a virtual clock and a timer queue.
//!
//! When no task can run, the clock jumps to the earliest pending timer and fires
//! it. Timers at the same instant fire in the order they were set. Together with
//! the FIFO executor this makes every run a pure function of its seed.
//!
//! A timer dropped before it fires (the losing side of every `timeout` whose
//! future won) gives up its state at once, and its queue entry, left without
//! one, goes when it reaches the front or when the queue is rebuilt. Nothing
//! was waiting at its deadline, so skipping it changes no run; keeping it let
//! a long run's queue grow by one entry per won race.

use std::cell::{Cell, RefCell};
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use super::Instant;

/// A small, fast, seedable generator (xoshiro256**, seeded through splitmix64).
/// Used only for simulation choices and tie-breaking, never for anything durable.
#[derive(Clone, Debug)]
pub struct Rng {
    state: [u64; 4],
}

impl Rng {
    pub fn new(seed: u64) -> Rng {
        let mut splitmix = seed;
        let mut next = || {
            splitmix = splitmix.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = splitmix;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        };
        Rng {
            state: [next(), next(), next(), next()],
        }
    }

    pub fn next_u64(&mut self) -> u64 {
        let result = self.state[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = self.state[1] << 17;
        self.state[2] ^= self.state[0];
        self.state[3] ^= self.state[1];
        self.state[1] ^= self.state[2];
        self.state[0] ^= self.state[3];
        self.state[2] ^= t;
        self.state[3] = self.state[3].rotate_left(45);
        result
    }

    /// Uniform in `0..bound` (`bound` > 0).
    pub fn below(&mut self, bound: u64) -> u64 {
        assert!(bound > 0);
        ((self.next_u64() as u128 * bound as u128) >> 64) as u64
    }

    /// True with probability `numerator / denominator`.
    pub fn chance(&mut self, numerator: u64, denominator: u64) -> bool {
        self.below(denominator) < numerator
    }

    pub fn fill(&mut self, bytes: &mut [u8]) {
        for chunk in bytes.chunks_mut(8) {
            let value = self.next_u64().to_le_bytes();
            chunk.copy_from_slice(&value[..chunk.len()]);
        }
    }
}

/// Queued timers below which dropped ones are only removed when they reach
/// the front: rebuilding a small queue costs more than it saves.
const TIMER_QUEUE_REBUILD_MIN: usize = 1024;

struct TimerState {
    fired: Cell<bool>,
    waker: RefCell<Option<Waker>>,
}

/// The state of every timer that may still fire, by sequence number. A queue
/// entry whose sequence is not here was dropped.
type TimerStates = Rc<RefCell<rustc_hash::FxHashMap<u64, Rc<TimerState>>>>;

pub(crate) struct SimDriver {
    now_ns: Cell<u64>,
    sequence: Cell<u64>,
    timers: RefCell<BinaryHeap<Reverse<(u64, u64)>>>,
    states: TimerStates,
    /// Times [`SimDriver::advance`] found a timer to move the clock to.
    clock_stops: Cell<u64>,
    rng: RefCell<Rng>,
}

impl SimDriver {
    pub(crate) fn new(seed: u64) -> SimDriver {
        SimDriver {
            now_ns: Cell::new(0),
            sequence: Cell::new(0),
            timers: RefCell::new(BinaryHeap::new()),
            states: Rc::default(),
            clock_stops: Cell::new(0),
            rng: RefCell::new(Rng::new(seed ^ 0x5151_0000_0000_0001)),
        }
    }

    pub(crate) fn now(&self) -> Instant {
        Instant(self.now_ns.get())
    }

    pub(crate) fn random_u64(&self) -> u64 {
        self.rng.borrow_mut().next_u64()
    }

    pub(crate) fn sleep(&self, duration: Duration) -> SimSleep {
        let deadline = self
            .now_ns
            .get()
            .saturating_add(duration.as_nanos().min(u64::MAX as u128) as u64);
        let sequence = self.sequence.get();
        self.sequence.set(sequence + 1);
        let state = Rc::new(TimerState {
            fired: Cell::new(false),
            waker: RefCell::new(None),
        });
        self.rebuild_if_mostly_dropped();
        self.states.borrow_mut().insert(sequence, state.clone());
        self.timers.borrow_mut().push(Reverse((deadline, sequence)));
        SimSleep {
            state,
            sequence,
            states: self.states.clone(),
        }
    }

    /// Timers in the queue, dropped ones included (for tests of its bound).
    #[cfg(test)]
    pub(crate) fn queued_timers(&self) -> usize {
        self.timers.borrow().len()
    }

    /// Times the clock was moved to a timer (for tests).
    #[cfg(test)]
    pub(crate) fn clock_stops(&self) -> u64 {
        self.clock_stops.get()
    }

    /// Rebuilds the queue without its dropped timers once they are more than
    /// half of it, so it stays within twice the live timers.
    fn rebuild_if_mostly_dropped(&self) {
        let queued = self.timers.borrow().len();
        let live = self.states.borrow().len();
        if queued < TIMER_QUEUE_REBUILD_MIN || (queued - live) * 2 <= queued {
            return;
        }
        let states = self.states.borrow();
        self.timers
            .borrow_mut()
            .retain(|Reverse((_, sequence))| states.contains_key(sequence));
    }

    /// Removes dropped timers from the front of the queue; returns the
    /// earliest live deadline.
    fn next_live_deadline(&self) -> Option<u64> {
        loop {
            let Reverse((deadline, sequence)) = self.timers.borrow().peek().copied()?;
            if self.states.borrow().contains_key(&sequence) {
                return Some(deadline);
            }
            self.timers.borrow_mut().pop();
        }
    }

    /// Jumps the clock to the next timer and fires every timer due then.
    /// Returns false when there is no timer at all.
    pub(crate) fn advance(&self) -> bool {
        let Some(deadline) = self.next_live_deadline() else {
            return false;
        };
        self.clock_stops.set(self.clock_stops.get() + 1);
        if deadline > self.now_ns.get() {
            self.now_ns.set(deadline);
        }
        loop {
            let next = self.timers.borrow().peek().copied();
            let Some(Reverse((due, sequence))) = next else {
                break;
            };
            if due > self.now_ns.get() {
                break;
            }
            self.timers.borrow_mut().pop();
            let state = self.states.borrow_mut().remove(&sequence);
            if let Some(state) = state {
                state.fired.set(true);
                if let Some(waker) = state.waker.borrow_mut().take() {
                    waker.wake();
                }
            }
        }
        true
    }
}

/// A virtual-time sleep.
pub(crate) struct SimSleep {
    state: Rc<TimerState>,
    /// Its key in `states`, the driver's map it leaves when dropped (a fired
    /// timer has left it already).
    sequence: u64,
    states: TimerStates,
}

impl Drop for SimSleep {
    fn drop(&mut self) {
        self.states.borrow_mut().remove(&self.sequence);
    }
}

impl Future for SimSleep {
    type Output = ();
    fn poll(self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<()> {
        if self.state.fired.get() {
            Poll::Ready(())
        } else {
            crate::rt::register_waker(&mut self.state.waker.borrow_mut(), context.waker());
            Poll::Pending
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::rt::{self, Driver, Runtime};

    fn driver<R>(f: impl FnOnce(&super::SimDriver) -> R) -> R {
        rt::with_current(|inner| match &inner.driver {
            Driver::Sim(driver) => f(driver),
            Driver::Uring(_) => unreachable!("a simulated runtime"),
        })
    }

    /// Races won by their future leave no timer behind for long: the queue
    /// stays within twice its live timers however many races a run has, and
    /// the clock does not stop at the deadlines of dropped timers.
    #[test]
    fn dropped_timers_leave_the_queue() {
        Runtime::new_sim(7).block_on(async {
            // One live timer far out, so the queue is never empty.
            let far = rt::spawn(rt::sleep(Duration::from_secs(3600)));
            let mut largest = 0;
            for round in 0..20_000u64 {
                // The future wins: the 60 s timer is dropped unfired.
                let won = rt::timeout(Duration::from_secs(60), async { round }).await;
                assert_eq!(won, Some(round));
                largest = largest.max(driver(|driver| driver.queued_timers()));
            }
            assert!(
                largest <= 2 * super::TIMER_QUEUE_REBUILD_MIN,
                "the timer queue grew to {largest} entries"
            );
            // Every dropped timer is due at 60 s, before this sleep ends:
            // the clock goes straight to 61 s, one stop, not two.
            let start = rt::now();
            let stops = driver(|driver| driver.clock_stops());
            rt::sleep(Duration::from_secs(61)).await;
            assert_eq!(rt::now().duration_since(start), Duration::from_secs(61));
            assert_eq!(
                driver(|driver| driver.clock_stops()) - stops,
                1,
                "the clock stopped at a dropped timer's deadline"
            );
            assert_eq!(
                driver(|driver| driver.queued_timers()),
                1,
                "only the live timer is left"
            );
            drop(far);
        });
    }
}
