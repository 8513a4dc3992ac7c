//! Buffers for direct I/O.
//!
//! Devices are opened O_DIRECT, so every buffer handed to the kernel must be aligned
//! in memory and sized to the device's logical sector. [`AlignedBuf`] is a heap
//! buffer aligned to [`BUFFER_ALIGNMENT_BYTES`]. Buffers shared by several I/Os at
//! once (a block written to every side of a mirror) are `Rc<AlignedBuf>`; a piece of
//! one is a [`BufSlice`], so an NBD payload is cut into blocks without copying.

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::ops::{Deref, DerefMut, Range};
use std::ptr::NonNull;
use std::rc::Rc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Alignment of every I/O buffer: the page size, which covers any logical sector
/// size up to 4 KiB and lets the kernel pin pages without splitting.
pub const BUFFER_ALIGNMENT_BYTES: usize = 4096;

/// Smallest and largest capacities kept for reuse (4 KiB .. 1 MiB, by powers of
/// two): the sizes of blocks, payloads and aggregated I/Os.
const POOL_CLASS_MIN_SHIFT: u32 = 12;
const POOL_CLASS_MAX_SHIFT: u32 = 20;
/// Bytes of free buffers kept per size class: what write-back frees at once
/// and takes again as new writes arrive (4 batches of 4 MiB of blocks in
/// flight, with their RAID-Z parity). At 8 MiB most of it went back to the
/// allocator, and parity was generated into new, zeroed buffers: on raidz2 of
/// 6 with 16K random writes, alternating runs (6 at 8 MiB, 9 at 32 MiB) used
/// 15.4 against 14.2 us of engine CPU per write (59.4k against 63.0k IOPS),
/// and parity generation fell from 7.4% to 4.9% of the engine's samples.
const POOL_CLASS_BYTES_MAX: usize = 32 * 1024 * 1024;
/// Bytes of free buffers kept in all classes together: a busy class may keep
/// its share, but idle buffers never hold more than this.
const POOL_BYTES_MAX: usize = 64 * 1024 * 1024;

/// Bytes of free buffers listed in all classes.
static POOLED_BYTES: AtomicUsize = AtomicUsize::new(0);

/// Bytes of fresh buffers the warmer (see [`start_buffer_warmer`]) keeps
/// listed in a class that ran dry: 32 MiB (the class's own bound) is what
/// a reader filling the read cache at 1 GiB/s takes in 32 ms, four of the
/// warmer's sleeps (8 MiB measured the same within noise: 1M sequential
/// reads at QD1 at 622-964 against 642-1,058 MiB/s).
const WARM_CLASS_BYTES: usize = 32 << 20;
/// How long a class may keep free buffers listed that nobody takes: after
/// that the warmer gives them back to the allocator. The pool's bound
/// ([`POOL_BYTES_MAX`]) is shared, and classes that a start-up, a prefill or
/// an earlier workload filled held all of it: under 16K random volume
/// writes, idle 4K and 256K buffers (31 and 32 MiB) left the 16K class 54
/// buffers, so nearly every payload was a fresh, zeroed allocation (memset
/// alone 3.8% of the engine's samples) and every write-out freed to the
/// allocator. A second is many thousand takes of a busy class, and an idle
/// class costs one allocation per buffer when it wakes.
const IDLE_CLASS_TRIM_INTERVAL: std::time::Duration = std::time::Duration::from_secs(1);
/// Takes (hits and misses) per class since the warmer last trimmed.
static POOL_TAKES: [AtomicUsize; POOL_CLASSES] = [const { AtomicUsize::new(0) }; POOL_CLASSES];
/// Takes from an empty class since the warmer last looked, per class.
static POOL_MISSES: [AtomicUsize; POOL_CLASSES] = [const { AtomicUsize::new(0) }; POOL_CLASSES];
/// Wakes the warmer when a class runs dry.
static WARMER: std::sync::OnceLock<(std::sync::Mutex<()>, std::sync::Condvar)> =
    std::sync::OnceLock::new();

