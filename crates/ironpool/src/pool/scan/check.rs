//! A full consistency check of space accounting (like `zdb -b`): walk every block
//! of every object and compare what is referenced with what the space maps say is
//! allocated. Used by tests and by `ironpool check`.

use std::rc::Rc;

use serde::Serialize;

use crate::alloc::RangeSet;
use crate::format::dnode::DNODE_BYTES;
use crate::format::znode::FsSpace;
use crate::format::Dnode;
use crate::pool::filesystem::dnode_space;
use crate::pool::Pool;

/// What the check found.
#[derive(Clone, Debug, Default, Serialize)]
pub struct CheckReport {
    pub objects: u64,
    pub block_copies: u64,
    pub referenced_bytes: u64,
    pub allocated_bytes: u64,
    /// Problems found (empty when consistent).
    pub problems: Vec<String>,
}

/// A tree the check walks: its object set, its object, its owner (as
/// `Sighting::owner`), its name in problems, and the origin chain of its
/// dataset (see `Pool::origin_chain`; empty for the pool's own objects).
type Tree = (
    Rc<crate::object::ObjectSet>,
    Rc<crate::object::Object>,
    u64,
    String,
    Rc<Vec<(u64, u64)>>,
);

/// What the check knows of a block copy it found in the trees.
struct Sighting {
    /// The txg its bytes were written in (a clone keeps it).
    written: u64,
    checksum: crate::format::Checksum,
    /// The tree that pointed at it first (for messages).
    owner: u64,
    /// The pointer's first copy: the block reference table's key.
    first_copy: crate::format::Dva,
    /// Its distinct links: (the dataset that made it, object within its
    /// dataset, level, block, birth).
    links: Vec<(u64, u64, u64, u64, u64)>,
}

/// Most problems listed in a report.
const PROBLEMS_MAX: usize = 64;

impl CheckReport {
    fn problem(&mut self, text: String) {
        if self.problems.len() < PROBLEMS_MAX {
            self.problems.push(text);
        }
    }
}

impl Pool {
    /// Commits, then checks that every block is referenced exactly once and that
    /// the allocated space is exactly the referenced space (no leaks, no double
    /// references, no block outside allocated space). Safe on a served pool:
    /// writes and administrative changes wait while the walk runs.
    pub async fn check_space(self: &Rc<Self>) -> Result<CheckReport, crate::pool::PoolError> {
        // The walk must see the trees and the allocator as one state. Three
        // things change them while it awaits reads:
        // - administrative changes (destroy, rollback, receive, volume
        //   creation...) free blocks and change trees: they take the admin
        //   lock, held here;
        // - writes (clients, receives, the write-back) allocate, link blocks
        //   into the trees and free the blocks they replace, all outside any
        //   txg build: a block walked before an overwrite was found "not
        //   allocated" once freed, its replacement "leaked" (fio under load
        //   gave 52 problems). Every volume's writers are kept out here and
        //   its dirty blocks written out first;
        // - the sync task builds txgs on its own (an idle pool still commits
        //   to release deferred frees): builds wait while the walk runs.
        let _admin = self.datasets.admin_lock.acquire(1).await;
        let volumes: Vec<Rc<crate::pool::Volume>> = self.datasets.volumes.all();
        let mut _writers = Vec::with_capacity(volumes.len());
        let mut _writers_fs = Vec::new();
        for volume in &volumes {
            _writers.push(self.exclusive(volume).await?);
        }
        for (_, fs) in self.all_filesystems() {
            _writers_fs.push(fs.exclusive().await);
        }
        self.commit().await?;
        let _hold = self.txg.hold_builds();
        self.check_space_once().await
    }

