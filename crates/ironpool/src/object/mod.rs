//! Objects: copy-on-write trees of block pointers.
//!
//! An object's dnode holds the root pointer; level-L nodes are indirect blocks of
//! block pointers; level 0 holds data. Nodes are cached in memory by logical
//! position `(level, blkid)`: a cached node is authoritative over the pointer to it
//! in its parent (a dirty node's on-disk copy is stale). Changing a pointer dirties
//! the node and every ancestor; at txg sync the dirty nodes are written bottom-up
//! to new locations (copy-on-write), each parent taking the new pointer, and the old
//! copies are freed.
//!
//! Two kinds of objects use this:
//! - metadata objects (dnode table, directory, space maps, metaslab arrays): their
//!   data blocks are cached and dirtied in memory too (`read_bytes`/`write_bytes`);
//! - volume data: data blocks are written straight to their new location by the
//!   caller (direct I/O) and only the pointer is linked here (`set_block_pointer`).

mod bonus;
pub mod sync;

use std::cell::{Cell, RefCell};
use std::collections::BTreeSet;
use std::rc::Rc;

use crate::block::{BlockError, BlockStore};
use crate::format::bp::BLOCK_POINTER_BYTES;
use crate::format::dnode::DNODE_BYTES;
use crate::format::{BlockPointer, Dnode, FormatError, ObjectType};
use crate::queue::IoClass;

/// Why an object operation failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ObjectError {
    #[error(transparent)]
    Block(#[from] BlockError),
    #[error("damaged metadata in object {object}: {error}")]
    Corrupt { object: u64, error: FormatError },
    #[error("object {0} does not exist")]
    NoSuchObject(u64),
    #[error("offset {offset} is beyond the largest object size")]
    TooLarge { offset: u64 },
    #[error("node {level}/{blkid} of metadata object {object} is not cached (a bug: metadata objects stay cached)")]
    NotCached { object: u64, level: u8, blkid: u64 },
    /// A sealed block met while its dataset's key is not loaded.
    #[error("object {object} is encrypted and its key is not loaded")]
    KeyUnavailable { object: u64 },
    /// A sealed block whose MAC failed (its checksum, over the ciphertext,
    /// held: it was altered with its checksum forged), or that could not
    /// be sealed.
    #[error("object {object}: {error}")]
    Sealing {
        object: u64,
        error: crate::crypto::CryptoError,
    },
}

/// The key an encrypted filesystem's set seals its directories' blocks
/// with: the pool's ring of loaded keys and the guid of the dataset's key.
/// The ring is shared, so an unloaded key is gone for the set at once.
#[derive(Clone)]
pub struct SetKey {
    pub ring: crate::crypto::KeyRing,
    pub guid: u64,
    /// Every object's attributes were sealed from the start (the
    /// filesystem's header says so): one found in the clear is refused
    /// ([`ObjectSet::opened_bonus`]).
    pub sealed_bonuses: bool,
}

/// Whether the level-0 blocks of objects of `object_type` in a set with a
/// key are sealed: a filesystem's directories (their names). Other
/// metadata objects of the set (its unlinked set: object numbers only)
/// stay readable without the key, which import needs; files' and extended
/// attributes' blocks are sealed on the data path (`pool::data`).
fn sealed_type(object_type: crate::format::ObjectType) -> bool {
    object_type == crate::format::ObjectType::FsDirectory
}

enum Lookup {
    Found(Rc<Node>),
    Missing {
        level: u8,
        blkid: u64,
        pointer: BlockPointer,
        /// The cached parent that holds `pointer` (None: the root, in the
        /// dnode). Held while the node is read, and checked after.
        parent: Option<Rc<Node>>,
    },
}

/// The contents of a node under a hole.
fn empty_body(dnode: &Dnode, level: u8) -> NodeBody {
    if level > 0 {
        NodeBody::Indirect(vec![
            BlockPointer::hole(level - 1, dnode.object_type, 0);
            1 << dnode.pointers_per_indirect_shift()
        ])
    } else {
        NodeBody::Data(vec![0u8; dnode.data_block_bytes() as usize])
    }
}

/// A change found by [`ObjectSet::changed_blocks`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlockChange {
    /// Level-0 block `blkid` holds data born after the txg asked about.
    Data { blkid: u64, pointer: BlockPointer },
    /// `count` blocks from `first` became holes after it.
    Holes { first: u64, count: u64 },
}

/// The contents of a cached node.
pub enum NodeBody {
    Indirect(Vec<BlockPointer>),
    Data(Vec<u8>),
}

/// A block handed back to [`ObjectSet::lend_block`] by its borrower.
pub struct Lent<R> {
    /// The block's bytes, as long as they were lent.
    pub bytes: Vec<u8>,
    /// Whether the borrower changed them: the block is dirty then.
    pub changed: bool,
    /// Whether they are sound as the structure the borrower keeps in them
    /// (it checked them, or changed checked bytes by sound changes): the
    /// next reader need not check them again.
    pub checked: bool,
    /// What the borrower found or did.
    pub result: R,
}

/// One cached block of an object's tree.
pub struct Node {
    pub level: u8,
    pub blkid: u64,
    pub body: RefCell<NodeBody>,
    /// Second-chance bit for eviction.
    referenced: Cell<bool>,
    /// The last txg that wrote this node; it may not be evicted before that txg is
    /// durable (its new location may not be written yet).
    synced_txg: Cell<u64>,
    /// A data node whose bytes a reader checked as a structure (a directory
    /// leaf: every entry) since they last changed, or that a writer wrote
    /// whole from a structure it had checked: the next reader need not check
    /// them again ([`ObjectSet::lend_block`]). Any other write clears
    /// it, and a node read in from the devices starts without it.
    checked: Cell<bool>,
}

impl Node {
    fn new(level: u8, blkid: u64, body: NodeBody) -> Rc<Node> {
        Rc::new(Node {
            level,
            blkid,
            body: RefCell::new(body),
            referenced: Cell::new(true),
            synced_txg: Cell::new(0),
            checked: Cell::new(false),
        })
    }

    /// Copies `out.len()` bytes of this data node from `within` on.
    fn copy_data(&self, within: usize, out: &mut [u8]) {
        let body = self.body.borrow();
        let NodeBody::Data(bytes) = &*body else {
            unreachable!("level 0 holds data")
        };
        out.copy_from_slice(&bytes[within..within + out.len()]);
    }

    fn size_bytes(&self) -> usize {
        match &*self.body.borrow() {
            NodeBody::Indirect(pointers) => pointers.len() * BLOCK_POINTER_BYTES,
            NodeBody::Data(bytes) => bytes.len(),
        }
    }
}

/// Block pointers [`ObjectSet::visit_pointers_born_after`] looks at between
/// two turns of the engine's loop: a few nodes' worth, a fraction of a
/// millisecond (the 196k pointers of a 3 GiB volume of 16 KiB blocks,
/// cached, were one 60 ms step of its destroy).
pub const VISIT_POINTERS_PER_TURN: usize = 4096;

/// An object in memory.
pub struct Object {
    pub id: u64,
    pub dnode: RefCell<Dnode>,
    /// The dnode changed (or a node did) since the last sync.
    pub dirty: Cell<bool>,
    nodes: RefCell<rustc_hash::FxHashMap<(u8, u64), Rc<Node>>>,
    dirty_nodes: RefCell<BTreeSet<(u8, u64)>>,
    /// Blocks this (volume) object stopped using in the open txg that a snapshot
    /// or the origin still uses: they go on its dead list at the commit.
    pub dead: RefCell<Vec<BlockPointer>>,
    /// The object holding this volume's dead list (0: none yet).
    pub dead_list: Cell<u64>,
    /// A directory's: the level its last lookup found a leaf at, where the
    /// next starts looking (memory only; any value is correct, only
    /// slower). Names hash evenly, so a directory's leaves sit at one or
    /// two levels, and a lookup that walked down from level 0 read a dozen
    /// holes first in a directory of 100k names.
    pub leaf_level_hint: Cell<u8>,
    /// An authenticated dataset's root object: the portable digest its
    /// MAC was last made or checked over (memory only; None: not known
    /// since the import). A build without the key that finds another
    /// digest says the MAC no longer holds (`pool::txg`'s `renew_mac`).
    pub mac_digest: Cell<Option<crate::format::portable::Digest>>,
}

impl Object {
    pub fn new(id: u64, dnode: Dnode) -> Rc<Object> {
        Rc::new(Object {
            id,
            dnode: RefCell::new(dnode),
            dirty: Cell::new(false),
            nodes: RefCell::default(),
            dirty_nodes: RefCell::default(),
            dead: RefCell::default(),
            dead_list: Cell::new(0),
            leaf_level_hint: Cell::new(0),
            mac_digest: Cell::new(None),
        })
    }

