//! The policy on synthetic traces: scan resistance, adaptation both ways,
//! the bounds, and its hit ratio against plain LRU (the measurement that
//! chose it; the figures are printed with `--nocapture`).

use super::*;

/// A deterministic generator (xorshift64*), so a trace is the same each run.
struct Trace(u64);

impl Trace {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    /// Zipf-like: key k drawn with probability about 1/(k+1) (by inverse
    /// transform of a log-uniform draw).
    fn skewed(&mut self, n: u64) -> u64 {
        let unit = (self.next() >> 11) as f64 / (1u64 << 53) as f64;
        ((n as f64 + 1.0).powf(unit) - 1.0) as u64 % n
    }
}

/// Plain LRU of the same byte budget, the baseline a policy has to beat.
struct Lru {
    order: std::collections::VecDeque<u64>,
    present: std::collections::HashSet<u64>,
    capacity: usize,
}

impl Lru {
    fn new(capacity: usize) -> Lru {
        Lru {
            order: Default::default(),
            present: Default::default(),
            capacity,
        }
    }

    fn access(&mut self, key: u64) -> bool {
        let hit = self.present.contains(&key);
        if hit {
            let at = self.order.iter().position(|k| *k == key).unwrap();
            self.order.remove(at);
        } else {
            self.present.insert(key);
            if self.order.len() == self.capacity {
                let old = self.order.pop_back().unwrap();
                self.present.remove(&old);
            }
        }
        self.order.push_front(key);
        hit
    }
}

/// One demand access at `now`: a hit, or a miss that is read and inserted.
fn access(cache: &mut AdaptiveCache<u64, u64>, key: u64, now: u64) -> bool {
    if cache.get(&key, now).is_some() {
        return true;
    }
    cache.insert(key, key, 1, now, false);
    false
}

const TICK: u64 = PROMOTE_AFTER_NS;

#[test]
fn a_scan_of_twice_the_cache_does_not_flush_a_hot_set() {
    let capacity = 1000;
    let hot = 500;
    let mut cache = AdaptiveCache::new(capacity);
    let mut lru = Lru::new(capacity as usize);
    let mut trace = Trace(7);
    let mut now = 0;
    // Warm: the hot set read a few times, far enough apart to count.
    for _ in 0..4 {
        for key in 0..hot {
            now += TICK;
            access(&mut cache, key, now);
            lru.access(key);
        }
    }
    // A scan of twice the cache, each block once, interleaved with the hot
    // set's readers (one hot read per scanned block).
    let (mut hits, mut lru_hits, mut reads) = (0, 0, 0);
    for scanned in 0..2 * capacity {
        now += TICK;
        access(&mut cache, 1_000_000 + scanned, now);
        lru.access(1_000_000 + scanned);
        let key = trace.below(hot);
        now += TICK;
        hits += access(&mut cache, key, now) as u64;
        lru_hits += lru.access(key) as u64;
        reads += 1;
        cache.check_invariants();
    }
    let ratio = hits as f64 / reads as f64;
    let lru_ratio = lru_hits as f64 / reads as f64;
    println!("hot set hit ratio during a 2x scan: adaptive {ratio:.3}, LRU {lru_ratio:.3}");
    assert!(ratio > 0.9, "hot set hit ratio {ratio}");
    assert!(cache.bytes() <= capacity);
}

#[test]
fn partial_reads_in_a_row_do_not_promote() {
    let mut cache: AdaptiveCache<u64, u64> = AdaptiveCache::new(10);
    cache.insert(1, 1, 1, 0, false);
    for quarter in 1..4 {
        assert!(cache.get(&1, quarter * 1_000).is_some());
    }
    assert_eq!(cache.list_of(&1), Some(ListId::Mru));
    assert!(cache.get(&1, PROMOTE_AFTER_NS + 1).is_some());
    assert_eq!(cache.list_of(&1), Some(ListId::Mfu));
    assert_eq!(cache.counters().promotions, 1);
}

#[test]
fn a_prefetched_entry_starts_unread_and_is_counted_if_never_used() {
    let mut cache: AdaptiveCache<u64, u64> = AdaptiveCache::new(2);
    cache.insert(1, 1, 1, 0, true);
    // Its first demand read is its first access: no promotion, even late.
    assert!(cache.get(&1, 10 * PROMOTE_AFTER_NS).is_some());
    assert_eq!(cache.list_of(&1), Some(ListId::Mru));
    cache.insert(2, 2, 1, 0, true);
    cache.insert(3, 3, 1, 0, false);
    cache.insert(4, 4, 1, 0, false);
    let counters = cache.counters();
    assert_eq!(counters.evictions, 2);
    assert_eq!(counters.prefetch_unused, 1, "entry 2 was never read");
    cache.check_invariants();
}

