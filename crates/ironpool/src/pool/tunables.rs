//! Tunables of a running pool: knobs an operator turns with `ironpool tune`
//! or `serve -o`, not stored on disk (see [`PoolTunables`]).

use crate::pool::{Pool, PoolError, PoolTunables};
use crate::queue::{IoClass, QueueTunables};
use crate::units::parse_size;

impl Pool {
    /// The tunables in force.
    pub fn tunables(&self) -> PoolTunables {
        self.tunables.borrow().clone()
    }

    /// Sets one tunable by name: `txg_timeout_ms`, `dirty_sync_bytes`,
    /// `dirty_max_bytes`, `dirty_data_max_bytes` (0: write-back off),
    /// `aggregation_limit_bytes`, `read_gap_limit_bytes`,
    /// `max_active_total`, `CLASS_min_active`, `CLASS_max_active`, `classes`
    /// (on/off), `async_write_dirty_low_percent`, `async_write_dirty_high_percent`,
    /// `scrub_rate_bytes` (0: no limit), `fs_objects_loaded_max`,
    /// `dead_spill_pointers`,
    /// `log_group_wait_percent` (0..100), `log_commits_in_flight` (1 to
    /// `LOG_COMMITS_IN_FLIGHT_MAX`), `fs_durable_writes_fsync_gap` (0: off),
    /// `arc_max_bytes` (the read cache's size; 0 turns it off), `arc_drop`
    /// (any value: empties the read cache).
    pub fn set_tunable(&self, name: &str, value: &str) -> Result<(), PoolError> {
        if name == "classes" {
            let on = match value {
                "on" | "1" | "true" => true,
                "off" | "0" | "false" => false,
                _ => {
                    return Err(PoolError::InvalidArgument(format!(
                        "classes takes on or off, not '{value}'"
                    )))
                }
            };
            let mut tunables = self.tunables.borrow_mut();
            tunables.queue.classes = on;
            for top in self.store.vdevs().iter() {
                for leaf in &top.children {
                    leaf.queue.set_tunables(tunables.queue.clone());
                }
            }
            return Ok(());
        }
        if name == "arc_drop" {
            self.store.cache.clear();
            return Ok(());
        }
        let number = parse_size(value).map_err(PoolError::InvalidArgument)?;
        if name == "arc_max_bytes" {
            self.tunables.borrow_mut().arc_max_bytes = number;
            self.store.cache.set_max_bytes(number);
            return Ok(());
        }
        let mut tunables = self.tunables.borrow_mut();
        let mut queue: QueueTunables = tunables.queue.clone();
        match name {
            "txg_timeout_ms" => {
                tunables.txg_timeout = std::time::Duration::from_millis(number.max(1))
            }
            "dirty_sync_bytes" => tunables.dirty_sync_bytes = number,
            "dirty_max_bytes" => tunables.dirty_max_bytes = number,
            "dirty_data_max_bytes" => tunables.dirty_data_max_bytes = number,
            "scrub_rate_bytes" => tunables.scrub_rate_bytes = number,
            "fs_objects_loaded_max" => tunables.fs_objects_loaded_max = number.max(1),
            "dead_spill_pointers" => tunables.dead_spill_pointers = number.max(1),
            "log_group_wait_percent" => tunables.log_group_wait_percent = number.min(100),
            "fs_durable_writes_fsync_gap" => {
                tunables.fs_durable_writes_fsync_gap = number.min(u32::MAX as u64)
            }
            "log_commits_in_flight" => {
                tunables.log_commits_in_flight = number.clamp(
                    1,
                    crate::pool::dataset::intent_log::LOG_COMMITS_IN_FLIGHT_MAX,
                )
            }
            "aggregation_limit_bytes" => {
                queue.aggregation_limit_bytes = number.min(16 << 20) as u32
            }
            "read_gap_limit_bytes" => queue.read_gap_limit_bytes = number.min(1 << 20) as u32,
            "max_active_total" => queue.max_active_total = number.clamp(1, 4096) as u32,
            "async_write_dirty_low_percent" => {
                queue.async_write_dirty_low_percent = number.min(1000) as u32
            }
            "async_write_dirty_high_percent" => {
                queue.async_write_dirty_high_percent = number.min(1000) as u32
            }
            "sync_write_max_active_under_reads" => {
                queue.sync_write_max_active_under_reads = number.clamp(1, 4096) as u32
            }
            _ => {
                let (class_name, is_min) = if let Some(class) = name.strip_suffix("_min_active") {
                    (class, true)
                } else if let Some(class) = name.strip_suffix("_max_active") {
                    (class, false)
                } else {
                    return Err(PoolError::InvalidArgument(format!(
                        "unknown tunable '{name}'"
                    )));
                };
                let Some(class) = IoClass::ALL.iter().find(|class| class.name() == class_name)
                else {
                    return Err(PoolError::InvalidArgument(format!(
                        "unknown tunable '{name}'"
                    )));
                };
                let limits = &mut queue.class_limits[*class as usize];
                let value = number.clamp(1, 4096) as u32;
                if is_min {
                    limits.min_active = value;
                } else {
                    limits.max_active = value;
                }
                if limits.min_active > limits.max_active {
                    return Err(PoolError::InvalidArgument(format!(
                        "{class_name}: min_active above max_active"
                    )));
                }
            }
        }
        for top in self.store.vdevs().iter() {
            for leaf in &top.children {
                leaf.queue.set_tunables(queue.clone());
            }
        }
        tunables.queue = queue;
        Ok(())
    }
}