    /// Drops every cached node (the tree was replaced wholesale: rollback,
    /// receive). Returns the bytes released.
    pub fn drop_cached_nodes(&self) -> usize {
        let mut nodes = self.nodes.borrow_mut();
        let bytes = nodes.values().map(|node| node.size_bytes()).sum();
        nodes.clear();
        self.dirty_nodes.borrow_mut().clear();
        bytes
    }

    pub fn dnode(&self) -> Dnode {
        *self.dnode.borrow()
    }

    // The dnode's shape, read in place: `dnode()` copies all 512 bytes of
    // it, and a directory lookup asks for the shape a dozen times.

    /// Levels of the object's block tree.
    pub fn levels(&self) -> u8 {
        self.dnode.borrow().levels
    }

    /// The object's length in bytes.
    pub fn length_bytes(&self) -> u64 {
        self.dnode.borrow().length_bytes
    }

    /// The object's type.
    pub fn object_type(&self) -> ObjectType {
        self.dnode.borrow().object_type
    }

    /// Level-0 blocks the tree's height can address.
    pub fn capacity_blocks(&self) -> u64 {
        self.dnode.borrow().capacity_blocks()
    }

    /// Bytes of one data block.
    pub fn data_block_bytes(&self) -> u64 {
        self.dnode.borrow().data_block_bytes()
    }

    fn pointer_shift(&self) -> u32 {
        self.dnode.borrow().pointers_per_indirect_shift() as u32
    }

    /// blkid at `level` of the node covering level-0 block `blkid`.
    fn ancestor(&self, blkid: u64, level: u8) -> u64 {
        let shift = self.pointer_shift() * level as u32;
        if shift >= 64 {
            0
        } else {
            blkid >> shift
        }
    }

    fn index_in_parent(&self, blkid_at_level: u64) -> usize {
        (blkid_at_level & ((1u64 << self.pointer_shift()) - 1)) as usize
    }

    /// Number of cached nodes and their bytes.
    pub fn cached(&self) -> (usize, usize) {
        let nodes = self.nodes.borrow();
        (
            nodes.len(),
            nodes.values().map(|node| node.size_bytes()).sum(),
        )
    }

    pub fn has_dirty_nodes(&self) -> bool {
        !self.dirty_nodes.borrow().is_empty()
    }
}

/// `offset..end` cut at block boundaries: for each piece, its block id, its
/// offset within the block, its length and its offset in the object (a
/// volume's, or a metadata object's bytes).
pub(crate) fn block_pieces(
    offset: u64,
    end: u64,
    block: u64,
) -> impl Iterator<Item = (u64, usize, usize, u64)> {
    let mut position = offset;
    std::iter::from_fn(move || {
        (position < end).then(|| {
            let within = (position % block) as usize;
            let chunk = (block as usize - within).min((end - position) as usize);
            let piece = (position / block, within, chunk, position);
            position += chunk as u64;
            piece
        })
    })
}

/// Loaded objects past which a load evicts, when `left` stayed after the
/// last eviction and the bound is `max`: a quarter above the larger.
fn evict_threshold(left: usize, max: usize) -> usize {
    let base = left.max(max);
    base.saturating_add(base / 4 + 1)
}

/// All objects of the pool and the cache of their nodes.
pub struct ObjectSet {
    pub store: Rc<BlockStore>,
    objects: RefCell<rustc_hash::FxHashMap<u64, Rc<Object>>>,
    /// Bytes of clean nodes to keep cached; dirty nodes are never evicted.
    cache_budget_bytes: Cell<usize>,
    cached_bytes: Cell<usize>,
    /// The newest durable txg (nodes written after it stay cached).
    durable_txg: Cell<u64>,
    /// Bytes of nodes dirtied since the last txg build (drives early commits and
    /// the write throttle).
    dirty_bytes: Cell<u64>,
    /// A filesystem's set: its table is a dataset whose snapshots may hold
    /// any block of any of its objects ([`ObjectSet::kill`]).
    nested: bool,
    /// Objects to keep loaded at most ([`ObjectSet::set_loaded_max`];
    /// `usize::MAX`: no bound).
    loaded_max: Cell<usize>,
    /// An encrypted filesystem's key ([`sealed_type`] says which blocks it
    /// seals); None for every other set.
    key: RefCell<Option<SetKey>>,
    /// Loaded objects past which [`ObjectSet::open`] evicts: a quarter
    /// above what the last eviction left (or the bound), so a set whose
    /// objects cannot go (changed, in use) is not scanned on every load.
    evict_at: Cell<usize>,
}

impl ObjectSet {
    pub fn new(
        store: Rc<BlockStore>,
        dnode_table: Dnode,
        cache_budget_bytes: usize,
    ) -> Rc<ObjectSet> {
        ObjectSet::with_table(
            store,
            Object::new(0, dnode_table),
            cache_budget_bytes,
            false,
        )
    }

    /// An object set whose dnode table is `table`, an object of another set:
    /// a filesystem's objects live in the tree of one pool-level object. The
    /// two sets share that one `Object`, so its nodes are cached once and
    /// what this set writes into it is what the outer set syncs.
    pub fn nested(
        store: Rc<BlockStore>,
        table: Rc<Object>,
        cache_budget_bytes: usize,
    ) -> Rc<ObjectSet> {
        ObjectSet::with_table(store, table, cache_budget_bytes, true)
    }

    fn with_table(
        store: Rc<BlockStore>,
        table: Rc<Object>,
        cache_budget_bytes: usize,
        nested: bool,
    ) -> Rc<ObjectSet> {
        let set = Rc::new(ObjectSet {
            store,
            objects: RefCell::default(),
            cache_budget_bytes: Cell::new(cache_budget_bytes),
            cached_bytes: Cell::new(0),
            durable_txg: Cell::new(0),
            dirty_bytes: Cell::new(0),
            nested,
            loaded_max: Cell::new(usize::MAX),
            key: RefCell::new(None),
            evict_at: Cell::new(usize::MAX),
        });
        set.objects.borrow_mut().insert(0, table);
        set
    }

    /// Makes the set seal and open its directories' blocks with `key` (an
    /// encrypted filesystem's set, when it is opened).
    pub fn set_key(&self, key: SetKey) {
        *self.key.borrow_mut() = Some(key);
    }

    /// The loaded key the set seals with, or None when it seals nothing;
    /// [`ObjectError::KeyUnavailable`] when it has a key that is not loaded.
    fn loaded_key(
        &self,
        object: u64,
    ) -> Result<Option<Rc<crate::crypto::DatasetKey>>, ObjectError> {
        match &*self.key.borrow() {
            None => Ok(None),
            Some(key) => key
                .ring
                .get(key.guid)
                .map(Some)
                .ok_or(ObjectError::KeyUnavailable { object }),
        }
    }

    /// Refuses a change to a block of `object` that the txg build would
    /// have to seal while the set's key is not loaded, or is being unloaded
    /// (the unload commits what was changed before it began, then the key
    /// goes): the build cannot refuse, so the change must not be made. The
    /// caller makes its change with no await after this check.
    fn check_sealable(&self, object: &Object) -> Result<(), ObjectError> {
        if !sealed_type(object.object_type()) {
            return Ok(());
        }
        match &*self.key.borrow() {
            Some(key) if !key.ring.usable(key.guid) => {
                Err(ObjectError::KeyUnavailable { object: object.id })
            }
            _ => Ok(()),
        }
    }

    /// Whether the set is a filesystem's whose table is authenticated (an
    /// encrypted one made by format 8): each of its objects is, and its
    /// metadata blocks carry portable digests (`format::portable`).
    pub fn is_authenticated(&self) -> bool {
        self.nested && self.dnode_table().dnode().is_authenticated()
    }

    /// Whether the set has a key: sealed blocks may be cached in it as
    /// plaintext ([`ObjectSet::drop_opened`]).
    pub fn has_key(&self) -> bool {
        self.key.borrow().is_some()
    }

    /// Drops every clean level-0 node of a sealed type from the cache (their
    /// plaintext): the set's key is being unloaded. Dirty ones stay (the
    /// caller commits first, so there are none).
    pub fn drop_opened(&self) {
        let objects: Vec<Rc<Object>> = self.objects.borrow().values().cloned().collect();
        for object in objects {
            if !sealed_type(object.object_type()) {
                continue;
            }
            let dirty = object.dirty_nodes.borrow();
            let durable = self.durable_txg.get();
            let mut dropped = 0usize;
            object.nodes.borrow_mut().retain(|key, node| {
                // As eviction: not one in use, dirty, or not yet durable.
                let keep = key.0 != 0
                    || Rc::strong_count(node) > 1
                    || dirty.contains(key)
                    || node.synced_txg.get() > durable;
                if !keep {
                    dropped += node.size_bytes();
                }
                keep
            });
            self.cached_bytes
                .set(self.cached_bytes.get().saturating_sub(dropped));
        }
    }

