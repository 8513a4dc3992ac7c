//! Committing and replaying the intent logs of volumes and filesystems:
//! a FLUSH's or an `fsync`'s log write, its blocks freed once the txg
//! holding their changes is durable, and the records applied again at
//! import. A log's state and its records are
//! [`crate::pool::dataset::intent_log`]'s.

mod claim;
mod commit;
mod replay;

pub(crate) use replay::{apply_replay, prepare_replay};

use crate::pool::dataset::intent_log::build_step_of;
use crate::pool::{Owner, Pool};

/// Txg `txg` is being built: every log block whose records are all of txgs
/// up to `txg` is freed in it, and each chain's head moves past them in its
/// directory.
pub(crate) fn build_step(pool: &Pool, txg: u64) {
    for volume in pool.datasets.volumes.all() {
        build_step_of(pool, Owner::Volume(&volume), txg);
    }
    for fs in pool.datasets.filesystems.all() {
        build_step_of(pool, Owner::Filesystem(&fs), txg);
    }
}