/// Starts (once per process) a thread that keeps buffers ready in the size
/// classes the engine takes new buffers from. A new buffer's pages are
/// faulted in the first time they are touched, and on a virtual machine a
/// fault costs microseconds: while the read cache grows, every block read
/// needs a new buffer, and on the engine's thread 1 MiB sequential reads at
/// QD1 ran at 320-870 MiB/s against 1,200-1,300 once the cache recycled
/// its buffers. The warmer takes those faults on another thread. It only
/// fills classes that ran dry, up to [`WARM_CLASS_BYTES`] each and within
/// the pool's bounds, so idle memory stays bounded as before.
pub fn start_buffer_warmer() {
    let mut started = false;
    WARMER.get_or_init(|| {
        started = true;
        (std::sync::Mutex::new(()), std::sync::Condvar::new())
    });
    if !started {
        return;
    }
    let spawned = std::thread::Builder::new()
        .name("ironpool-bufwarm".into())
        .spawn(|| {
            let (lock, wake) = WARMER.get().expect("set above");
            let mut last_trim = std::time::Instant::now();
            loop {
                let guard = match lock.lock() {
                    Ok(guard) => guard,
                    Err(poisoned) => poisoned.into_inner(),
                };
                let _ = wake.wait_timeout(guard, std::time::Duration::from_millis(8));
                if last_trim.elapsed() >= IDLE_CLASS_TRIM_INTERVAL {
                    last_trim = std::time::Instant::now();
                    trim_idle_classes();
                }
                for (class, misses) in POOL_MISSES.iter().enumerate() {
                    if misses.swap(0, Ordering::Relaxed) > 0 {
                        warm_class(class);
                    }
                }
            }
        });
    if let Err(error) = spawned {
        eprintln!("ironpool: buffer warmer not started: {error}");
    }
}

/// Gives back to the allocator the listed buffers of every class nobody took
/// from since the last trim (see [`IDLE_CLASS_TRIM_INTERVAL`]), so that the
/// pool's shared bound goes to the classes in use.
fn trim_idle_classes() {
    for (class, takes) in POOL_TAKES.iter().enumerate() {
        if takes.swap(0, Ordering::Relaxed) > 0 {
            continue;
        }
        let capacity = 1usize << (class as u32 + POOL_CLASS_MIN_SHIFT);
        let idle = with_pool_class(class, std::mem::take);
        if idle.is_empty() {
            continue;
        }
        POOLED_BYTES.fetch_sub(idle.len() * capacity, Ordering::Relaxed);
        for FreeBuffer(pointer) in idle {
            // SAFETY: listed buffers were allocated in this module with the
            // layout of their class's capacity, and the pool owned them.
            unsafe { dealloc(pointer.as_ptr(), AlignedBuf::layout(capacity)) };
        }
    }
}

/// Lists fresh buffers, their pages touched, in `class` up to
/// [`WARM_CLASS_BYTES`] (or the pool's bounds).
fn warm_class(class: usize) {
    let capacity = 1usize << (class as u32 + POOL_CLASS_MIN_SHIFT);
    loop {
        let listed = with_pool_class(class, |free| free.len() * capacity);
        if listed + capacity > WARM_CLASS_BYTES.min(POOL_CLASS_BYTES_MAX)
            || POOLED_BYTES.load(Ordering::Relaxed) + capacity > POOL_BYTES_MAX
        {
            return;
        }
        let layout = AlignedBuf::layout(capacity);
        // SAFETY: the layout has non-zero size.
        let raw = unsafe { alloc_zeroed(layout) };
        let Some(pointer) = NonNull::new(raw) else {
            return;
        };
        // Touch every page so it is faulted in here, not on the engine.
        for page in (0..capacity).step_by(BUFFER_ALIGNMENT_BYTES) {
            // SAFETY: within the allocation; a volatile write of the zero
            // it holds, which the compiler may not drop.
            unsafe { std::ptr::write_volatile(raw.add(page), 0) };
        }
        // Dropping lists it (or frees it if the bounds were reached).
        drop(AlignedBuf {
            pointer,
            length: capacity,
            capacity,
        });
    }
}

/// A free buffer's address (the pool owns the allocation while it is listed).
struct FreeBuffer(NonNull<u8>);

// SAFETY: a listed buffer is owned by the pool alone; moving its address between
// threads moves that ownership.
unsafe impl Send for FreeBuffer {}

const POOL_CLASSES: usize = (POOL_CLASS_MAX_SHIFT - POOL_CLASS_MIN_SHIFT + 1) as usize;