    pub fn set_durable_txg(&self, txg: u64) {
        self.durable_txg.set(txg);
    }

    /// Bounds the objects kept loaded: past the bound (and a quarter more),
    /// loading one evicts those that may go ([`ObjectSet::evict_objects`]).
    /// Why at load and not only after a txg: a walk that reads a million
    /// files (a backup from `.zfs/snapshot`, `find` on an idle pool) makes
    /// no txg, and would keep every object it met.
    pub fn set_loaded_max(&self, max: usize) {
        self.loaded_max.set(max);
        self.evict_at.set(evict_threshold(max, max));
    }

    pub fn dnode_table(&self) -> Rc<Object> {
        self.objects.borrow()[&0].clone()
    }

    /// An open object, if loaded.
    pub fn get(&self, id: u64) -> Option<Rc<Object>> {
        self.objects.borrow().get(&id).cloned()
    }

    /// Whether a loaded object has changes no txg build has taken yet (as
    /// [`ObjectSet::open_objects`] and their `dirty` flags would say,
    /// without collecting them).
    pub fn any_dirty(&self) -> bool {
        self.objects
            .borrow()
            .values()
            .any(|object| object.dirty.get())
    }

    /// Every loaded object, in object order.
    pub fn open_objects(&self) -> Vec<Rc<Object>> {
        let mut objects: Vec<Rc<Object>> = self.objects.borrow().values().cloned().collect();
        objects.sort_by_key(|object| object.id);
        objects
    }

    /// The loaded objects with changes no txg build has taken yet (their
    /// `dirty` flag), in object order: what a build syncs, without
    /// collecting and sorting every loaded object (a filesystem keeps up to
    /// `fs_objects_loaded_max` of them, 65,536 by default; collecting them
    /// all took a build 25 ms after a scrub had loaded that many).
    pub fn dirty_objects(&self) -> Vec<Rc<Object>> {
        let mut objects: Vec<Rc<Object>> = self
            .objects
            .borrow()
            .values()
            .filter(|object| object.dirty.get())
            .cloned()
            .collect();
        objects.sort_by_key(|object| object.id);
        objects
    }

    /// Object `id`'s dnode as it is now, without loading the object: the
    /// loaded object's when there is one, else read from the dnode table
    /// and not kept (a walk over every object, such as the referenced-bytes
    /// sum, then leaves memory as it found it). None for a free slot.
    pub async fn peek_dnode(&self, id: u64) -> Result<Option<Dnode>, ObjectError> {
        if let Some(object) = self.get(id) {
            return Ok(Some(object.dnode()));
        }
        self.read_table_dnode(id).await
    }

    /// Object `id`'s dnode as the dnode table holds it (None: a free slot).
    async fn read_table_dnode(&self, id: u64) -> Result<Option<Dnode>, ObjectError> {
        let table = self.dnode_table();
        let bytes = self
            .read_bytes(&table, id * DNODE_BYTES as u64, DNODE_BYTES)
            .await?;
        let mut dnode =
            Dnode::decode(&bytes).map_err(|error| ObjectError::Corrupt { object: id, error })?;
        self.opened_bonus(id, &mut dnode)?;
        Ok((!dnode.is_free()).then_some(dnode))
    }

    /// Loads object `id`'s dnode from the dnode table.
    pub async fn open(&self, id: u64) -> Result<Rc<Object>, ObjectError> {
        if let Some(object) = self.get(id) {
            return Ok(object);
        }
        let dnode = self
            .read_table_dnode(id)
            .await?
            .ok_or(ObjectError::NoSuchObject(id))?;
        let object = Object::new(id, dnode);
        // Another task may have opened it while we read.
        let object = self
            .objects
            .borrow_mut()
            .entry(id)
            .or_insert(object)
            .clone();
        // The object returned is held here, so it stays.
        if self.loaded_objects() > self.evict_at.get() {
            self.evict_objects(self.loaded_max.get());
        }
        Ok(object)
    }

    /// Creates object `id` with `dnode` (it is written at the next sync).
    pub fn create(&self, id: u64, mut dnode: Dnode) -> Rc<Object> {
        assert!(
            id != 0 && !self.objects.borrow().contains_key(&id),
            "object {id} exists"
        );
        if self.is_authenticated() {
            dnode.flags |= crate::format::dnode::DNODE_FLAG_AUTHENTICATED;
        }
        let object = Object::new(id, dnode);
        object.dirty.set(true);
        self.objects.borrow_mut().insert(id, object.clone());
        object
    }

    /// Objects loaded now (the dnode table included).
    pub fn loaded_objects(&self) -> usize {
        self.objects.borrow().len()
    }

    /// Drops loaded objects until at most `keep` are left, or none more
    /// may go, and returns how many went. Only an object that a later
    /// [`ObjectSet::open`] loads back the same may go: not the table, not
    /// one with a change no txg build has taken (its dnode or a node), not
    /// one with a cached node written by a txg that is not durable yet (its
    /// tree on disk may not be readable yet), and not one that anybody but
    /// this set holds (a request in flight works on it). Called once a txg
    /// is durable, and by a load past the bound; which objects go is the
    /// map's order, not recency.
    pub fn evict_objects(&self, keep: usize) -> usize {
        let durable = self.durable_txg.get();
        let mut objects = self.objects.borrow_mut();
        if objects.len() <= keep {
            return 0;
        }
        let excess = objects.len() - keep;
        let victims: Vec<u64> = objects
            .iter()
            .filter(|(id, object)| {
                **id != 0
                    && Rc::strong_count(object) == 1
                    && !object.dirty.get()
                    && !object.has_dirty_nodes()
                    && object.dead.borrow().is_empty()
                    && object
                        .nodes
                        .borrow()
                        .values()
                        .all(|node| node.synced_txg.get() <= durable)
            })
            .map(|(id, _)| *id)
            .take(excess)
            .collect();
        for id in &victims {
            if let Some(object) = objects.remove(id) {
                let (_, bytes) = object.cached();
                self.cached_bytes
                    .set(self.cached_bytes.get().saturating_sub(bytes));
            }
        }
        self.evict_at
            .set(evict_threshold(objects.len(), self.loaded_max.get()));
        victims.len()
    }

    /// Forgets an object (after its blocks were freed and its dnode cleared).
    pub fn forget(&self, id: u64) {
        if let Some(object) = self.objects.borrow_mut().remove(&id) {
            let (_, bytes) = object.cached();
            self.cached_bytes
                .set(self.cached_bytes.get().saturating_sub(bytes));
        }
    }

    /// The node at (`level`, `blkid_at_level`), loading it and its ancestors.
    pub async fn node(
        &self,
        object: &Object,
        level: u8,
        blkid_at_level: u64,
    ) -> Result<Rc<Node>, ObjectError> {
        loop {
            match self.lookup(object, level, blkid_at_level)? {
                Lookup::Found(node) => return Ok(node),
                Lookup::Missing {
                    level: missing_level,
                    blkid,
                    pointer,
                    parent,
                } => {
                    self.load(object, missing_level, blkid, pointer, parent)
                        .await?;
                }
            }
        }
    }

    /// The node at (`level`, `blkid_at_level`) without any I/O: nodes under holes
    /// are created empty; a node that would need a read is an error. Used by the
    /// synchronous txg sync on metadata objects, which stay cached (pinned).
    pub fn node_cached(
        &self,
        object: &Object,
        level: u8,
        blkid_at_level: u64,
    ) -> Result<Rc<Node>, ObjectError> {
        match self.lookup(object, level, blkid_at_level)? {
            Lookup::Found(node) => Ok(node),
            Lookup::Missing { level, blkid, .. } => Err(ObjectError::NotCached {
                object: object.id,
                level,
                blkid,
            }),
        }
    }

