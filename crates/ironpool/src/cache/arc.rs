//! The replacement policy of the read cache: adaptive replacement (ARC,
//! Megiddo and Modha, 2003) over entries of any size, as OpenZFS runs it.
//!
//! Four lists, each most recent first:
//! - `T1` (MRU): entries seen once (or only within [`PROMOTE_AFTER_NS`] of
//!   their first access, or prefetched and not yet read);
//! - `T2` (MFU): entries read again later;
//! - `B1`, `B2`: ghosts, the keys (no data) of entries lately evicted from
//!   `T1` and `T2`.
//!
//! `p` is the target share of `T1`. A miss that finds its key in `B1` says
//! `T1` was too small, and `p` grows; one found in `B2` says `T2` was, and `p`
//! shrinks. Eviction takes from the tail of `T1` while it is above `p`, else
//! from `T2`. This is the adaptation between recency and frequency the cache
//! needs: a working set read again and again lives in `T2`, and a scan (each
//! block read once) passes through `T1` only, evicting its own blocks, never
//! the hot ones in `T2` — unless the scan's own blocks come back, which is
//! what `p` growing is for.
//!
//! Two rules from OpenZFS keep partial reads and prefetch from faking
//! frequency: a second access within [`PROMOTE_AFTER_NS`] of the first does
//! not promote (a sequential reader reading a 16K block 4K at a time reads it
//! four times in a row), and the first demand read of a prefetched entry
//! counts as its first access.
//!
//! Sizes are bytes, not entries: a cache of 16K blocks and 128K blocks
//! evicts by memory. All operations are O(1) (a hash map into a slab of
//! doubly linked nodes), and nothing here allocates per access.

use std::hash::Hash;

/// A second access at least this long after the first promotes an entry to
/// `T2` (OpenZFS's `ARC_MINTIME`, 62 ms): shorter, and it is the same reader
/// finishing the block (partial reads, a read and its neighbour).
pub const PROMOTE_AFTER_NS: u64 = 62_000_000;

/// Ghost entries kept at most. Ghosts are bounded by bytes as in ARC (`B1`
/// with `T1` up to the target, all four up to twice it); with 4K blocks and a
/// large target that is millions of keys, so they are bounded by count too:
/// 1M ghosts are about 64 MiB of keys and links.
pub const GHOSTS_MAX: usize = 1 << 20;

const NIL: u32 = u32::MAX;

/// Where an entry is in the cache's slab, as [`AdaptiveCache::find`] found
/// it: valid until the cache next changes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Slot(u32);

/// Which list an entry is on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ListId {
    Mru = 0,
    Mfu = 1,
    MruGhost = 2,
    MfuGhost = 3,
}

impl ListId {
    fn is_ghost(self) -> bool {
        matches!(self, ListId::MruGhost | ListId::MfuGhost)
    }
}

#[derive(Clone, Copy, Default)]
struct List {
    head: u32,
    tail: u32,
    bytes: u64,
    entries: u64,
}

struct Node<K, V> {
    key: K,
    value: Option<V>,
    bytes: u64,
    list: ListId,
    prev: u32,
    next: u32,
    last_access_ns: u64,
    prefetched: bool,
}

/// What the policy did, since it was made.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct PolicyCounters {
    /// Entries evicted (to a ghost list) and their bytes.
    pub evictions: u64,
    pub evicted_bytes: u64,
    /// Prefetched entries evicted before any demand read used them.
    pub prefetch_unused: u64,
    pub prefetch_unused_bytes: u64,
    /// Misses whose key was a ghost: `T1` (`B1`) or `T2` (`B2`) was too small.
    pub mru_ghost_hits: u64,
    pub mfu_ghost_hits: u64,
    /// Entries moved from `T1` to `T2`.
    pub promotions: u64,
}