/// Free buffers by size class, shared by the threads (the NBD front end
/// allocates payload buffers that the engine thread frees, and the engine reads
/// blocks into buffers the front end frees). Reusing them spares an allocation,
/// a memset and page faults per I/O; their old contents are initialised bytes,
/// so handing one out for overwriting is sound.
static FREE_BUFFERS: [std::sync::Mutex<Vec<FreeBuffer>>; POOL_CLASSES] =
    [const { std::sync::Mutex::new(Vec::new()) }; POOL_CLASSES];

fn with_pool_class<R>(class: usize, f: impl FnOnce(&mut Vec<FreeBuffer>) -> R) -> R {
    let mut free = match FREE_BUFFERS[class].lock() {
        Ok(guard) => guard,
        Err(poisoned) => poisoned.into_inner(),
    };
    f(&mut free)
}

fn pool_class(capacity: usize) -> Option<usize> {
    if !capacity.is_power_of_two() {
        return None;
    }
    let shift = capacity.trailing_zeros();
    (POOL_CLASS_MIN_SHIFT..=POOL_CLASS_MAX_SHIFT)
        .contains(&shift)
        .then(|| (shift - POOL_CLASS_MIN_SHIFT) as usize)
}

/// A heap buffer aligned for O_DIRECT. The length is fixed at allocation.
pub struct AlignedBuf {
    pointer: NonNull<u8>,
    length: usize,
    capacity: usize,
}

// SAFETY: AlignedBuf uniquely owns its allocation, like Vec<u8>.
unsafe impl Send for AlignedBuf {}

impl AlignedBuf {
    fn layout(capacity: usize) -> Layout {
        // The capacity is always at least one alignment unit, so the layout is
        // never zero-sized; from_size_align only fails on overflow, which would be
        // a request far beyond any limit this engine allows.
        Layout::from_size_align(capacity, BUFFER_ALIGNMENT_BYTES)
            .expect("buffer size overflows a Layout")
    }

    fn capacity_for(length: usize) -> usize {
        let capacity = length.div_ceil(BUFFER_ALIGNMENT_BYTES).max(1) * BUFFER_ALIGNMENT_BYTES;
        // Round pool-sized buffers up to their class so they can be reused.
        if capacity <= 1 << POOL_CLASS_MAX_SHIFT {
            capacity.next_power_of_two()
        } else {
            capacity
        }
    }

    /// A recycled buffer of exactly `capacity`, if one is free.
    fn recycled(capacity: usize, length: usize) -> Option<AlignedBuf> {
        let class = pool_class(capacity)?;
        POOL_TAKES[class].fetch_add(1, Ordering::Relaxed);
        let Some(FreeBuffer(pointer)) = with_pool_class(class, |free| free.pop()) else {
            if POOL_MISSES[class].fetch_add(1, Ordering::Relaxed) == 0 {
                if let Some((_, wake)) = WARMER.get() {
                    wake.notify_one();
                }
            }
            return None;
        };
        POOLED_BYTES.fetch_sub(capacity, Ordering::Relaxed);
        Some(AlignedBuf {
            pointer,
            length,
            capacity,
        })
    }

    /// A zero-filled buffer of `length` bytes.
    pub fn zeroed(length: usize) -> AlignedBuf {
        let capacity = Self::capacity_for(length);
        if let Some(mut buffer) = Self::recycled(capacity, length) {
            buffer.fill(0);
            return buffer;
        }
        // SAFETY: the layout has non-zero size.
        let raw = unsafe { alloc_zeroed(Self::layout(capacity)) };
        let pointer = NonNull::new(raw)
            .unwrap_or_else(|| std::alloc::handle_alloc_error(Self::layout(capacity)));
        AlignedBuf {
            pointer,
            length,
            capacity,
        }
    }

    /// A buffer the caller is about to overwrite completely (a read target, a
    /// payload being received). A recycled buffer keeps its old bytes (callers
    /// overwrite all of them before use, and a buffer is only recycled within this
    /// process); a new one is zeroed, as uninitialised memory may not be read.
    pub fn for_overwrite(length: usize) -> AlignedBuf {
        let capacity = Self::capacity_for(length);
        Self::recycled(capacity, length).unwrap_or_else(|| AlignedBuf::zeroed(length))
    }