    /// Walks down from the root to the wanted node through cached nodes, creating
    /// empty nodes under holes; stops at the first node that must be read.
    fn lookup(
        &self,
        object: &Object,
        level: u8,
        blkid_at_level: u64,
    ) -> Result<Lookup, ObjectError> {
        // The fast path needs the node's whole path cached: a node loaded while
        // its parent was evicted (by another task's load, while this one
        // waited for its read) is cached without it, and callers then use the
        // path without I/O. Otherwise the walk below loads what is missing.
        if let Some(node) = object.nodes.borrow().get(&(level, blkid_at_level)) {
            if self.ancestors_cached(object, level, blkid_at_level) {
                node.referenced.set(true);
                return Ok(Lookup::Found(node.clone()));
            }
        }
        let dnode = object.dnode();
        if level >= dnode.levels {
            return Err(ObjectError::TooLarge {
                offset: blkid_at_level,
            });
        }
        let top = dnode.levels - 1;
        let shift = object.pointer_shift();
        let mut parent: Option<Rc<Node>> = None;
        for current in (level..=top).rev() {
            let distance = (current - level) as u32 * shift;
            let blkid = if distance >= 64 {
                0
            } else {
                blkid_at_level >> distance
            };
            if blkid != 0 && current == top {
                return Err(ObjectError::TooLarge {
                    offset: blkid_at_level,
                });
            }
            let cached = object.nodes.borrow().get(&(current, blkid)).cloned();
            let node = match cached {
                Some(node) => node,
                None => {
                    let pointer = match &parent {
                        None => dnode.root,
                        Some(parent) => match &*parent.body.borrow() {
                            NodeBody::Indirect(pointers) => pointers[object.index_in_parent(blkid)],
                            NodeBody::Data(_) => unreachable!("a data node as a parent"),
                        },
                    };
                    if !pointer.is_hole() {
                        return Ok(Lookup::Missing {
                            level: current,
                            blkid,
                            pointer,
                            parent,
                        });
                    }
                    self.insert_node(
                        object,
                        Node::new(current, blkid, empty_body(&dnode, current)),
                    )
                }
            };
            parent = Some(node);
        }
        Ok(Lookup::Found(
            parent.expect("the loop visits at least one level"),
        ))
    }

    /// Whether every ancestor of (`level`, `blkid_at_level`) is cached.
    fn ancestors_cached(&self, object: &Object, level: u8, blkid_at_level: u64) -> bool {
        let levels = object.levels();
        let shift = object.pointer_shift();
        let nodes = object.nodes.borrow();
        (level + 1..levels).all(|ancestor| {
            let distance = (ancestor - level) as u32 * shift;
            let blkid = if distance >= 64 {
                0
            } else {
                blkid_at_level >> distance
            };
            nodes.contains_key(&(ancestor, blkid))
        })
    }

    /// Caches `node` unless one is already there (which wins: it may be dirty).
    fn insert_node(&self, object: &Object, node: Rc<Node>) -> Rc<Node> {
        let mut nodes = object.nodes.borrow_mut();
        if let Some(existing) = nodes.get(&(node.level, node.blkid)) {
            return existing.clone();
        }
        self.cached_bytes
            .set(self.cached_bytes.get() + node.size_bytes());
        nodes.insert((node.level, node.blkid), node.clone());
        node
    }

    /// Reads node (`level`, `blkid`) from `pointer`, found in `parent` (None:
    /// the dnode's root), and caches it, unless the tree moved on while it was
    /// read: then nothing is cached, and the caller's next lookup reads the
    /// current copy. Without that check a read that started before a write
    /// changed the node, and ended after the changed node was synced and
    /// evicted, cached the old contents over the write (ironpool-sim seed 18,
    /// raidz3: an acknowledged write-back block read back as a hole).
    async fn load(
        &self,
        object: &Object,
        level: u8,
        blkid: u64,
        pointer: BlockPointer,
        parent: Option<Rc<Node>>,
    ) -> Result<(), ObjectError> {
        let dnode = object.dnode();
        let corrupt = |reason: String| ObjectError::Corrupt {
            object: object.id,
            error: FormatError::Invalid {
                what: "tree node",
                reason,
            },
        };
        if pointer.level != level || pointer.object_type != dnode.object_type {
            return Err(corrupt(format!(
                "pointer to level {} type {:?} where level {level} type {:?} belongs",
                pointer.level, pointer.object_type, dnode.object_type
            )));
        }
        let read = self
            .store
            .read_cached(
                &pointer,
                IoClass::SyncRead,
                crate::cache::CacheUse::METADATA,
            )
            .await?;
        // The read cache may hold a sealed block opened already (a send
        // read it through `pool::data::logical_bytes`): its plaintext.
        let opened = read.opened;
        let data = read.data;
        let body = if level > 0 {
            if data.len() as u64 != dnode.indirect_block_bytes() {
                return Err(corrupt(format!("indirect block of {} bytes", data.len())));
            }
            let mut pointers = Vec::with_capacity(data.len() / BLOCK_POINTER_BYTES);
            for chunk in data.chunks_exact(BLOCK_POINTER_BYTES) {
                let child = BlockPointer::decode(chunk).map_err(|error| ObjectError::Corrupt {
                    object: object.id,
                    error,
                })?;
                if !child.is_hole() && child.level + 1 != level {
                    return Err(corrupt(format!(
                        "level {} pointer inside a level {level} block",
                        child.level
                    )));
                }
                pointers.push(child);
            }
            NodeBody::Indirect(pointers)
        } else {
            if data.len() as u64 != dnode.data_block_bytes() {
                return Err(corrupt(format!("data block of {} bytes", data.len())));
            }
            let mut bytes = data.to_vec();
            match (&pointer.crypt, opened) {
                // Opened (its MAC checked) when the read cache took it.
                (Some(_), true) => {}
                (Some(sealed), false) => {
                    let key = self
                        .loaded_key(object.id)?
                        .ok_or_else(|| corrupt("a sealed block in a set with no key".into()))?;
                    let aad = crate::crypto::block_aad(
                        pointer.object_type,
                        0,
                        pointer.compression,
                        pointer.logical_size,
                        pointer.physical_size,
                    );
                    let mut plain = vec![0u8; bytes.len()];
                    key.open_into(sealed, &aad, &bytes, &mut plain)
                        .map_err(|error| ObjectError::Sealing {
                            object: object.id,
                            error,
                        })?;
                    bytes = plain;
                }
                // A block of a sealed type stored in the clear in an
                // encrypted set was not written by this set: refused, as a
                // forged block would be.
                (None, _) if sealed_type(dnode.object_type) && self.has_key() => {
                    return Err(corrupt(
                        "a directory block of an encrypted filesystem is not sealed".into(),
                    ));
                }
                (None, _) => {}
            }
            NodeBody::Data(bytes)
        };
        // An authenticated tree's metadata block must give the digest its
        // pointer holds: the XXH3 checksum passed, so a mismatch is no
        // media damage but a block that this tree did not write.
        if dnode.is_authenticated() && pointer.crypt.is_none() {
            let computed =
                sync::node_digest(object, &body, level).map_err(|error| ObjectError::Corrupt {
                    object: object.id,
                    error,
                })?;
            if pointer.digest != Some(computed) {
                return Err(corrupt(format!(
                    "level {level} block {blkid} does not give its pointer's digest: altered metadata of an encrypted dataset"
                )));
            }
        }
        let current = match &parent {
            None => object.dnode().root,
            Some(parent) => {
                let still_cached = object
                    .nodes
                    .borrow()
                    .get(&(parent.level, parent.blkid))
                    .is_some_and(|cached| Rc::ptr_eq(cached, parent));
                match &*parent.body.borrow() {
                    NodeBody::Indirect(pointers) if still_cached => {
                        pointers[object.index_in_parent(blkid)]
                    }
                    _ => return Ok(()),
                }
            }
        };
        if current != pointer {
            return Ok(());
        }
        // Held across the eviction its own arrival may set off.
        let _node = self.insert_node(object, Node::new(level, blkid, body));
        self.maybe_evict();
        Ok(())
    }

    /// The level-0 pointer of `blkid` (a hole if beyond the tree).
    pub async fn block_pointer(
        &self,
        object: &Object,
        blkid: u64,
    ) -> Result<BlockPointer, ObjectError> {
        {
            let dnode = object.dnode.borrow();
            if blkid >= dnode.capacity_blocks() {
                return Ok(BlockPointer::hole(0, dnode.object_type, 0));
            }
            if dnode.levels == 1 {
                return Ok(dnode.root);
            }
        }
        let node = self.node(object, 1, object.ancestor(blkid, 1)).await?;
        let body = node.body.borrow();
        match &*body {
            NodeBody::Indirect(pointers) => Ok(pointers[object.index_in_parent(blkid)]),
            NodeBody::Data(_) => unreachable!("level 1 holds pointers"),
        }
    }

