//! The block reference table on disk (block cloning): the object that keeps
//! [`crate::block::clones::CloneTable`] across imports (format in
//! `format::clones` and docs/FORMAT.md).
//!
//! A txg build appends the counts' changes it took (the same image as the
//! trees whose links and kills made them), so the table on disk always
//! agrees with the trees of the same txg. When the object holds more than
//! twice the records the table needs (plus [`COMPACT_SLACK_RECORDS`]), the
//! build rewrites it whole instead, one record per cloned block.

use std::cell::{Cell, RefCell};
use std::rc::Rc;

use crate::format::clones::{decode_records, encode_records, CLONE_RECORD_BYTES};
use crate::format::ObjectType;
use crate::object::{Object, ObjectError};
use crate::pool::{Pool, PoolError};

/// Records the object may hold beyond twice the table's size before a
/// rewrite: so a table of a few blocks is not rewritten by every commit
/// (4096 records are 96 KiB).
const COMPACT_SLACK_RECORDS: u64 = 4096;

/// The table's object, held so that it stays loaded (the build writes it
/// without I/O).
#[derive(Default)]
pub(crate) struct CloneTableObject {
    object: RefCell<Option<Rc<Object>>>,
    /// Records in the object.
    records: Cell<u64>,
}

impl Pool {
    /// At import: reads the table the directory names (none in a pool that
    /// never cloned) into the store's counts. A table that cannot be read
    /// fails the import: without it a free could give back a block another
    /// file still uses.
    pub(in crate::pool) async fn load_clone_table(&self) -> Result<(), PoolError> {
        let id = self.datasets.directory.read().clone_table;
        if id == 0 {
            return Ok(());
        }
        let object = self.objects.open(id).await?;
        let length = object.length_bytes();
        let records = length / CLONE_RECORD_BYTES as u64;
        // A build appends only while the object holds at most twice the
        // live records plus the slack, and the live ones are bounded.
        let bound = 2 * crate::block::clones::CLONED_BLOCKS_MAX as u64 + COMPACT_SLACK_RECORDS;
        // (A length of no whole records is refused by the decoding.)
        if records > bound {
            return Err(PoolError::Corrupt(format!(
                "block reference table object {id} of {length} bytes"
            )));
        }
        let bytes = self.objects.read_bytes(&object, 0, length as usize).await?;
        let damaged = |error: String| PoolError::Corrupt(format!("block reference table: {error}"));
        let records = decode_records(&bytes).map_err(|error| damaged(error.to_string()))?;
        let mut table = self.store.clones.borrow_mut();
        for record in &records {
            table.apply(record).map_err(damaged)?;
        }
        // Reading it gave no changes to write.
        table.take_pending();
        self.clone_table.records.set(records.len() as u64);
        *self.clone_table.object.borrow_mut() = Some(object);
        Ok(())
    }

    /// Cloned blocks, and the bytes their clones save (for `status`).
    pub fn clone_figures(&self) -> (u64, u64) {
        let table = self.store.clones.borrow();
        (table.len() as u64, table.saved_bytes())
    }
}

/// A txg's build step: appends the counts' changes since the last build,
/// or rewrites the table when the appended records outgrow it; creates the
/// object with the first clone. True when it changed anything.
pub(in crate::pool) fn build_step(pool: &Pool, txg: u64) -> Result<bool, ObjectError> {
    let pending = pool.store.clones.borrow_mut().take_pending();
    if pending.is_empty() {
        return Ok(false);
    }
    let held = pool.clone_table.object.borrow().clone();
    let object = match held {
        Some(object) => object,
        None => {
            let (id, object) = pool.create_metadata_object(ObjectType::CloneTable, txg);
            pool.datasets.directory.edit().clone_table = id;
            pool.clone_table.records.set(0);
            *pool.clone_table.object.borrow_mut() = Some(object.clone());
            object
        }
    };
    let on_disk = pool.clone_table.records.get() + pending.len() as u64;
    let live = pool.store.clones.borrow().len() as u64;
    if on_disk > 2 * live + COMPACT_SLACK_RECORDS {
        let records = pool.store.clones.borrow().records();
        let bytes = encode_records(&records);
        pool.objects.write_bytes_cached(&object, 0, &bytes)?;
        if object.length_bytes() > bytes.len() as u64 {
            pool.objects.truncate_cached(&object, bytes.len() as u64)?;
        }
        pool.clone_table.records.set(records.len() as u64);
    } else {
        let offset = pool.clone_table.records.get() * CLONE_RECORD_BYTES as u64;
        pool.objects
            .write_bytes_cached(&object, offset, &encode_records(&pending))?;
        pool.clone_table.records.set(on_disk);
    }
    Ok(true)
}