    /// One walk and comparison (see `check_space`).
    async fn check_space_once(self: &Rc<Self>) -> Result<CheckReport, crate::pool::PoolError> {
        let mut report = CheckReport::default();
        let vdev_count = self.store.vdevs().len();
        let mut referenced: Vec<RangeSet> = (0..vdev_count).map(|_| RangeSet::new()).collect();
        let table = self.objects.dnode_table();
        let count = table.length_bytes() / DNODE_BYTES as u64;
        let mut objects = vec![table.clone()];
        for id in 1..count {
            let bytes = self
                .objects
                .read_bytes(&table, id * DNODE_BYTES as u64, DNODE_BYTES)
                .await?;
            let dnode = Dnode::decode(&bytes)
                .map_err(|error| crate::pool::PoolError::Corrupt(format!("dnode {id}: {error}")))?;
            if dnode.is_free() {
                continue;
            }
            objects.push(self.objects.open(id).await?);
        }
        report.objects = objects.len() as u64;
        // A block may be shared by several trees (a volume and its snapshots and
        // clones): then it is the same block pointer, one link seen from each.
        // A cloned block (block cloning) is linked more than once, as many
        // times as the block reference table says. Any other pointer to the
        // same place is a double reference. Each copy: the pointer's identity
        // (the txg its bytes were written in, its checksum), the tree that
        // saw it first, its first copy (the table's key) and its links.
        let mut owners: std::collections::HashMap<(u32, u64), Sighting> =
            std::collections::HashMap::new();
        let mut dead_entries = Vec::new();
        // Every tree: the pool's objects, then each filesystem's own (named
        // in problems as `TABLE/ID`; their ids are counted apart).
        let mut trees: Vec<Tree> = objects
            .iter()
            .map(|object| {
                (
                    self.objects.clone(),
                    object.clone(),
                    object.id,
                    object.id.to_string(),
                    Rc::new(Vec::new()),
                )
            })
            .collect();
        // Heads and the snapshots of each filesystem: every tree of theirs.
        let mut filesystems: Vec<Rc<crate::pool::filesystem::Filesystem>> = self
            .all_filesystems()
            .into_iter()
            .map(|(_, fs)| fs)
            .collect();
        let snapshot_names: Vec<String> = self
            .datasets
            .directory
            .read()
            .filesystems
            .iter()
            .flat_map(|(short, record)| {
                record
                    .lineage
                    .snapshots
                    .iter()
                    .map(move |snapshot| format!("{}/{short}@{}", self.name, snapshot.name))
            })
            .collect();
        for name in &snapshot_names {
            filesystems.push(self.snapshot_filesystem(name).await?);
        }
        // The space `list` shows of dead lists (cached summaries, extended
        // by what was appended since) must be what their pointers add up to.
        let lists: Vec<u64> = {
            let directory = self.datasets.directory.read();
            let lineages = directory
                .volumes
                .values()
                .map(|record| &record.lineage)
                .chain(directory.filesystems.values().map(|record| &record.lineage));
            lineages
                .flat_map(|lineage| {
                    std::iter::once(lineage.dead_list)
                        .chain(lineage.snapshots.iter().map(|snapshot| snapshot.dead_list))
                })
                .filter(|&list| list != 0)
                .collect()
        };
        for list in lists {
            let summary = self.dead_list_space(list, None).await?;
            let mut fresh = crate::pool::dataset::dead_space::DeadSpace::default();
            for pointer in self.dead_list_entries(list).await? {
                fresh.add(&pointer);
            }
            if summary.as_ref() != Some(&fresh) {
                report.problem(format!(
                    "dead list {list}: its space summary ({:?} bytes allocated) is not what its pointers add up to ({} bytes)",
                    summary.map(|summary| summary.allocated()),
                    fresh.allocated()
                ));
            }
        }
        // The written figure `list` shows of a filesystem (from the sums and
        // the dead list) must be the one a walk of its blocks finds.
        for (short, fs) in self.all_filesystems() {
            if fs.table.dnode().origin_txg != 0 || fs.header.get().space.is_none() {
                continue;
            }
            let record = self.record(&short)?;
            let (referenced, _, _) = fs.referenced_locked(self).await?;
            let dead = self.head_dead(&fs.table, &record).await?;
            let let_go = dead
                .iter()
                .map(crate::format::BlockPointer::allocated_bytes)
                .sum();
            let summed = self
                .written_by_sums(&short, &record, &fs.table, let_go, referenced)
                .await?;
            let (walked, _, _) = self.written_walked(&fs.table, Some(&fs)).await?;
            if summed != Some(walked) {
                report.problem(format!(
                    "filesystem {}: written is {summed:?} by its sums, {walked} by a walk",
                    fs.name()
                ));
            }
        }
        let mut lineage_ids: std::collections::HashMap<String, u64> = Default::default();
        for fs in &filesystems {
            let chain = Rc::new(self.origin_chain(&fs.short_name(), &mut lineage_ids));
            // The space sums its header keeps must be those of its objects
            // (everything is committed, so those are the table's).
            let mut walked = FsSpace::default();
            for object in fs.live_objects().await? {
                walked.replace(FsSpace::default(), dnode_space(&object.dnode()));
                let id = object.id;
                report.objects += 1;
                trees.push((
                    fs.objects.clone(),
                    object,
                    (1 << 63) | (fs.table.id << 32) | id,
                    format!("{}/{id}", fs.table.id),
                    chain.clone(),
                ));
            }
            if let Some(kept) = fs.header.get().space {
                if kept != walked {
                    report.problem(format!(
                        "filesystem {}: its header counts {kept:?}, its objects hold {walked:?}",
                        fs.name()
                    ));
                }
            }
        }
        for (set, object, owner, label, chain) in &trees {
            let owner = *owner;
            // A link is told apart by the object within its dataset (a
            // snapshot or a clone of a dataset shares the links of its
            // origin: the same object, block and birth), the level and
            // block, and the birth.
            let within = if owner & (1 << 63) != 0 {
                owner & ((1 << 32) - 1) | (1 << 63)
            } else if matches!(
                object.object_type(),
                crate::format::ObjectType::VolumeData | crate::format::ObjectType::FsObjects
            ) {
                0
            } else {
                owner
            };
            let mut copies = Vec::new();
            set.visit_pointers(object, &mut |level, blkid, pointer| {
                for dva in pointer.copies() {
                    copies.push((level, blkid, *dva, *pointer));
                }
            })
            .await?;
            for (level, blkid, dva, pointer) in copies {
                // The dataset a link was made in: its own, or, for a block
                // born before a clone's origin, the origin's (recursively).
                let lineage = chain
                    .iter()
                    .find(|(_, floor)| pointer.birth_txg > *floor)
                    .map_or(0, |(id, _)| *id);
                let link = (lineage, within, u64::from(level), blkid, pointer.birth_txg);
                match owners.get_mut(&(dva.vdev, dva.offset)) {
                    Some(seen) => {
                        if seen.written != pointer.written_txg()
                            || seen.checksum != pointer.checksum
                            || seen.first_copy != pointer.dvas[0]
                        {
                            report.problem(format!("object {label} block {level}/{blkid}: {:?} is referenced twice (also by object {:#x})", dva, seen.owner));
                        } else if !seen.links.contains(&link) {
                            seen.links.push(link);
                        }
                        continue;
                    }
                    None => {
                        owners.insert(
                            (dva.vdev, dva.offset),
                            Sighting {
                                written: pointer.written_txg(),
                                checksum: pointer.checksum,
                                owner,
                                first_copy: pointer.dvas[0],
                                links: vec![link],
                            },
                        );
                    }
                }
                report.block_copies += 1;
                report.referenced_bytes += dva.asize as u64;
                // A copy a removal moved is where its mapping says (the
                // one in place too, while the removal runs).
                let (moved, in_place) = {
                    let remaps = self.store.remaps.borrow();
                    if remaps.is_mapped(dva.vdev) {
                        let target = remaps.target(&dva);
                        if target.is_none() && remaps.is_indirect(dva.vdev) {
                            report.problem(format!(
                                "object {label} block {level}/{blkid}: {dva:?} is on a removed vdev and was never moved"
                            ));
                        }
                        (target, !remaps.is_indirect(dva.vdev))
                    } else {
                        (None, true)
                    }
                };
                if let Some(target) = moved {
                    let overlaps = referenced
                        .get_mut(target.vdev as usize)
                        .is_none_or(|set| set.try_insert(target.offset, target.end()).is_err());
                    if overlaps {
                        report.problem(format!(
                            "object {label} block {level}/{blkid}: {dva:?} moved to {target:?}, which overlaps another block"
                        ));
                    }
                }
                if !in_place {
                    continue;
                }
                let Some(set) = referenced.get_mut(dva.vdev as usize) else {
                    report.problem(format!(
                        "object {label} block {level}/{blkid} on missing vdev {}",
                        dva.vdev
                    ));
                    continue;
                };
                if set.try_insert(dva.offset, dva.end()).is_err() {
                    report.problem(format!(
                        "object {label} block {level}/{blkid}: {:?} overlaps another block",
                        dva
                    ));
                }
            }
            if object.object_type() == crate::format::ObjectType::DeadList {
                let length = object.length_bytes() as usize;
                let bytes = self.objects.read_bytes(object, 0, length).await?;
                for chunk in bytes.chunks_exact(crate::format::bp::BLOCK_POINTER_BYTES) {
                    match crate::format::BlockPointer::decode(chunk) {
                        Ok(pointer) => dead_entries.push((object.id, pointer)),
                        Err(error) => report.problem(format!("dead list {}: {error}", object.id)),
                    }
                }
            }
        }
        // An intent log an import claimed (an encrypted filesystem's, its
        // key not loaded) holds its blocks and those its records link.
        for (short, space) in self.claimed_spaces() {
            for dva in space.dvas() {
                report.block_copies += 1;
                report.referenced_bytes += dva.asize as u64;
                let inserted = referenced
                    .get_mut(dva.vdev as usize)
                    .is_some_and(|set| set.try_insert(dva.offset, dva.end()).is_ok());
                if !inserted {
                    report.problem(format!(
                        "filesystem {short}: its claimed intent log's {dva:?} overlaps another block"
                    ));
                }
            }
        }
        // Every block on a dead list is still some snapshot's (or origin's).
        let heads: Vec<Rc<crate::object::Object>> = self
            .datasets
            .volumes
            .all()
            .into_iter()
            .map(|volume| volume.object.clone())
            .chain(
                self.all_filesystems()
                    .into_iter()
                    .map(|(_, fs)| fs.table.clone()),
            )
            .collect();
        let pending: Vec<(u64, crate::format::BlockPointer)> = heads
            .iter()
            .flat_map(|head| {
                head.dead
                    .borrow()
                    .iter()
                    .map(|pointer| (head.id, *pointer))
                    .collect::<Vec<_>>()
            })
            .collect();
        for (list, pointer) in dead_entries.iter().chain(pending.iter()) {
            for dva in pointer.copies() {
                match owners.get(&(dva.vdev, dva.offset)) {
                    Some(seen)
                        if seen.written == pointer.written_txg()
                            && seen.checksum == pointer.checksum => {}
                    _ => report.problem(format!(
                        "dead list {list}: {:?} born {} is not in any snapshot",
                        dva, pointer.birth_txg
                    )),
                }
            }
        }
        // Origins and clone lists agree.
        {
            let directory = self.datasets.directory.read();
            for (name, record) in directory.lineages() {
                if let Some(origin) = &record.origin {
                    let listed = directory
                        .snapshot(origin)
                        .is_some_and(|snapshot| snapshot.clones.contains(name));
                    if !listed {
                        report.problem(format!(
                            "volume {name}: origin {}@{} does not list it as a clone",
                            origin.volume, origin.snapshot
                        ));
                    }
                }
                for snapshot in &record.snapshots {
                    for clone in &snapshot.clones {
                        let back = directory
                            .lineage(clone)
                            .and_then(|clone_record| clone_record.origin.as_ref())
                            .is_some_and(|origin| {
                                origin.volume == *name && origin.snapshot == snapshot.name
                            });
                        if !back {
                            report.problem(format!(
                                "{name}@{}: lists clone {clone} whose origin is elsewhere",
                                snapshot.name
                            ));
                        }
                    }
                }
            }
        }
        // Each block is linked once, and a cloned one once more per extra
        // reference the block reference table counts; the table names only
        // blocks that are there.
        {
            let clones = self.store.clones.borrow();
            let mut cloned_seen = 0usize;
            for ((vdev, offset), seen) in &owners {
                let extra = clones.extra_references(&seen.first_copy);
                if seen.first_copy.vdev == *vdev && seen.first_copy.offset == *offset && extra > 0 {
                    cloned_seen += 1;
                }
                if seen.links.len() as u64 != extra + 1 {
                    report.problem(format!(
                        "vdev {vdev} offset {offset:#x}: linked {} times, the block reference table counts {}",
                        seen.links.len(),
                        extra + 1
                    ));
                }
            }
            if cloned_seen != clones.len() {
                report.problem(format!(
                    "the block reference table names {} cloned blocks, {cloned_seen} are in the trees",
                    clones.len()
                ));
            }
        }
        let allocator = self.store.allocator.borrow();
        if let Err(problem) = allocator.verify() {
            report.problem(problem);
        }
        for (vdev, space) in allocator.vdevs.iter().enumerate() {
            let allocated = space.live_ranges();
            report.allocated_bytes += allocated.total_bytes();
            for (start, end) in referenced[vdev].iter() {
                if !allocated.contains(start, end) {
                    // Name the objects pointing into the range, to start a diagnosis.
                    let mut holders: Vec<String> = owners
                        .iter()
                        .filter(|((owner_vdev, offset), _)| {
                            *owner_vdev as usize == vdev && *offset >= start && *offset < end
                        })
                        .map(|((_, offset), seen)| {
                            format!(
                                "object {} at {offset:#x} written {}",
                                seen.owner, seen.written
                            )
                        })
                        .collect();
                    holders.sort();
                    holders.truncate(4);
                    report.problem(format!(
                        "vdev {vdev}: referenced {start:#x}..{end:#x} is not allocated ({})",
                        holders.join(", ")
                    ));
                }
            }
            for (start, end) in allocated.iter() {
                if !referenced[vdev].contains(start, end) {
                    // Find the part that is not referenced, for the message.
                    report.problem(format!("vdev {vdev}: allocated {start:#x}..{end:#x} is not (wholly) referenced: leaked"));
                }
            }
        }
        Ok(report)
    }