    /// How many level-0 blocks from `blkid` on are known holes without reading
    /// further (0 if `blkid` itself may hold data). Lets block-status, reads
    /// and frees skip large unwritten ranges in one step: the run of hole
    /// pointers that follows the first in the same indirect node is passed
    /// with it, so a range freed in this txg (its indirect nodes full of
    /// holes, still linked above) costs a call per node, not per block.
    pub async fn hole_span(&self, object: &Object, blkid: u64) -> Result<u64, ObjectError> {
        let capacity = object.capacity_blocks();
        if blkid >= capacity {
            return Ok(u64::MAX);
        }
        let levels = object.levels();
        if object.dnode.borrow().root.is_hole()
            && object.nodes.borrow().get(&(levels - 1, 0)).is_none()
        {
            return Ok(capacity - blkid);
        }
        let shift = object.pointer_shift();
        for level in (1..levels).rev() {
            let node = self
                .node(object, level, object.ancestor(blkid, level))
                .await?;
            let child_blkid = object.ancestor(blkid, level - 1);
            let nodes = object.nodes.borrow();
            if nodes.contains_key(&(level - 1, child_blkid)) {
                continue;
            }
            let NodeBody::Indirect(pointers) = &*node.body.borrow() else {
                unreachable!("indirect level holds pointers")
            };
            let first = object.index_in_parent(child_blkid);
            if !pointers[first].is_hole() {
                if level == 1 {
                    return Ok(0);
                }
                continue;
            }
            // The children from `first` on that are holes with nothing
            // of theirs in memory (a child in memory may hold what a
            // write put there since).
            let children = 1 + pointers[first + 1..]
                .iter()
                .zip(child_blkid + 1..)
                .take_while(|(pointer, child)| {
                    pointer.is_hole() && !nodes.contains_key(&(level - 1, *child))
                })
                .count() as u64;
            let span_shift = shift * (level as u32 - 1);
            let start = child_blkid << span_shift;
            let end = start.saturating_add(children.saturating_mul(1 << span_shift));
            return Ok(end - blkid);
        }
        Ok(0)
    }

    /// Links `pointer` as level-0 block `blkid` in the open txg; returns the old
    /// pointer (the caller frees it). Grows the tree if needed.
    pub async fn set_block_pointer(
        &self,
        object: &Object,
        blkid: u64,
        pointer: BlockPointer,
    ) -> Result<BlockPointer, ObjectError> {
        self.ensure_capacity(object, blkid)?;
        self.load_path(object, blkid).await?;
        self.set_block_pointer_cached(object, blkid, pointer)
    }

    /// Grows the tree to reach `blkid` and loads the nodes above it, so that
    /// a `set_block_pointer_cached` that follows with no await in between
    /// links there (the caller stamps the pointer's birth txg in between).
    pub async fn prepare_link(&self, object: &Object, blkid: u64) -> Result<(), ObjectError> {
        self.ensure_capacity(object, blkid)?;
        self.load_path(object, blkid).await
    }

    /// Whether level-0 block `blkid` of a metadata object holds anything:
    /// written (on disk or only in memory) rather than a hole. Reads no data
    /// block (a hole is not turned into a cached block of zeros).
    pub async fn data_block_present(
        &self,
        object: &Object,
        blkid: u64,
    ) -> Result<bool, ObjectError> {
        if blkid >= object.capacity_blocks() {
            return Ok(false);
        }
        self.load_path(object, blkid).await?;
        if object.nodes.borrow().contains_key(&(0, blkid)) {
            return Ok(true);
        }
        Ok(!self.block_pointer_cached(object, blkid)?.is_hole())
    }

    /// Makes level-0 block `blkid` of a metadata object a hole: its cached
    /// copy is dropped and its old block freed.
    pub async fn punch(&self, object: &Object, blkid: u64) -> Result<(), ObjectError> {
        if blkid >= object.capacity_blocks() {
            return Ok(());
        }
        self.load_path(object, blkid).await?;
        self.forget_data_node(object, blkid);
        let old = self.set_block_pointer_cached(
            object,
            blkid,
            BlockPointer::hole(0, object.object_type(), 0),
        )?;
        self.kill(object, &old);
        Ok(())
    }

    /// Drops the cached copy of level-0 block `blkid` of a metadata object,
    /// written or not: the block linked there next replaces it whole (a
    /// hole, or a leaf a raw stream brought sealed), and the txg build must
    /// not write the old copy over it.
    pub fn forget_data_node(&self, object: &Object, blkid: u64) {
        if let Some(node) = object.nodes.borrow_mut().remove(&(0, blkid)) {
            self.cached_bytes
                .set(self.cached_bytes.get().saturating_sub(node.size_bytes()));
        }
        // The dirty byte count stays as it was until the next txg build
        // resets it: a bound that counts a little high for one txg.
        object.dirty_nodes.borrow_mut().remove(&(0, blkid));
    }

    /// Loads the nodes above level-0 block `blkid`, so that the `_cached` calls
    /// that follow (with no await in between) find them.
    pub async fn load_path(&self, object: &Object, blkid: u64) -> Result<(), ObjectError> {
        if object.levels() > 1 && blkid < object.capacity_blocks() {
            self.node(object, 1, object.ancestor(blkid, 1)).await?;
        }
        Ok(())
    }

    /// The cached nodes over level-0 block `blkid`, from level `from` up
    /// to the root (no I/O: the caller loaded the path).
    fn cached_path(
        &self,
        object: &Object,
        blkid: u64,
        from: u8,
    ) -> Result<Vec<Rc<Node>>, ObjectError> {
        (from..object.levels())
            .map(|level| self.node_cached(object, level, object.ancestor(blkid, level)))
            .collect()
    }

    /// The level-0 pointer of `blkid` from cached nodes (no I/O).
    pub fn block_pointer_cached(
        &self,
        object: &Object,
        blkid: u64,
    ) -> Result<BlockPointer, ObjectError> {
        {
            let dnode = object.dnode.borrow();
            if blkid >= dnode.capacity_blocks() {
                return Ok(BlockPointer::hole(0, dnode.object_type, 0));
            }
            if dnode.levels == 1 {
                return Ok(dnode.root);
            }
        }
        let node = self.node_cached(object, 1, object.ancestor(blkid, 1))?;
        let body = node.body.borrow();
        match &*body {
            NodeBody::Indirect(pointers) => Ok(pointers[object.index_in_parent(blkid)]),
            NodeBody::Data(_) => unreachable!("level 1 holds pointers"),
        }
    }

    /// `set_block_pointer` on a path that is cached (no I/O).
    pub fn set_block_pointer_cached(
        &self,
        object: &Object,
        blkid: u64,
        pointer: BlockPointer,
    ) -> Result<BlockPointer, ObjectError> {
        self.ensure_capacity(object, blkid)?;
        let levels = object.levels();
        if levels == 1 {
            let old = std::mem::replace(&mut object.dnode.borrow_mut().root, pointer);
            account(object, &old, &pointer);
            object.dirty.set(true);
            return Ok(old);
        }
        let path = self.cached_path(object, blkid, 1)?;
        let old = {
            let mut body = path[0].body.borrow_mut();
            let NodeBody::Indirect(pointers) = &mut *body else {
                unreachable!("level 1 holds pointers")
            };
            std::mem::replace(&mut pointers[object.index_in_parent(blkid)], pointer)
        };
        self.mark_dirty(object, &path);
        account(object, &old, &pointer);
        Ok(old)
    }

    fn mark_dirty(&self, object: &Object, nodes: &[Rc<Node>]) {
        let mut dirty = object.dirty_nodes.borrow_mut();
        for node in nodes {
            if dirty.insert((node.level, node.blkid)) {
                self.dirty_bytes
                    .set(self.dirty_bytes.get() + node.size_bytes() as u64);
            }
        }
        object.dirty.set(true);
    }

    /// Bytes of nodes dirtied since the last txg build.
    pub fn dirty_bytes(&self) -> u64 {
        self.dirty_bytes.get()
    }

    pub fn reset_dirty_bytes(&self) {
        self.dirty_bytes.set(0);
    }

    /// Adds levels until `blkid` fits. The old root becomes child 0 of a new root.
    fn ensure_capacity(&self, object: &Object, blkid: u64) -> Result<(), ObjectError> {
        // Every link asks; the tree rarely grows: the answer is read in
        // place, without copying the dnode.
        while blkid >= object.capacity_blocks() {
            let dnode = object.dnode();
            if dnode.levels > crate::format::bp::LEVEL_MAX {
                return Err(ObjectError::TooLarge { offset: blkid });
            }
            let new_level = dnode.levels;
            let mut pointers = vec![
                BlockPointer::hole(new_level - 1, dnode.object_type, 0);
                1 << dnode.pointers_per_indirect_shift()
            ];
            pointers[0] = dnode.root;
            let root = self.insert_node(
                object,
                Node::new(new_level, 0, NodeBody::Indirect(pointers)),
            );
            {
                let mut dnode = object.dnode.borrow_mut();
                dnode.levels += 1;
                dnode.root = BlockPointer::hole(new_level, dnode.object_type, 0);
            }
            // The new root must be written at the next sync; a cached old root
            // keeps its own dirty state under it.
            self.mark_dirty(object, &[root]);
        }
        Ok(())
    }

    /// Loads every node a byte range of a metadata object touches.
    pub async fn prefetch(
        &self,
        object: &Object,
        offset: u64,
        length: u64,
    ) -> Result<(), ObjectError> {
        let block_bytes = object.data_block_bytes();
        let capacity = object.capacity_blocks();
        let first = offset / block_bytes;
        let end = (offset + length).div_ceil(block_bytes).min(capacity);
        for blkid in first..end {
            self.node(object, 0, blkid).await?;
        }
        Ok(())
    }

