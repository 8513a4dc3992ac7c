//! A full consistency check of space accounting (like `zdb -b`): walk every block
//! of every object and compare what is referenced with what the space maps say is
//! allocated. Used by tests and by `ironpool check`.

use std::rc::Rc;

use serde::Serialize;

use super::Pool;
use crate::alloc::RangeSet;
use crate::format::dnode::DNODE_BYTES;
use crate::format::Dnode;

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
    /// references, no block outside allocated space). Call on a quiet pool.
    pub async fn check_space(self: &Rc<Self>) -> Result<CheckReport, super::PoolError> {
        self.commit().await?;
        let mut report = CheckReport::default();
        let vdev_count = self.store.vdevs.len();
        let mut referenced: Vec<RangeSet> = (0..vdev_count).map(|_| RangeSet::new()).collect();
        let table = self.objects.dnode_table();
        let count = table.dnode().length_bytes / DNODE_BYTES as u64;
        let mut objects = vec![table.clone()];
        for id in 1..count {
            let bytes = self.objects.read_bytes(&table, id * DNODE_BYTES as u64, DNODE_BYTES).await?;
            let dnode = Dnode::decode(&bytes).map_err(|error| super::PoolError::Corrupt(format!("dnode {id}: {error}")))?;
            if dnode.is_free() {
                continue;
            }
            objects.push(self.objects.open(id).await?);
        }
        report.objects = objects.len() as u64;
        for object in &objects {
            let mut copies = Vec::new();
            self.objects.visit_pointers(object, &mut |level, blkid, pointer| {
                for dva in pointer.copies() {
                    copies.push((level, blkid, *dva));
                }
            })
            .await?;
            for (level, blkid, dva) in copies {
                report.block_copies += 1;
                report.referenced_bytes += dva.asize as u64;
                let Some(set) = referenced.get_mut(dva.vdev as usize) else {
                    report.problem(format!("object {} block {level}/{blkid} on missing vdev {}", object.id, dva.vdev));
                    continue;
                };
                if set.try_insert(dva.offset, dva.end()).is_err() {
                    report.problem(format!("object {} block {level}/{blkid}: {:?} is referenced twice", object.id, dva));
                }
            }
        }
        let allocator = self.store.allocator.borrow();
        if let Err(problem) = allocator.verify() {
            report.problem(problem);
        }
        for (vdev, space) in allocator.vdevs.iter().enumerate() {
            let mut allocated = RangeSet::new();
            for metaslab in &space.metaslabs {
                for (start, end) in metaslab.allocated.iter().chain(metaslab.pending_allocs.iter()) {
                    allocated.insert(start, end);
                }
                for (start, end) in metaslab.pending_frees.iter() {
                    allocated.remove(start, end);
                }
            }
            report.allocated_bytes += allocated.total_bytes();
            for (start, end) in referenced[vdev].iter() {
                if !allocated.contains(start, end) {
                    report.problem(format!("vdev {vdev}: referenced {start:#x}..{end:#x} is not allocated"));
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
}