    /// A buffer holding a copy of `bytes`.
    pub fn copy_from(bytes: &[u8]) -> AlignedBuf {
        let mut buffer = AlignedBuf::for_overwrite(bytes.len());
        buffer.copy_from_slice(bytes);
        buffer
    }

    pub fn len(&self) -> usize {
        self.length
    }

    pub fn is_empty(&self) -> bool {
        self.length == 0
    }

    /// Shortens the buffer (the allocation is kept).
    pub fn truncate(&mut self, length: usize) {
        assert!(length <= self.length);
        self.length = length;
    }

    pub fn as_ptr(&self) -> *const u8 {
        self.pointer.as_ptr()
    }

    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.pointer.as_ptr()
    }

    /// Shares the buffer for several concurrent readers (writes to a mirror).
    pub fn into_shared(self) -> Rc<AlignedBuf> {
        Rc::new(self)
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        if let Some(class) = pool_class(self.capacity) {
            let capacity = self.capacity;
            let pointer = self.pointer;
            let kept = with_pool_class(class, |free| {
                let listed = (free.len() + 1) * capacity <= POOL_CLASS_BYTES_MAX
                    && POOLED_BYTES
                        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |bytes| {
                            (bytes + capacity <= POOL_BYTES_MAX).then_some(bytes + capacity)
                        })
                        .is_ok();
                if listed {
                    free.push(FreeBuffer(pointer));
                    true
                } else {
                    false
                }
            });
            if kept {
                return;
            }
        }
        // SAFETY: allocated in this module with this exact layout.
        unsafe { dealloc(self.pointer.as_ptr(), Self::layout(self.capacity)) };
    }
}

impl Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: pointer is valid for `length` initialised bytes (zeroed at allocation).
        unsafe { std::slice::from_raw_parts(self.pointer.as_ptr(), self.length) }
    }
}

impl DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above, and we hold &mut self.
        unsafe { std::slice::from_raw_parts_mut(self.pointer.as_ptr(), self.length) }
    }
}

impl std::fmt::Debug for AlignedBuf {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(formatter, "AlignedBuf({} bytes)", self.length)
    }
}

/// A read-only range of a shared buffer: one block of a larger NBD payload, or the
/// part of a block a client asked to read.
#[derive(Clone)]
pub struct BufSlice {
    buffer: Rc<AlignedBuf>,
    range: Range<usize>,
}

impl BufSlice {
    pub fn new(buffer: Rc<AlignedBuf>, range: Range<usize>) -> BufSlice {
        assert!(
            range.start <= range.end && range.end <= buffer.len(),
            "slice {range:?} outside a buffer of {}",
            buffer.len()
        );
        BufSlice { buffer, range }
    }

    /// True when `other` is this very slice of this very buffer (not merely
    /// equal bytes): a held block still holds the bytes someone took.
    pub fn same_bytes_as(&self, other: &BufSlice) -> bool {
        Rc::ptr_eq(&self.buffer, &other.buffer) && self.range == other.range
    }

    /// Length of the whole buffer this slice is part of: the memory whoever
    /// keeps the slice keeps (the read cache is charged it).
    pub fn buffer_len(&self) -> usize {
        self.buffer.len()
    }

    pub fn whole(buffer: Rc<AlignedBuf>) -> BufSlice {
        let length = buffer.len();
        BufSlice {
            buffer,
            range: 0..length,
        }
    }

    pub fn len(&self) -> usize {
        self.range.len()
    }

    pub fn is_empty(&self) -> bool {
        self.range.is_empty()
    }

    /// A sub-range, relative to this slice.
    pub fn slice(&self, range: Range<usize>) -> BufSlice {
        assert!(range.end <= self.len());
        BufSlice {
            buffer: self.buffer.clone(),
            range: self.range.start + range.start..self.range.start + range.end,
        }
    }

    pub fn as_ptr(&self) -> *const u8 {
        // SAFETY: range.start is within the allocation.
        unsafe { self.buffer.as_ptr().add(self.range.start) }
    }

    /// `bytes` as a slice of this one, when they lie inside it (a request's
    /// payload, parsed as plain bytes, found again in the buffer the request
    /// was read into, so it can be kept or written without a copy).
    pub fn slice_holding(&self, bytes: &[u8]) -> Option<BufSlice> {
        let start = (bytes.as_ptr() as usize).checked_sub(self.as_ptr() as usize)?;
        let end = start.checked_add(bytes.len())?;
        (end <= self.len()).then(|| self.slice(start..end))
    }