    /// Reads `length` bytes at `offset` of a metadata object, a block at a
    /// time, each copied out while it is held: the blocks of a dead list
    /// may be evicted ([`ObjectSet::load_dead_list`]): a long range loaded
    /// whole and copied after could lose its first blocks to the loads of
    /// its last, and one held whole (`hold_blocks`) would keep all of it in
    /// memory until the next load evicts.
    pub async fn read_bytes(
        &self,
        object: &Object,
        offset: u64,
        length: usize,
    ) -> Result<Vec<u8>, ObjectError> {
        let mut out = vec![0u8; length];
        let end = offset + length as u64;
        for (blkid, within, chunk, position) in block_pieces(offset, end, object.data_block_bytes())
        {
            // Past the tree's height there is nothing: zeros.
            if blkid < object.capacity_blocks() {
                let node = self.node(object, 0, blkid).await?;
                let done = (position - offset) as usize;
                node.copy_data(within, &mut out[done..done + chunk]);
            }
        }
        Ok(out)
    }

    /// Loads the data blocks of a byte range of a metadata object and holds
    /// them (a held block is not evicted) until the returned nodes are
    /// dropped: the synchronous reads (`read_bytes_cached`) of the range
    /// then need no I/O. For a change that must read its input twice and
    /// may not fail the second time (a snapshot's destroy, which frees
    /// what it reads).
    pub async fn hold_blocks(
        &self,
        object: &Object,
        offset: u64,
        length: u64,
    ) -> Result<Vec<Rc<Node>>, ObjectError> {
        let block_bytes = object.data_block_bytes();
        let first = offset / block_bytes;
        let end = (offset + length)
            .div_ceil(block_bytes)
            .min(object.capacity_blocks());
        let mut held = Vec::with_capacity(end.saturating_sub(first) as usize);
        for blkid in first..end {
            held.push(self.node(object, 0, blkid).await?);
        }
        Ok(held)
    }

    /// Loads what a dead list needs in memory: every indirect block (a
    /// list's blocks are freed, [`ObjectSet::free_object_cached`], and its
    /// pointers moved, [`ObjectSet::truncate_cached`], by the synchronous
    /// txg build, from them) and its last data block (appended to by the
    /// build). Those stay cached; the other data blocks, which only a
    /// space query, a snapshot's destroy or a check reads, are loaded when
    /// read and evicted like a file's ([`ObjectSet::maybe_evict`]). A list
    /// loaded whole and kept, as it was, takes 128 bytes of memory for
    /// every block a snapshot holds that its dataset let go: 800 MiB for a
    /// 100 GiB volume of 16 KiB blocks overwritten once since a snapshot.
    pub async fn load_dead_list(&self, object: &Object) -> Result<(), ObjectError> {
        let length = object.length_bytes();
        if length == 0 {
            return Ok(());
        }
        let last = (length - 1) / object.data_block_bytes();
        if object.levels() > 1 {
            let shift = object.pointer_shift();
            for blkid in 0..=(last >> shift) {
                self.node(object, 1, blkid).await?;
            }
        }
        self.node(object, 0, last).await?;
        Ok(())
    }

    /// `read_bytes` on cached nodes (no I/O).
    pub fn read_bytes_cached(
        &self,
        object: &Object,
        offset: u64,
        length: usize,
    ) -> Result<Vec<u8>, ObjectError> {
        let capacity = object.capacity_blocks();
        let mut out = vec![0u8; length];
        let end = offset + length as u64;
        for (blkid, within, chunk, position) in block_pieces(offset, end, object.data_block_bytes())
        {
            if blkid < capacity {
                let node = self.node_cached(object, 0, blkid)?;
                let done = (position - offset) as usize;
                node.copy_data(within, &mut out[done..done + chunk]);
            }
        }
        Ok(out)
    }

    /// Lends data block `blkid` of a metadata object, a block within its
    /// tree, to `borrower` by value, without a copy: the bytes and whether
    /// they are vouched for (checked as a structure since they last
    /// changed, so a leaf is not checked on every lookup). A directory leaf
    /// is 16 KiB, and copying it out for a lookup and in again for a change
    /// cost a file's `unlink` more than its search did. The borrower hands
    /// the bytes back in a [`Lent`]: changed ones are dirty (written at the
    /// next txg); vouched-for ones need no check by the next reader. The
    /// borrower is not async, so nothing else sees the block while it is
    /// lent.
    pub async fn lend_block<R>(
        &self,
        object: &Object,
        blkid: u64,
        borrower: impl FnOnce(Vec<u8>, bool) -> Lent<R>,
    ) -> Result<R, ObjectError> {
        let block_bytes = object.data_block_bytes();
        self.prefetch(object, blkid * block_bytes, block_bytes)
            .await?;
        // After the await, with no other before the change: an unload of
        // the key may have begun meanwhile.
        self.check_sealable(object)?;
        // Past the tree this is an error (`TooLarge`), before anything is lent.
        let path = self.cached_path(object, blkid, 0)?;
        let (changed, checked, result) = {
            let mut body = path[0].body.borrow_mut();
            let NodeBody::Data(bytes) = &mut *body else {
                unreachable!("level 0 holds data")
            };
            let Lent {
                bytes: returned,
                changed,
                checked,
                result,
            } = borrower(std::mem::take(bytes), path[0].checked.get());
            assert_eq!(
                returned.len() as u64,
                block_bytes,
                "a lent block comes back whole"
            );
            *bytes = returned;
            (changed, checked, result)
        };
        path[0].checked.set(checked);
        if changed {
            self.mark_dirty(object, &path);
            let end = (blkid + 1) * block_bytes;
            let mut dnode = object.dnode.borrow_mut();
            if end > dnode.length_bytes {
                dnode.length_bytes = end;
            }
        }
        Ok(result)
    }

    /// Writes `data` at `offset` of a metadata object (in memory; written at sync).
    /// Extends the object's length if the write ends past it.
    pub async fn write_bytes(
        &self,
        object: &Object,
        offset: u64,
        data: &[u8],
    ) -> Result<(), ObjectError> {
        self.prefetch(object, offset, data.len() as u64).await?;
        self.write_bytes_cached(object, offset, data)
    }

    /// `write_bytes` on cached nodes (no I/O). A node written so is no
    /// longer vouched for (its `checked` flag): only a borrower of
    /// [`ObjectSet::lend_block`] says its changes keep a structure sound.
    pub fn write_bytes_cached(
        &self,
        object: &Object,
        offset: u64,
        data: &[u8],
    ) -> Result<(), ObjectError> {
        self.check_sealable(object)?;
        let end = offset + data.len() as u64;
        for (blkid, within, chunk, position) in block_pieces(offset, end, object.data_block_bytes())
        {
            let done = (position - offset) as usize;
            self.ensure_capacity(object, blkid)?;
            let path = self.cached_path(object, blkid, 0)?;
            {
                let mut body = path[0].body.borrow_mut();
                let NodeBody::Data(bytes) = &mut *body else {
                    unreachable!("level 0 holds data")
                };
                bytes[within..within + chunk].copy_from_slice(&data[done..done + chunk]);
            }
            path[0].checked.set(false);
            self.mark_dirty(object, &path);
        }
        let mut dnode = object.dnode.borrow_mut();
        if end > dnode.length_bytes {
            dnode.length_bytes = end;
        }
        object.dirty.set(true);
        Ok(())
    }

    /// Cuts a metadata object to `length` bytes, freeing whole blocks past it.
    pub async fn truncate(&self, object: &Object, length: u64) -> Result<(), ObjectError> {
        let old_length = object.length_bytes();
        self.prefetch(
            object,
            length.min(old_length),
            old_length.saturating_sub(length),
        )
        .await?;
        self.truncate_cached(object, length)
    }

    /// `truncate` on cached nodes (no I/O).
    pub fn truncate_cached(&self, object: &Object, length: u64) -> Result<(), ObjectError> {
        let dnode = object.dnode();
        let block_bytes = dnode.data_block_bytes();
        let first_free = length.div_ceil(block_bytes);
        let end = dnode.length_bytes.div_ceil(block_bytes);
        for blkid in first_free..end {
            // Drop the cached data node (it is recreated as zeros under the hole).
            self.forget_data_node(object, blkid);
            let old = self.set_block_pointer_cached(
                object,
                blkid,
                BlockPointer::hole(0, dnode.object_type, 0),
            )?;
            self.kill(object, &old);
        }
        if !length.is_multiple_of(block_bytes) && length < dnode.length_bytes {
            // Zero the tail of the last kept block so a later extension reads zeros.
            let tail = (block_bytes - length % block_bytes) as usize;
            self.write_bytes_cached(object, length, &vec![0u8; tail])?;
        }
        object.dnode.borrow_mut().length_bytes = length;
        object.dirty.set(true);
        Ok(())
    }