/// Sizes of the lists, for `arcstat`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct ListSizes {
    pub mru_bytes: u64,
    pub mru_entries: u64,
    pub mfu_bytes: u64,
    pub mfu_entries: u64,
    pub mru_ghost_bytes: u64,
    pub mru_ghost_entries: u64,
    pub mfu_ghost_bytes: u64,
    pub mfu_ghost_entries: u64,
}

/// An evicted entry's value, handed back so the caller can count it (and
/// drop its buffer outside any borrow).
pub struct Evicted<V> {
    pub value: V,
    pub bytes: u64,
    pub prefetched: bool,
}

/// The policy with its entries: `V` is what a hit returns (a cached block).
pub struct AdaptiveCache<K, V> {
    map: rustc_hash::FxHashMap<K, u32>,
    nodes: Vec<Node<K, V>>,
    free_slots: Vec<u32>,
    lists: [List; 4],
    /// Bytes `T1` + `T2` may hold.
    target_bytes: u64,
    /// Target share of `T1`, 0..=target.
    mru_target_bytes: u64,
    counters: PolicyCounters,
}

impl<K: Hash + Eq + Copy, V: Clone> AdaptiveCache<K, V> {
    /// An empty cache that holds up to `target_bytes` of values.
    pub fn new(target_bytes: u64) -> AdaptiveCache<K, V> {
        let empty = List {
            head: NIL,
            tail: NIL,
            bytes: 0,
            entries: 0,
        };
        AdaptiveCache {
            map: Default::default(),
            nodes: Vec::new(),
            free_slots: Vec::new(),
            lists: [empty; 4],
            target_bytes,
            mru_target_bytes: target_bytes / 2,
            counters: PolicyCounters::default(),
        }
    }

    /// Bytes of cached values.
    pub fn bytes(&self) -> u64 {
        self.lists[ListId::Mru as usize].bytes + self.lists[ListId::Mfu as usize].bytes
    }

