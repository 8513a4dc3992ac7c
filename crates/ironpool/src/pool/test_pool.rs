//! Pools on simulated devices for the engine's unit tests: one way to
//! build them, so a test says only what its pool is (its devices, their
//! layout, its tunables).

use std::rc::Rc;
use std::time::Duration;

use crate::dev::sim::SimDevice;
use crate::dev::Device;
use crate::format::label::TopVdevKind;
use crate::pool::{NewDevice, NewTopVdev, Pool, PoolTunables};

/// `disks` as an import names them: `sim:d0`, `sim:d1`, … in order.
pub(crate) fn named(disks: &[Rc<SimDevice>]) -> Vec<(String, Rc<dyn Device>)> {
    disks
        .iter()
        .enumerate()
        .map(|(index, disk)| (format!("sim:d{index}"), disk.clone() as Rc<dyn Device>))
        .collect()
}

/// A new pool `tank` of one top-level vdev of `kind` over `disks`.
pub(crate) async fn sim_pool(
    disks: &[Rc<SimDevice>],
    kind: TopVdevKind,
    tunables: PoolTunables,
) -> Rc<Pool> {
    let layout = vec![NewTopVdev {
        log: false,
        kind,
        devices: named(disks)
            .into_iter()
            .map(|(path, device)| NewDevice { path, device })
            .collect(),
    }];
    Pool::create_on_devices("tank", layout, false, tunables)
        .await
        .unwrap()
}

/// Default tunables with a txg timeout of a minute: only the test's own
/// commits (and the pool's size triggers) write txgs.
pub(crate) fn unhurried() -> PoolTunables {
    PoolTunables {
        txg_timeout: Duration::from_secs(60),
        ..PoolTunables::default()
    }
}