    /// Lets go of a block the object no longer points at: it is freed, unless a
    /// snapshot (or, for a clone, the origin) still points at it — born at or
    /// before the latest snapshot's txg — in which case it goes on the dead
    /// list of the dataset at the next commit. The dataset is the object
    /// itself for a volume or a filesystem's table, and the table for every
    /// object of a filesystem's own set (a snapshot of a filesystem holds
    /// the blocks of all its objects).
    pub fn kill(&self, object: &Object, pointer: &BlockPointer) {
        if pointer.is_hole() {
            return;
        }
        let table;
        let dataset = if self.nested {
            table = self.dnode_table();
            &*table
        } else {
            object
        };
        let held = {
            let dnode = dataset.dnode.borrow();
            matches!(
                dnode.object_type,
                ObjectType::VolumeData | ObjectType::FsObjects
            ) && pointer.birth_txg <= dnode.prev_snapshot_txg
        };
        if held {
            dataset.dead.borrow_mut().push(*pointer);
            dataset.dirty.set(true);
        } else {
            self.store.free(pointer);
        }
    }

    /// Drops the cached nodes of a replaced tree and forgets their bytes.
    pub fn reset_tree(&self, object: &Object, dnode: Dnode) {
        let bytes = object.drop_cached_nodes();
        self.cached_bytes
            .set(self.cached_bytes.get().saturating_sub(bytes));
        *object.dnode.borrow_mut() = dnode;
        object.dirty.set(true);
    }

    /// Frees every block of a cached metadata object and clears its dnode (the
    /// object is gone at the next commit).
    pub fn free_object_cached(&self, object: &Object) -> Result<(), ObjectError> {
        let mut pointers = Vec::new();
        let root = object.dnode().root;
        if !root.is_hole() {
            pointers.push(root);
        }
        for node in object.nodes.borrow().values() {
            if let NodeBody::Indirect(entries) = &*node.body.borrow() {
                pointers.extend(entries.iter().filter(|pointer| !pointer.is_hole()).copied());
            }
        }
        for pointer in &pointers {
            self.kill(object, pointer);
        }
        self.clear_dnode_cached(object.id)
    }

    /// Clears object `id`'s dnode in the table (free at the next commit)
    /// and forgets the object; its blocks are the caller's business.
    pub async fn clear_dnode(&self, id: u64) -> Result<(), ObjectError> {
        let table = self.dnode_table();
        self.prefetch(&table, id * DNODE_BYTES as u64, DNODE_BYTES as u64)
            .await?;
        self.clear_dnode_cached(id)
    }

    /// [`Self::clear_dnode`] when the table's block holding it is cached.
    /// A free slot is all zeros (object type 0 decodes as free), so a table
    /// block whose objects are all freed is zeros and the next sync makes
    /// it a hole: its space comes back.
    pub fn clear_dnode_cached(&self, id: u64) -> Result<(), ObjectError> {
        let table = self.dnode_table();
        let zero = [0u8; DNODE_BYTES];
        self.write_bytes_cached(&table, id * DNODE_BYTES as u64, &zero)?;
        self.forget(id);
        Ok(())
    }

    /// Every non-hole pointer in the object's tree, level by level from the top,
    /// with their positions. Used to free a whole object and by scrub.
    pub async fn visit_pointers(
        &self,
        object: &Object,
        visit: &mut dyn FnMut(u8, u64, &BlockPointer),
    ) -> Result<(), ObjectError> {
        let dnode = object.dnode();
        let top = dnode.levels - 1;
        if !dnode.root.is_hole() {
            visit(top, 0, &dnode.root);
        }
        // Breadth-first over indirect nodes; bounded by the tree itself.
        let mut frontier: Vec<u64> = vec![0];
        for level in (1..=top).rev() {
            let mut next = Vec::new();
            for blkid in frontier {
                let cached = object.nodes.borrow().contains_key(&(level, blkid));
                if !cached && self.pointer_to(object, level, blkid).await?.is_hole() {
                    continue;
                }
                let node = self.node(object, level, blkid).await?;
                let children: Vec<(u64, BlockPointer)> = match &*node.body.borrow() {
                    NodeBody::Indirect(pointers) => pointers
                        .iter()
                        .enumerate()
                        .map(|(index, pointer)| {
                            ((blkid << object.pointer_shift()) + index as u64, *pointer)
                        })
                        .collect(),
                    NodeBody::Data(_) => unreachable!("indirect level holds pointers"),
                };
                for (child_blkid, pointer) in children {
                    let child_cached = level > 1
                        && object
                            .nodes
                            .borrow()
                            .contains_key(&(level - 1, child_blkid));
                    if !pointer.is_hole() {
                        visit(level - 1, child_blkid, &pointer);
                    }
                    if level > 1 && (!pointer.is_hole() || child_cached) {
                        next.push(child_blkid);
                    }
                }
            }
            frontier = next;
        }
        Ok(())
    }

    /// Visits every non-hole pointer of the object's current tree born after
    /// `txg`, descending only where such pointers can be: a clean subtree under
    /// a pointer born at or before `txg` is entirely that old (copy-on-write),
    /// while a node changed since (dirty, cached) is looked into whatever its
    /// parent says. Used by destroy, rollback, space figures and incremental
    /// send. Turns the engine's loop every [`VISIT_POINTERS_PER_TURN`]
    /// pointers looked at, so that a large cached tree does not hold off
    /// every other client of the pool for its whole walk.
    pub async fn visit_pointers_born_after(
        &self,
        object: &Object,
        txg: u64,
        visit: &mut dyn FnMut(&BlockPointer),
    ) -> Result<(), ObjectError> {
        let dnode = object.dnode();
        let top = dnode.levels - 1;
        if !dnode.root.is_hole() && dnode.root.birth_txg > txg {
            visit(&dnode.root);
        }
        let shift = object.pointer_shift();
        let mut frontier: Vec<u64> = vec![0];
        let mut looked_at = 0;
        for level in (1..=top).rev() {
            let mut next = Vec::new();
            for blkid in frontier {
                if looked_at >= VISIT_POINTERS_PER_TURN {
                    looked_at = 0;
                    crate::rt::yield_now().await;
                }
                let dirty = object.dirty_nodes.borrow().contains(&(level, blkid));
                if !dirty {
                    let pointer = self.pointer_to(object, level, blkid).await?;
                    let cached_under_hole =
                        pointer.is_hole() && object.nodes.borrow().contains_key(&(level, blkid));
                    if (pointer.is_hole() && !cached_under_hole)
                        || (!pointer.is_hole() && pointer.birth_txg <= txg)
                    {
                        continue;
                    }
                }
                let node = self.node(object, level, blkid).await?;
                let children: Vec<(u64, BlockPointer)> = match &*node.body.borrow() {
                    NodeBody::Indirect(pointers) => pointers
                        .iter()
                        .enumerate()
                        .map(|(index, pointer)| ((blkid << shift) + index as u64, *pointer))
                        .collect(),
                    NodeBody::Data(_) => unreachable!("indirect level holds pointers"),
                };
                looked_at += children.len();
                for (child_blkid, pointer) in children {
                    if !pointer.is_hole() && pointer.birth_txg > txg {
                        visit(&pointer);
                    }
                    if level > 1 {
                        next.push(child_blkid);
                    }
                }
            }
            frontier = next;
        }
        Ok(())
    }