    /// Cached values (ghosts not counted).
    pub fn len(&self) -> u64 {
        self.lists[ListId::Mru as usize].entries + self.lists[ListId::Mfu as usize].entries
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn target_bytes(&self) -> u64 {
        self.target_bytes
    }

    /// The adaptive target of `T1` (ARC's `p`).
    pub fn mru_target_bytes(&self) -> u64 {
        self.mru_target_bytes
    }

    pub fn counters(&self) -> PolicyCounters {
        self.counters
    }

    pub fn list_sizes(&self) -> ListSizes {
        let list = |id: ListId| self.lists[id as usize];
        ListSizes {
            mru_bytes: list(ListId::Mru).bytes,
            mru_entries: list(ListId::Mru).entries,
            mfu_bytes: list(ListId::Mfu).bytes,
            mfu_entries: list(ListId::Mfu).entries,
            mru_ghost_bytes: list(ListId::MruGhost).bytes,
            mru_ghost_entries: list(ListId::MruGhost).entries,
            mfu_ghost_bytes: list(ListId::MfuGhost).bytes,
            mfu_ghost_entries: list(ListId::MfuGhost).entries,
        }
    }

    /// Which list `key` is on, if any (ghosts included).
    pub fn list_of(&self, key: &K) -> Option<ListId> {
        self.map
            .get(key)
            .map(|&slot| self.nodes[slot as usize].list)
    }

    /// The value of `key` without counting an access (a prefetch checking
    /// whether it has work, a check that a value is still current).
    pub fn peek(&self, key: &K) -> Option<&V> {
        self.value_at(self.find(key)?)
    }

    /// Where `key`'s entry (value or ghost) is: one hash probe, for a caller
    /// that looks at the entry and then acts on it (the read cache's hit
    /// path checks the value is current, whether it was read ahead, then
    /// counts the access: three probes of a map of up to millions of keys
    /// per cached read, a tenth of a cached 4K read's CPU, before this).
    /// The place is valid until the next change of the cache: use it with
    /// the `_at` methods right away.
    pub fn find(&self, key: &K) -> Option<Slot> {
        self.map.get(key).map(|&slot| Slot(slot))
    }

    /// The value at `slot` (`None`: a ghost), without counting an access.
    pub fn value_at(&self, slot: Slot) -> Option<&V> {
        self.node_at(slot).value.as_ref()
    }

    /// True when the entry at `slot` was read ahead and no demand read has
    /// used it yet.
    pub fn prefetched_at(&self, slot: Slot) -> bool {
        self.node_at(slot).prefetched
    }

    fn node_at(&self, slot: Slot) -> &Node<K, V> {
        self.debug_check_slot(slot);
        &self.nodes[slot.0 as usize]
    }

    /// A place found before the cache changed may name another key's entry,
    /// or a free one: debug builds check it still names its own.
    fn debug_check_slot(&self, slot: Slot) {
        debug_assert_eq!(
            self.map.get(&self.nodes[slot.0 as usize].key),
            Some(&slot.0),
            "a slot is used after the cache changed"
        );
    }

    /// The value of `key` to change in place, without counting an access.
    /// The caller keeps its size: the lists are charged what it was
    /// inserted with.
    pub fn peek_mut(&mut self, key: &K) -> Option<&mut V> {
        let slot = *self.map.get(key)?;
        self.nodes[slot as usize].value.as_mut()
    }

    /// True when `key` holds an entry read ahead that no demand read has
    /// used yet.
    pub fn is_prefetched(&self, key: &K) -> bool {
        self.find(key).is_some_and(|slot| self.prefetched_at(slot))
    }

    /// The value of `key`, counting a demand access at `now_ns` (see the
    /// module's rules for when that promotes).
    pub fn get(&mut self, key: &K, now_ns: u64) -> Option<V> {
        let slot = self.find(key)?;
        self.get_at(slot, now_ns)
    }

    /// [`AdaptiveCache::get`] of the entry at `slot` (from [`AdaptiveCache::find`]).
    pub fn get_at(&mut self, slot: Slot, now_ns: u64) -> Option<V> {
        self.debug_check_slot(slot);
        let slot = slot.0;
        let node = &mut self.nodes[slot as usize];
        let value = node.value.clone()?;
        let to = match node.list {
            ListId::Mru if node.prefetched => {
                node.prefetched = false;
                node.last_access_ns = now_ns;
                Some(ListId::Mru)
            }
            ListId::Mru if now_ns.saturating_sub(node.last_access_ns) >= PROMOTE_AFTER_NS => {
                node.last_access_ns = now_ns;
                self.counters.promotions += 1;
                Some(ListId::Mfu)
            }
            ListId::Mru => None,
            ListId::Mfu => {
                node.last_access_ns = now_ns;
                Some(ListId::Mfu)
            }
            ListId::MruGhost | ListId::MfuGhost => return None,
        };
        if let Some(to) = to {
            self.move_to(slot, to);
        }
        Some(value)
    }

    /// Caches `value` (of `bytes`) under `key`, a miss just read (or a
    /// prefetch), replacing any value there; returns what had to be evicted
    /// to stay within the target.
    pub fn insert(
        &mut self,
        key: K,
        value: V,
        bytes: u64,
        now_ns: u64,
        prefetched: bool,
    ) -> Vec<Evicted<V>> {
        let mut list = ListId::Mru;
        if let Some(&slot) = self.map.get(&key) {
            let old = self.nodes[slot as usize].list;
            match old {
                ListId::MruGhost => {
                    self.counters.mru_ghost_hits += 1;
                    let ratio = (self.lists[ListId::MfuGhost as usize].bytes
                        / self.lists[ListId::MruGhost as usize].bytes.max(1))
                    .max(1);
                    self.mru_target_bytes = (self.mru_target_bytes + ratio.saturating_mul(bytes))
                        .min(self.target_bytes);
                    list = ListId::Mfu;
                }
                ListId::MfuGhost => {
                    self.counters.mfu_ghost_hits += 1;
                    let ratio = (self.lists[ListId::MruGhost as usize].bytes
                        / self.lists[ListId::MfuGhost as usize].bytes.max(1))
                    .max(1);
                    self.mru_target_bytes = self
                        .mru_target_bytes
                        .saturating_sub(ratio.saturating_mul(bytes));
                    list = ListId::Mfu;
                }
                // Replaced in place (a read raced another): keep its list.
                live => list = live,
            }
            self.remove_slot(slot);
        }
        // A prefetched block has not been read yet: it starts in T1 whatever
        // its history, so its first demand read is its first access.
        if prefetched {
            list = ListId::Mru;
        }
        let slot = self.allocate(Node {
            key,
            value: Some(value),
            bytes,
            list,
            prev: NIL,
            next: NIL,
            last_access_ns: now_ns,
            prefetched,
        });
        self.map.insert(key, slot);
        self.push_front(slot, list);
        self.evict_to_target()
    }

    /// The keys of the cached values (ghosts have none) that `select` picks.
    pub fn keys_where(&self, select: impl Fn(&V) -> bool) -> Vec<K> {
        self.map
            .iter()
            .filter(|(_, slot)| {
                self.nodes[**slot as usize]
                    .value
                    .as_ref()
                    .is_some_and(&select)
            })
            .map(|(key, _)| *key)
            .collect()
    }

    /// Drops `key` (its block was freed, or its value is stale), ghost or not;
    /// true if a value was cached.
    pub fn remove(&mut self, key: &K) -> Option<V> {
        let slot = self.find(key)?;
        self.remove_at(slot)
    }

    /// [`AdaptiveCache::remove`] of the entry at `slot` (from [`AdaptiveCache::find`]).
    pub fn remove_at(&mut self, slot: Slot) -> Option<V> {
        self.debug_check_slot(slot);
        let value = self.nodes[slot.0 as usize].value.take();
        self.remove_slot(slot.0);
        value
    }

    /// Sets the target (a tunable changed, or memory is short) and evicts
    /// down to it.
    pub fn set_target(&mut self, target_bytes: u64) -> Vec<Evicted<V>> {
        self.target_bytes = target_bytes;
        self.mru_target_bytes = self.mru_target_bytes.min(target_bytes);
        self.evict_to_target()
    }

    fn evict_to_target(&mut self) -> Vec<Evicted<V>> {
        let mut evicted = Vec::new();
        while self.bytes() > self.target_bytes {
            let mru = self.lists[ListId::Mru as usize];
            let mfu = self.lists[ListId::Mfu as usize];
            let from = if mru.entries > 0 && (mru.bytes > self.mru_target_bytes || mfu.entries == 0)
            {
                ListId::Mru
            } else {
                ListId::Mfu
            };
            let slot = self.lists[from as usize].tail;
            if slot == NIL {
                break;
            }
            let ghost = if from == ListId::Mru {
                ListId::MruGhost
            } else {
                ListId::MfuGhost
            };
            let node = &mut self.nodes[slot as usize];
            let value = node.value.take().expect("live entries hold a value");
            let bytes = node.bytes;
            let prefetched = node.prefetched;
            node.prefetched = false;
            self.counters.evictions += 1;
            self.counters.evicted_bytes += bytes;
            if prefetched {
                self.counters.prefetch_unused += 1;
                self.counters.prefetch_unused_bytes += bytes;
            }
            self.move_to(slot, ghost);
            evicted.push(Evicted {
                value,
                bytes,
                prefetched,
            });
        }
        self.trim_ghosts();
        evicted
    }

    /// Keeps `T1 + B1` within the target and all four lists within twice it
    /// (in bytes, as ARC does), and the ghosts within [`GHOSTS_MAX`].
    fn trim_ghosts(&mut self) {
        let list = |cache: &Self, id: ListId| cache.lists[id as usize];
        loop {
            let mru = list(self, ListId::Mru);
            let mru_ghost = list(self, ListId::MruGhost);
            let mfu_ghost = list(self, ListId::MfuGhost);
            let all = self.bytes() + mru_ghost.bytes + mfu_ghost.bytes;
            let ghosts = (mru_ghost.entries + mfu_ghost.entries) as usize;
            let victim = if mru_ghost.entries > 0 && mru.bytes + mru_ghost.bytes > self.target_bytes
            {
                ListId::MruGhost
            } else if all > self.target_bytes.saturating_mul(2) || ghosts > GHOSTS_MAX {
                if mfu_ghost.entries > 0 {
                    ListId::MfuGhost
                } else if mru_ghost.entries > 0 {
                    ListId::MruGhost
                } else {
                    break;
                }
            } else {
                break;
            };
            let slot = self.lists[victim as usize].tail;
            self.remove_slot(slot);
        }
    }

    fn allocate(&mut self, node: Node<K, V>) -> u32 {
        match self.free_slots.pop() {
            Some(slot) => {
                self.nodes[slot as usize] = node;
                slot
            }
            None => {
                self.nodes.push(node);
                (self.nodes.len() - 1) as u32
            }
        }
    }

    /// Unlinks and forgets a slot (its value, if any, is dropped).
    fn remove_slot(&mut self, slot: u32) {
        self.unlink(slot);
        let node = &mut self.nodes[slot as usize];
        node.value = None;
        let key = node.key;
        self.map.remove(&key);
        self.free_slots.push(slot);
    }

    fn move_to(&mut self, slot: u32, list: ListId) {
        self.unlink(slot);
        self.nodes[slot as usize].list = list;
        self.push_front(slot, list);
    }

    fn push_front(&mut self, slot: u32, id: ListId) {
        let bytes = self.nodes[slot as usize].bytes;
        let list = &mut self.lists[id as usize];
        let old_head = list.head;
        list.head = slot;
        if list.tail == NIL {
            list.tail = slot;
        }
        list.bytes += bytes;
        list.entries += 1;
        let node = &mut self.nodes[slot as usize];
        node.prev = NIL;
        node.next = old_head;
        node.list = id;
        if old_head != NIL {
            self.nodes[old_head as usize].prev = slot;
        }
    }

    fn unlink(&mut self, slot: u32) {
        let (prev, next, id, bytes) = {
            let node = &self.nodes[slot as usize];
            (node.prev, node.next, node.list, node.bytes)
        };
        if prev != NIL {
            self.nodes[prev as usize].next = next;
        } else {
            self.lists[id as usize].head = next;
        }
        if next != NIL {
            self.nodes[next as usize].prev = prev;
        } else {
            self.lists[id as usize].tail = prev;
        }
        let list = &mut self.lists[id as usize];
        list.bytes -= bytes;
        list.entries -= 1;
        let node = &mut self.nodes[slot as usize];
        node.prev = NIL;
        node.next = NIL;
        debug_assert!(!node.list.is_ghost() || node.value.is_none());
    }
}

#[cfg(test)]
impl<K: Hash + Eq + Copy, V: Clone> AdaptiveCache<K, V> {
    /// Walks every list and checks its links, counts and bytes, and that the
    /// map names exactly the linked nodes.
    pub(crate) fn check_invariants(&self) {
        let mut linked = 0usize;
        for id in [ListId::Mru, ListId::Mfu, ListId::MruGhost, ListId::MfuGhost] {
            let list = self.lists[id as usize];
            let (mut bytes, mut entries, mut previous, mut slot) = (0, 0, NIL, list.head);
            while slot != NIL {
                let node = &self.nodes[slot as usize];
                assert_eq!(node.list, id);
                assert_eq!(node.prev, previous);
                assert_eq!(node.value.is_some(), !id.is_ghost());
                assert_eq!(self.map.get(&node.key), Some(&slot));
                bytes += node.bytes;
                entries += 1;
                previous = slot;
                slot = node.next;
            }
            assert_eq!(list.tail, previous);
            assert_eq!((list.bytes, list.entries), (bytes, entries));
            linked += entries as usize;
        }
        assert_eq!(linked, self.map.len());
        assert!(self.mru_target_bytes <= self.target_bytes);
    }
}

#[cfg(test)]
mod tests;