#[test]
fn ghost_hits_move_the_target_both_ways() {
    let mut cache: AdaptiveCache<u64, u64> = AdaptiveCache::new(100);
    let mut now = 0;
    // A frequent set of 50 in T2 ...
    for _ in 0..2 {
        for key in 1000..1050 {
            now += TICK;
            access(&mut cache, key, now);
        }
    }
    let start = cache.mru_target_bytes();
    // ... and a loop over 80 keys read once per pass: T1's share (p = 50)
    // is too small for it, its keys come back from B1, and p grows.
    for _ in 0..4 {
        for key in 0..80 {
            now += 1;
            access(&mut cache, key, now);
        }
    }
    assert!(cache.counters().mru_ghost_hits > 0);
    let grown = cache.mru_target_bytes();
    assert!(grown > start, "p {start} -> {grown}");
    cache.check_invariants();
    // Frequency: two sets of 60 keys read twice each, promoted to T2 in
    // turn, push each other out; when one comes back its keys are B2 hits,
    // and p shrinks.
    let mut cache: AdaptiveCache<u64, u64> = AdaptiveCache::new(100);
    for round in 0..6u64 {
        for key in 0..60 {
            now += TICK;
            access(&mut cache, key + (round % 2) * 1000, now);
            now += TICK;
            access(&mut cache, key + (round % 2) * 1000, now);
        }
    }
    assert!(cache.counters().mfu_ghost_hits > 0);
    assert!(
        cache.mru_target_bytes() < 50,
        "p {}",
        cache.mru_target_bytes()
    );
    cache.check_invariants();
}

#[test]
fn bytes_and_ghosts_stay_within_their_bounds_under_any_mix() {
    let mut cache: AdaptiveCache<u64, u64> = AdaptiveCache::new(64 * 1024);
    let mut trace = Trace(99);
    let mut now = 0;
    for step in 0..50_000u64 {
        now += trace.below(2 * TICK);
        let key = trace.skewed(5_000);
        match trace.below(10) {
            0 => {
                cache.remove(&key);
            }
            1 => {
                cache.insert(key, key, 512 << trace.below(6), now, true);
            }
            _ => {
                if cache.get(&key, now).is_none() {
                    cache.insert(key, key, 512 << trace.below(6), now, false);
                }
            }
        }
        if step == 30_000 {
            cache.set_target(16 * 1024);
        }
        assert!(cache.bytes() <= cache.target_bytes());
        let sizes = cache.list_sizes();
        assert!(sizes.mru_bytes + sizes.mru_ghost_bytes <= cache.target_bytes() + (16 << 10));
        if step % 997 == 0 {
            cache.check_invariants();
        }
    }
    cache.check_invariants();
}

#[test]
fn hit_ratio_at_least_lru_on_skewed_and_mixed_traces() {
    for (name, seed, scans) in [("skewed", 1, false), ("skewed with scans", 2, true)] {
        let capacity = 500;
        let mut cache = AdaptiveCache::new(capacity);
        let mut lru = Lru::new(capacity as usize);
        let mut trace = Trace(seed);
        let (mut hits, mut lru_hits, mut now, mut scan_key) = (0u64, 0u64, 0u64, 1u64 << 40);
        let accesses = 50_000;
        for step in 0..accesses {
            now += TICK / 4;
            let key = if scans && step % 3 == 0 {
                scan_key += 1;
                scan_key
            } else {
                trace.skewed(5_000)
            };
            hits += access(&mut cache, key, now) as u64;
            lru_hits += lru.access(key) as u64;
        }
        let ratio = hits as f64 / accesses as f64;
        let lru_ratio = lru_hits as f64 / accesses as f64;
        println!("{name}: adaptive {ratio:.3}, LRU {lru_ratio:.3}");
        assert!(
            ratio >= lru_ratio - 0.005,
            "{name}: {ratio} against LRU {lru_ratio}"
        );
    }
}

#[test]
fn removing_a_key_drops_it_and_its_ghost() {
    let mut cache: AdaptiveCache<u64, u64> = AdaptiveCache::new(3);
    cache.insert(1, 10, 1, 0, false);
    assert_eq!(cache.remove(&1), Some(10));
    assert_eq!(cache.get(&1, 0), None);
    // 9 in T2; 1 and 2 in T1; 3 pushes 1 out of T1 (above p) into B1.
    cache.insert(9, 90, 1, 0, false);
    assert!(cache.get(&9, TICK).is_some());
    cache.insert(1, 10, 1, TICK, false);
    cache.insert(2, 20, 1, TICK, false);
    cache.insert(3, 30, 1, TICK, false);
    assert_eq!(cache.list_of(&1), Some(ListId::MruGhost));
    assert_eq!(cache.remove(&1), None);
    assert_eq!(cache.list_of(&1), None);
    cache.check_invariants();
}