    /// A walk of `object`'s blocks changed after `since_txg` from block
    /// `start`, a batch of about `limit` at a time ([`ChangedBlocksWalk`];
    /// see [`ObjectSet::changed_blocks`] for what is reported).
    pub fn walk_changed_blocks<'a>(
        &'a self,
        object: &'a Object,
        since_txg: u64,
        start: u64,
        limit: usize,
        stamped_holes: bool,
    ) -> ChangedBlocksWalk<'a> {
        ChangedBlocksWalk {
            set: self,
            object,
            since_txg,
            next: Some(start),
            limit,
            stamped_holes,
        }
    }

    /// Level-0 blocks of the object's tree changed after `since_txg`, in
    /// ascending order from block `start`: blocks with data born after it, and
    /// runs of blocks that became holes after it (a hole remembers the txg that
    /// made it). Subtrees whose pointer is no newer than `since_txg` are skipped
    /// unread, so the cost follows the change, not the volume's size. Returns at
    /// most about `limit` changes and, when it stopped early, the block to
    /// continue from. Used by send (incremental with `since_txg` of the earlier
    /// snapshot; full with 0).
    ///
    /// `stamped_holes`: whether a hole made by the object's writers carries
    /// the txg that made it (a volume's do). Without it (a filesystem's
    /// objects), every hole under a node changed since `since_txg`, and a
    /// hole root, is reported: it may have held data then. That costs a few
    /// FREE records of holes that were holes already, never a stale block.
    pub async fn changed_blocks(
        &self,
        object: &Object,
        since_txg: u64,
        start: u64,
        limit: usize,
        stamped_holes: bool,
    ) -> Result<(Vec<BlockChange>, Option<u64>), ObjectError> {
        let dnode = object.dnode();
        let shift = object.pointer_shift() as u64;
        let width_of = |level: u8| -> u64 {
            let bits = shift * level as u64;
            if bits >= 64 {
                u64::MAX
            } else {
                1u64 << bits
            }
        };
        let capacity = dnode.capacity_blocks();
        let mut changes = Vec::new();
        let mut stack: Vec<(u8, u64, BlockPointer)> = vec![(dnode.levels - 1, 0, dnode.root)];
        while let Some((level, index, pointer)) = stack.pop() {
            let width = width_of(level);
            let first = index.saturating_mul(width);
            let end = first.saturating_add(width).min(capacity);
            if end <= start || first >= capacity {
                continue;
            }
            if changes.len() >= limit {
                return Ok((changes, Some(first.max(start))));
            }
            // A node changed in the open txg, or created under a hole, is newer
            // than the pointer to it says: look inside.
            let look_inside = level > 0
                && (object.dirty_nodes.borrow().contains(&(level, index))
                    || (pointer.is_hole() && object.nodes.borrow().contains_key(&(level, index))));
            if !look_inside {
                if pointer.birth_txg <= since_txg && (stamped_holes || !pointer.is_hole()) {
                    continue;
                }
                if pointer.is_hole() {
                    let from = first.max(start);
                    changes.push(BlockChange::Holes {
                        first: from,
                        count: end - from,
                    });
                    continue;
                }
                if level == 0 {
                    changes.push(BlockChange::Data {
                        blkid: first,
                        pointer,
                    });
                    continue;
                }
            }
            let node = self.node(object, level, index).await?;
            let children: Vec<BlockPointer> = match &*node.body.borrow() {
                NodeBody::Indirect(pointers) => pointers.clone(),
                NodeBody::Data(_) => unreachable!("indirect level holds pointers"),
            };
            for (position, child) in children.into_iter().enumerate().rev() {
                stack.push((level - 1, (index << shift) + position as u64, child));
            }
        }
        Ok((changes, None))
    }

    /// The pointer to node (`level`, `blkid`) as its parent (or the dnode) holds it.
    async fn pointer_to(
        &self,
        object: &Object,
        level: u8,
        blkid: u64,
    ) -> Result<BlockPointer, ObjectError> {
        let dnode = object.dnode();
        if level == dnode.levels - 1 {
            return Ok(dnode.root);
        }
        let parent = self
            .node(object, level + 1, blkid >> object.pointer_shift())
            .await?;
        let body = parent.body.borrow();
        match &*body {
            NodeBody::Indirect(pointers) => Ok(pointers[object.index_in_parent(blkid)]),
            NodeBody::Data(_) => unreachable!("indirect level holds pointers"),
        }
    }

    /// Evicts clean, unused nodes when the cache is over budget (second chance).
    fn maybe_evict(&self) {
        let budget = self.cache_budget_bytes.get();
        if self.cached_bytes.get() <= budget {
            return;
        }
        let target = budget - budget / 8;
        let durable = self.durable_txg.get();
        let objects = self.open_objects();
        for round in 0..2 {
            for object in &objects {
                // Metadata objects stay cached: the txg sync works on them
                // without I/O. Of a dead list, only the data blocks but the
                // last may go (see `load_dead_list`).
                let dnode = object.dnode();
                let dead_list = dnode.object_type == ObjectType::DeadList;
                if dnode.object_type.is_metadata() && !dead_list {
                    continue;
                }
                let dead_list_tail = (dead_list && dnode.length_bytes > 0)
                    .then(|| (dnode.length_bytes - 1) / dnode.data_block_bytes());
                let dirty = object.dirty_nodes.borrow();
                let mut nodes = object.nodes.borrow_mut();
                // Nodes with a cached child stay: callers load a path (`node`,
                // `load_path`) and then use it without I/O (`node_cached` walks
                // down from the root), so a node loaded last must not lose its
                // ancestors to the eviction its own load triggered. Evicting
                // from the leaves up keeps every cached node's path cached.
                // (A dead list's indirect blocks all stay: no set needed.)
                let shift = object.pointer_shift();
                let parents: rustc_hash::FxHashSet<(u8, u64)> = if dead_list {
                    Default::default()
                } else {
                    nodes
                        .keys()
                        .map(|(level, blkid)| {
                            (level + 1, if shift >= 64 { 0 } else { blkid >> shift })
                        })
                        .collect()
                };
                let mut victims = Vec::new();
                for (key, node) in nodes.iter() {
                    // In use by a task, dirty, or written by a txg not yet durable.
                    if Rc::strong_count(node) > 1
                        || dirty.contains(key)
                        || node.synced_txg.get() > durable
                        || parents.contains(key)
                        || dead_list && (key.0 != 0 || Some(key.1) == dead_list_tail)
                    {
                        continue;
                    }
                    if round == 0 && node.referenced.replace(false) {
                        continue;
                    }
                    victims.push(*key);
                }
                for key in victims {
                    if let Some(node) = nodes.remove(&key) {
                        self.cached_bytes
                            .set(self.cached_bytes.get().saturating_sub(node.size_bytes()));
                    }
                    if self.cached_bytes.get() <= target {
                        return;
                    }
                }
            }
        }
    }

    /// Bytes of cached nodes (dirty and clean).
    pub fn cached_bytes(&self) -> usize {
        self.cached_bytes.get()
    }
}

/// Pages through [`ObjectSet::changed_blocks`]: each batch starts where the
/// last one stopped, so a caller (a send) holds one batch of changes at a
/// time however large the object.
pub struct ChangedBlocksWalk<'a> {
    set: &'a ObjectSet,
    object: &'a Object,
    since_txg: u64,
    /// The block the next batch starts from; None once the walk is done.
    next: Option<u64>,
    limit: usize,
    stamped_holes: bool,
}

impl ChangedBlocksWalk<'_> {
    /// The next batch of changes, in ascending block order; None when the
    /// walk has reached the end of the object.
    pub async fn next_batch(&mut self) -> Result<Option<Vec<BlockChange>>, ObjectError> {
        let Some(start) = self.next else {
            return Ok(None);
        };
        let (changes, next) = self
            .set
            .changed_blocks(
                self.object,
                self.since_txg,
                start,
                self.limit,
                self.stamped_holes,
            )
            .await?;
        self.next = next;
        Ok(Some(changes))
    }
}

/// Keeps an object's space accounting in step with a pointer change.
pub(crate) fn account(object: &Object, old: &BlockPointer, new: &BlockPointer) {
    let mut dnode = object.dnode.borrow_mut();
    dnode.used_bytes =
        (dnode.used_bytes + new.allocated_bytes()).saturating_sub(old.allocated_bytes());
    if old.level == 0 || new.level == 0 {
        let old_logical = if old.is_hole() {
            0
        } else {
            old.logical_size as u64
        };
        let new_logical = if new.is_hole() {
            0
        } else {
            new.logical_size as u64
        };
        dnode.logical_bytes = (dnode.logical_bytes + new_logical).saturating_sub(old_logical);
        // What the data occupies on disk (compressed, rounded to sectors): the
        // compression ratio is logical over this, as space is what it saves.
        let old_physical = if old.level == 0 {
            old.allocated_bytes()
        } else {
            0
        };
        let new_physical = if new.level == 0 {
            new.allocated_bytes()
        } else {
            0
        };
        dnode.physical_bytes = (dnode.physical_bytes + new_physical).saturating_sub(old_physical);
    }
}

/// A fresh dnode for a new object.
pub fn new_dnode(
    object_type: ObjectType,
    data_block_shift: u8,
    indirect_block_shift: u8,
    length_bytes: u64,
    txg: u64,
) -> Dnode {
    let mut dnode = Dnode {
        object_type,
        levels: 1,
        data_block_shift,
        indirect_block_shift,
        length_bytes,
        creation_txg: txg,
        root: BlockPointer::hole(0, object_type, 0),
        ..Dnode::default()
    };
    let blocks = length_bytes.div_ceil(1 << data_block_shift).max(1);
    while dnode.capacity_blocks() < blocks {
        dnode.levels += 1;
    }
    dnode.root.level = dnode.levels - 1;
    dnode
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_pieces_cut_at_block_boundaries() {
        let pieces: Vec<_> = block_pieces(4096 + 512, 3 * 4096 + 1024, 4096).collect();
        assert_eq!(
            pieces,
            [
                (1, 512, 3584, 4608),
                (2, 0, 4096, 8192),
                (3, 0, 1024, 12288)
            ]
        );
        assert_eq!(block_pieces(8192, 8192, 4096).count(), 0);
    }
}
