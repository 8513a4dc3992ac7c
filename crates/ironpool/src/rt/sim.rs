//! The simulator's driver: a virtual clock and a timer queue.
//!
//! When no task can run, the clock jumps to the earliest pending timer and fires
//! it. Timers at the same instant fire in the order they were set. Together with
//! the FIFO executor this makes every run a pure function of its seed.

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

struct TimerState {
    fired: Cell<bool>,
    waker: RefCell<Option<Waker>>,
}

pub(crate) struct SimDriver {
    now_ns: Cell<u64>,
    sequence: Cell<u64>,
    timers: RefCell<BinaryHeap<Reverse<(u64, u64)>>>,
    states: RefCell<rustc_hash::FxHashMap<u64, Rc<TimerState>>>,
    rng: RefCell<Rng>,
}

impl SimDriver {
    pub(crate) fn new(seed: u64) -> SimDriver {
        SimDriver {
            now_ns: Cell::new(0),
            sequence: Cell::new(0),
            timers: RefCell::new(BinaryHeap::new()),
            states: RefCell::new(Default::default()),
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
        self.states.borrow_mut().insert(sequence, state.clone());
        self.timers.borrow_mut().push(Reverse((deadline, sequence)));
        SimSleep { state }
    }

    /// Jumps the clock to the next timer and fires every timer due then.
    /// Returns false when there is no timer at all.
    pub(crate) fn advance(&self) -> bool {
        let Some(Reverse((deadline, _))) = self.timers.borrow().peek().copied() else {
            return false;
        };
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