    /// The datasets a filesystem's blocks may have been linked in, from
    /// itself back through its origins: (an id per dataset, the txg of its
    /// origin snapshot, 0 for one that is not a clone). A block born after
    /// a dataset's origin was linked in that dataset. `short` may name a
    /// snapshot (`A/B@S`): its dataset's chain.
    fn origin_chain(
        &self,
        short: &str,
        ids: &mut std::collections::HashMap<String, u64>,
    ) -> Vec<(u64, u64)> {
        let directory = self.datasets.directory.read();
        let mut name = short.split('@').next().unwrap_or(short).to_string();
        let mut chain = Vec::new();
        // Bounded: a loop of origins would be a damaged directory.
        for _ in 0..ORIGIN_CHAIN_MAX {
            let next_id = ids.len() as u64 + 1;
            let id = *ids.entry(name.clone()).or_insert(next_id);
            let origin = directory
                .lineage(&name)
                .and_then(|lineage| lineage.origin.clone());
            let Some(origin) = origin else {
                chain.push((id, 0));
                break;
            };
            let txg = directory
                .snapshot(&origin)
                .map_or(0, |snapshot| snapshot.txg);
            chain.push((id, txg));
            name = origin.volume;
        }
        chain
    }
}

/// Clones of clones followed back at most, for the check's link counts.
const ORIGIN_CHAIN_MAX: usize = 1024;