    /// The whole buffer back, when this slice holds its only reference: a
    /// request buffer lent to the requests it carried (their blocks were
    /// written from it without a copy) returns to its pool for the next
    /// read. None when something still holds a slice of it.
    pub fn try_into_buffer(self) -> Option<AlignedBuf> {
        Rc::try_unwrap(self.buffer).ok()
    }

    /// The buffer and range, owned (to hand to another thread): the buffer itself
    /// when this slice holds the only reference, else a copy of the range.
    pub fn into_owned(self) -> (AlignedBuf, Range<usize>) {
        match Rc::try_unwrap(self.buffer) {
            Ok(buffer) => (buffer, self.range),
            Err(shared) => {
                let copy = AlignedBuf::copy_from(&shared[self.range.clone()]);
                let length = copy.len();
                (copy, 0..length)
            }
        }
    }
}

impl Deref for BufSlice {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.buffer[self.range.clone()]
    }
}

impl std::fmt::Debug for BufSlice {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(formatter, "BufSlice({:?})", self.range)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_aligned_and_zeroed() {
        for length in [0, 1, 511, 4096, 4097, 65536] {
            let buffer = AlignedBuf::zeroed(length);
            assert_eq!(buffer.as_ptr() as usize % BUFFER_ALIGNMENT_BYTES, 0);
            assert_eq!(buffer.len(), length);
            assert!(buffer.iter().all(|byte| *byte == 0));
        }
    }

    #[test]
    fn free_buffers_kept_stay_within_their_class_and_total_limits() {
        // Three classes' worth of buffers freed at once: each class keeps at
        // most its share and all of them at most the total (other tests of this
        // process may have listed buffers too); the rest is returned to the
        // allocator.
        let classes = [1 << 20, 512 << 10, 256 << 10];
        let buffers: Vec<Vec<AlignedBuf>> = classes
            .iter()
            .map(|&size| {
                (0..2 * POOL_CLASS_BYTES_MAX / size)
                    .map(|_| AlignedBuf::for_overwrite(size))
                    .collect()
            })
            .collect();
        drop(buffers);
        let listed: Vec<usize> = classes
            .iter()
            .map(|&size| with_pool_class(pool_class(size).unwrap(), |free| free.len() * size))
            .collect();
        assert!(
            listed.iter().all(|&bytes| bytes <= POOL_CLASS_BYTES_MAX),
            "{listed:?}"
        );
        assert!(POOLED_BYTES.load(Ordering::Relaxed) <= POOL_BYTES_MAX);
        assert!(listed.iter().sum::<usize>() <= POOL_BYTES_MAX, "{listed:?}");
    }

    #[test]
    fn idle_classes_give_their_buffers_back() {
        // Other tests of this process share the pool: retry until one round
        // runs clean (buffers listed, then nobody takes from the class
        // across two trims).
        let size = 8192;
        let class = pool_class(size).unwrap();
        for _ in 0..50 {
            trim_idle_classes();
            trim_idle_classes();
            drop(
                (0..4)
                    .map(|_| AlignedBuf::for_overwrite(size))
                    .collect::<Vec<_>>(),
            );
            let listed = with_pool_class(class, |free| free.len());
            // The takes above keep the class through the next trim.
            trim_idle_classes();
            let kept = with_pool_class(class, |free| free.len());
            trim_idle_classes();
            let after_idle = with_pool_class(class, |free| free.len());
            if listed > 0 && kept == listed && after_idle == 0 {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        panic!("an idle class kept its buffers across two trims");
    }

    #[test]
    fn slices_share_without_copying() {
        let mut buffer = AlignedBuf::zeroed(8192);
        buffer[4096] = 7;
        let shared = buffer.into_shared();
        let second = BufSlice::new(shared.clone(), 4096..8192);
        assert_eq!(second[0], 7);
        // SAFETY: the shared buffer is 8192 bytes long, so 4096 is in bounds.
        assert_eq!(second.as_ptr(), unsafe { shared.as_ptr().add(4096) });
        assert_eq!(second.slice(0..1)[0], 7);
    }
}
