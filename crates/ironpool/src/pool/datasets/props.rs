//! The pool's property commands (`zfs get/set/inherit`): what a dataset
//! or the pool shows, and the checks and effects of setting and inheriting
//! a value. The values' rules (what is valid, what inherits from where)
//! are [`crate::pool::dataset::props`]'s.

use std::collections::BTreeMap;
use std::rc::Rc;

use crate::pool::dataset::props::{
    fixed, inherited, inherited_values, is_user_property, lookup, settings, space_limits, validate,
    validate_filesystem, Own, PropertyValue, Target, VolumeSettings, INHERITABLE, SPACE_PROPERTIES,
};
use crate::pool::Owner;
use crate::pool::{filesystem, Pool, PoolError};
impl Pool {
    /// What dataset `short` inherits, values only (see [`inherited`]).
    pub fn inherited_values(&self, short: &str) -> BTreeMap<String, String> {
        let directory = self.datasets.directory.read();
        inherited_values(&inherited(&directory, &self.name, short))
    }

    /// The settings dataset `short` follows with `local` properties.
    pub fn volume_settings(&self, short: &str, local: &BTreeMap<String, String>) -> VolumeSettings {
        settings(local, &self.inherited_values(short))
    }

    /// The properties dataset `short` has with `local` ones: what it
    /// inherits, overridden by its own. A filesystem's own properties
    /// (`recordsize`, `atime`, `xattr`, `mountpoint`) are read from this.
    pub fn effective_properties(
        &self,
        short: &str,
        local: &BTreeMap<String, String>,
    ) -> BTreeMap<String, String> {
        let mut properties = self.inherited_values(short);
        properties.extend(
            local
                .iter()
                .map(|(name, value)| (name.clone(), value.clone())),
        );
        properties
    }

    /// Recomputes every open volume's and filesystem's settings (after a
    /// property change: one on a parent changes its children's too).
    pub(in crate::pool) fn refresh_settings(&self) {
        let directory = self.datasets.directory.read();
        for (short, volume) in self.datasets.volumes.named() {
            if let Some(record) = directory.volumes.get(&short) {
                let passed = inherited_values(&inherited(&directory, &self.name, &short));
                volume.apply_settings(settings(&record.own_properties(), &passed));
            }
        }
        for (short, fs) in self.datasets.filesystems.named() {
            if let Some(record) = directory.filesystems.get(&short) {
                let passed = inherited_values(&inherited(&directory, &self.name, &short));
                let own = record.own_properties();
                let mut effective = passed.clone();
                effective.extend(own.clone());
                fs.apply_properties(settings(&own, &passed), &effective);
            }
        }
    }

    /// Sets properties on the pool (target "POOL") or a volume ("POOL/VOL"):
    /// all of them or none.
    pub async fn set_properties(
        self: &Rc<Self>,
        target: &str,
        assignments: &BTreeMap<String, String>,
    ) -> Result<(), PoolError> {
        let _admin = self.datasets.admin_lock.acquire(1).await;
        self.txg.ensure_writable()?;
        if target.contains('@') {
            return Err(PoolError::InvalidArgument(format!(
                "{target}: snapshots are read-only; their properties cannot be set"
            )));
        }
        let kind = self.property_target(target)?;
        let mut assignments = assignments.clone();
        if let Target::Volume(short) = &kind {
            self.follow_volume_size(short, &mut assignments)?;
        }
        let mut normalised = BTreeMap::new();
        for (name, value) in &assignments {
            if let Target::Filesystem(_) = &kind {
                // A user's or group's quota is kept under its numeric id.
                if let Some((name, value)) = filesystem::id_space::validate_id_quota(name, value)? {
                    normalised.insert(name, value);
                    continue;
                }
            }
            let value = match &kind {
                Target::Filesystem(_) => validate_filesystem(name, value)?,
                Target::Pool => validate(name, value, true)?,
                Target::Volume(_) => validate(name, value, false)?,
            };
            normalised.insert(name.clone(), value);
        }
        if normalised
            .keys()
            .any(|name| SPACE_PROPERTIES.contains(&name.as_str()))
        {
            self.check_space_properties(&kind, &normalised).await?;
        }
        // Where `load-key` finds the key lives with the key, not among the
        // dataset's properties: checked before anything changes.
        let keylocation = normalised.remove("keylocation");
        if keylocation.is_some() {
            let encrypted = match &kind {
                Target::Volume(short) => self.volume_record(short)?.crypt.is_some(),
                Target::Filesystem(short) => self
                    .filesystem_record(short)
                    .is_some_and(|record| record.crypt.is_some()),
                Target::Pool => false,
            };
            if !encrypted {
                return Err(PoolError::InvalidArgument(format!(
                    "{target}: keylocation is a property of encrypted volumes and filesystems"
                )));
            }
        }
        if let (Target::Filesystem(short), Some(location)) = (&kind, keylocation.clone()) {
            self.set_keylocation(short, location);
        }
        if let Target::Volume(short) = &kind {
            if let Some(size) = normalised.remove("volsize") {
                self.resize_volume(
                    short,
                    size.parse()
                        .map_err(|_| PoolError::InvalidArgument(format!("volsize {size}")))?,
                )?;
            }
            // After the resize, which may still refuse the whole `set`.
            if let Some(location) = keylocation {
                self.set_keylocation(short, location);
            }
        }
        self.properties_of(&kind, target, |properties| properties.extend(normalised))?;
        self.refresh_settings();
        self.refresh_reservations();
        let committed = self.commit().await;
        // A mount follows its filesystem's mountpoint, atime and readonly.
        self.datasets.filesystems_changed.notify_all();
        committed
    }

    /// A volume's `refreservation` follows its size where it is thick, as
    /// in OpenZFS: `auto` becomes the thick value for the size it will
    /// have, and a `volsize` that grows a volume whose refreservation is
    /// the thick value of its current size raises it too (unless the same
    /// `set` gives one).
    fn follow_volume_size(
        &self,
        short: &str,
        assignments: &mut BTreeMap<String, String>,
    ) -> Result<(), PoolError> {
        let record = self.volume_record(short)?;
        let current = record.size_bytes;
        let size = match assignments.get("volsize") {
            Some(text) => crate::units::parse_size(text)
                .map_err(|error| PoolError::InvalidArgument(format!("volsize {text}: {error}")))?,
            None => current,
        };
        let thick =
            |size| crate::pool::volume::thick_reservation(size, record.block_bytes).to_string();
        match assignments.get("refreservation").map(String::as_str) {
            Some("auto") => {
                assignments.insert("refreservation".into(), thick(size));
            }
            Some(_) => {}
            None if size != current
                && record.properties.get("refreservation") == Some(&thick(current)) =>
            {
                assignments.insert("refreservation".into(), thick(size));
            }
            None => {}
        }
        Ok(())
    }

    /// Checks the quotas and reservations `assignments` give dataset
    /// `kind` against what it uses ([`Pool::check_space_limits`]).
    async fn check_space_properties(
        self: &Rc<Self>,
        kind: &Target,
        assignments: &BTreeMap<String, String>,
    ) -> Result<(), PoolError> {
        let mut properties = {
            let directory = self.datasets.directory.read();
            match kind {
                Target::Volume(short) => directory
                    .volumes
                    .get(short)
                    .map(|record| record.own_properties()),
                Target::Filesystem(short) => directory
                    .filesystems
                    .get(short)
                    .map(|record| record.own_properties()),
                Target::Pool => None,
            }
            .unwrap_or_default()
        };
        properties.extend(assignments.clone());
        let limits = space_limits(&properties);
        match kind {
            Target::Volume(short) => {
                let volume = self.volume(short)?;
                self.check_space_limits(Owner::Volume(&volume), limits)
                    .await
            }
            Target::Filesystem(short) => {
                let fs = self.datasets.filesystems.get(short).ok_or_else(|| {
                    PoolError::InvalidArgument(format!("no filesystem '{short}'"))
                })?;
                let _shared = fs.shared().await;
                self.check_space_limits(Owner::Filesystem(&fs), limits)
                    .await
            }
            Target::Pool => Ok(()),
        }
    }

    /// What `target` names, for `set`, `inherit` and `get`.
    fn property_target(&self, target: &str) -> Result<Target, PoolError> {
        if target == self.name {
            return Ok(Target::Pool);
        }
        if let Ok(fs) = self.filesystem(target) {
            let short = fs.short_name().to_string();
            return Ok(Target::Filesystem(short));
        }
        Ok(Target::Volume(
            self.volume(target)?.short_name().to_string(),
        ))
    }

    /// Runs `change` on the stored properties of `kind`.
    fn properties_of(
        &self,
        kind: &Target,
        target: &str,
        change: impl FnOnce(&mut BTreeMap<String, String>),
    ) -> Result<(), PoolError> {
        let mut directory = self.datasets.directory.edit();
        let properties = match kind {
            Target::Pool => &mut directory.properties,
            Target::Volume(short) => {
                &mut directory
                    .volumes
                    .get_mut(short)
                    .ok_or_else(|| PoolError::NoSuchVolume(target.to_string()))?
                    .properties
            }
            Target::Filesystem(short) => {
                &mut directory
                    .filesystems
                    .get_mut(short)
                    .ok_or_else(|| PoolError::InvalidArgument(format!("no filesystem '{target}'")))?
                    .properties
            }
        };
        change(properties);
        Ok(())
    }

    /// Removes a local setting so the value is inherited again (`inherit`).
    pub async fn inherit_property(
        self: &Rc<Self>,
        target: &str,
        name: &str,
    ) -> Result<(), PoolError> {
        let _admin = self.datasets.admin_lock.acquire(1).await;
        self.txg.ensure_writable()?;
        let kind = self.property_target(target)?;
        // A pool's autotrim and a filesystem's own properties return to
        // their defaults.
        let to_default = match kind {
            Target::Pool => name == "autotrim",
            Target::Filesystem(_) => filesystem::OWN_PROPERTIES.contains(&name),
            Target::Volume(_) => false,
        };
        if !INHERITABLE.iter().any(|(key, _)| *key == name)
            && !is_user_property(name)
            && !to_default
        {
            return Err(PoolError::InvalidArgument(format!(
                "{name} cannot be inherited"
            )));
        }
        self.properties_of(&kind, target, |properties| {
            properties.remove(name);
        })?;
        self.refresh_settings();
        let committed = self.commit().await;
        self.datasets.filesystems_changed.notify_all();
        committed
    }

    /// Grows a volume (shrinking would cut off data a client wrote).
    fn resize_volume(&self, short: &str, size_bytes: u64) -> Result<(), PoolError> {
        let volume = self.volume(short)?;
        let current = volume.size_bytes.get();
        if size_bytes < current {
            return Err(PoolError::InvalidArgument(format!(
                "volsize {size_bytes} is smaller than the current {current}: volumes only grow"
            )));
        }
        if !size_bytes.is_multiple_of(volume.block_bytes)
            || size_bytes > crate::pool::volume::VOLUME_SIZE_MAX_BYTES
        {
            return Err(PoolError::InvalidArgument(format!(
                "volsize {size_bytes} must be a multiple of the volblocksize {} up to {}",
                volume.block_bytes,
                crate::pool::volume::VOLUME_SIZE_MAX_BYTES
            )));
        }
        volume.size_bytes.set(size_bytes);
        self.datasets
            .directory
            .edit()
            .volumes
            .get_mut(short)
            .ok_or_else(|| PoolError::NoSuchVolume(short.to_string()))?
            .size_bytes = size_bytes;
        volume.object.dnode.borrow_mut().length_bytes = size_bytes;
        volume.object.dirty.set(true);
        Ok(())
    }

    /// The properties of the pool, a volume or a snapshot: every one, or those named.
    pub async fn get_properties(
        self: &Rc<Self>,
        target: &str,
        names: &[String],
    ) -> Result<Vec<PropertyValue>, PoolError> {
        let mut values: Vec<(String, String, String)> = Vec::new();
        let pool_properties = self.datasets.directory.read().properties.clone();
        if target == self.name {
            let (size, free) = self.space();
            values.push(fixed("type", "pool"));
            values.push(fixed("size", size));
            values.push(fixed("allocated", size - free));
            values.push(fixed("free", free));
            values.push(fixed(
                "capacity",
                format!("{}%", ((size - free) * 100).checked_div(size).unwrap_or(0)),
            ));
            values.push(fixed("health", self.health()));
            values.push(fixed("guid", format!("{:#x}", self.guid)));
            for (name, default) in INHERITABLE {
                let (value, source) = match pool_properties.get(name) {
                    Some(value) => (value.clone(), "local".to_string()),
                    None => (default.to_string(), "default".to_string()),
                };
                values.push((name.into(), value, source));
            }
            let (autotrim, source) = match pool_properties.get("autotrim") {
                Some(value) => (value.clone(), "local"),
                None => ("off".to_string(), "default"),
            };
            values.push(("autotrim".into(), autotrim, source.into()));
            for (name, value) in pool_properties
                .iter()
                .filter(|(name, _)| is_user_property(name))
            {
                values.push((name.clone(), value.clone(), "local".into()));
            }
        } else if target.contains('@') {
            values.extend(self.snapshot_properties(target).await?);
        } else if let Target::Filesystem(short) = self.property_target(target)? {
            let record = self
                .filesystem_record(&short)
                .ok_or_else(|| PoolError::InvalidArgument(format!("no filesystem '{target}'")))?;
            values.push(fixed("type", "filesystem"));
            let space = self.volume_space(&short).await?;
            values.extend(space_values(&space));
            let available = self.available_bytes(&short).await?;
            values.push(fixed("available", available));
            let passed = inherited(&self.datasets.directory.read(), &self.name, &short);
            let own = Own {
                local: &record.properties,
                received: &record.received,
            };
            for name in filesystem::OWN_PROPERTIES {
                let (value, source) = match (own.get(name), passed.get(name)) {
                    (Some(found), _) => found,
                    (None, Some((value, from))) => {
                        (value.clone(), format!("inherited from {from}"))
                    }
                    (None, None) => (
                        filesystem::own_property_default(&self.name, &short, name),
                        "default".to_string(),
                    ),
                };
                values.push((name.into(), value, source));
            }
            let mounted = if self.mounted_at(&short).is_some() {
                "yes"
            } else {
                "no"
            };
            values.push(fixed("mounted", mounted));
            values.extend(self.encryption_values(&short, record.crypt.as_ref()));
            values.extend(self.id_values(&short, &own, names).await?);
            let origin = self
                .origin_name(&record.lineage)
                .unwrap_or_else(|| "-".into());
            values.push(fixed("origin", origin));
            values.extend(dataset_values(
                record.guid,
                record.created_txg,
                &own,
                &inherited(&self.datasets.directory.read(), &self.name, &short),
            ));
        } else {
            let volume = self.volume(target)?;
            let short = volume.short_name().to_string();
            let record = self.volume_record(&short)?;
            let space = self.volume_space(&short).await?;
            values.push(fixed("type", "volume"));
            values.extend(space_values(&space));
            let available = self.available_bytes(&short).await?;
            values.push(fixed("available", available));
            values.push((
                "volsize".into(),
                volume.size_bytes.get().to_string(),
                "local".into(),
            ));
            values.push(fixed("volblocksize", volume.block_bytes));
            values.extend(self.encryption_values(&short, record.crypt.as_ref()));
            let origin = self
                .origin_name(&record.lineage)
                .unwrap_or_else(|| "-".into());
            values.push(fixed("origin", origin));
            values.extend(dataset_values(
                record.guid,
                record.created_txg,
                &Own {
                    local: &record.properties,
                    received: &record.received,
                },
                &inherited(&self.datasets.directory.read(), &self.name, &short),
            ));
        }
        let wanted = |name: &str| {
            names.is_empty() || names.iter().any(|wanted| wanted == "all" || wanted == name)
        };
        for name in names {
            if name != "all"
                && !values.iter().any(|(have, _, _)| have == name)
                && !is_user_property(name)
            {
                return Err(PoolError::InvalidArgument(format!(
                    "unknown property '{name}'"
                )));
            }
        }
        let mut rows: Vec<PropertyValue> = values
            .into_iter()
            .filter(|(name, _, _)| wanted(name))
            .map(|(property, value, source)| PropertyValue {
                name: target.to_string(),
                property,
                value,
                source,
            })
            .collect();
        // A user property asked for by name but set nowhere shows as "-".
        for name in names.iter().filter(|name| is_user_property(name)) {
            if !rows.iter().any(|row| &row.property == name) {
                rows.push(PropertyValue {
                    name: target.to_string(),
                    property: name.clone(),
                    value: "-".into(),
                    source: "-".into(),
                });
            }
        }
        Ok(rows)
    }

    /// The rows of the user, group and project quotas and figures asked for by
    /// name (`userquota@alice`, `groupused@100`) of filesystem `short`.
    async fn id_values(
        self: &Rc<Self>,
        short: &str,
        own: &Own<'_>,
        names: &[String],
    ) -> Result<Vec<(String, String, String)>, PoolError> {
        use filesystem::id_space::{id_property, resolve_id};
        let mut values = Vec::new();
        let mut usage = None;
        for name in names {
            let Some((kind, quota, who)) = id_property(name) else {
                continue;
            };
            let id = resolve_id(kind, who)?;
            if quota {
                let stored = own.get(&filesystem::id_space::quota_name(kind, id));
                values.push(limit_row(name, stored));
                continue;
            }
            if usage.is_none() {
                usage = Some(
                    self.id_space(short, &filesystem::id_space::ID_KINDS)
                        .await?,
                );
            }
            let used = usage
                .iter()
                .flatten()
                .find(|row| row.kind == kind && row.id == id)
                .map_or(0, |row| row.used_bytes);
            values.push(fixed(name, used));
        }
        Ok(values)
    }

    async fn snapshot_properties(
        self: &Rc<Self>,
        target: &str,
    ) -> Result<Vec<(String, String, String)>, PoolError> {
        let (volume, snapshot) = crate::pool::dataset::split_snapshot_name(&self.name, target)
            .ok_or_else(|| PoolError::NoSuchSnapshot(target.to_string()))?;
        let infos = self.snapshots(volume).await?;
        let info = infos
            .iter()
            .find(|info| info.name.ends_with(&format!("@{snapshot}")))
            .ok_or_else(|| PoolError::NoSuchSnapshot(target.to_string()))?;
        let common = |logical: u64, physical: u64| -> Vec<(String, String, String)> {
            let ratio = if physical == 0 {
                1.0
            } else {
                logical as f64 / physical as f64
            };
            vec![
                fixed("type", "snapshot"),
                fixed("used", info.used_bytes),
                fixed("referenced", info.referenced_bytes),
                fixed("logicalreferenced", logical),
                fixed("compressratio", format!("{ratio:.2}x")),
            ]
        };
        let mut values = if self.filesystem(volume).is_ok() {
            let (_, logical, physical) = self.snapshot_referenced(target).await?;
            let mut values = common(logical, physical);
            let crypt = self
                .filesystem_record(volume)
                .and_then(|record| record.crypt);
            values.extend(self.encryption_values(volume, crypt.as_ref()));
            values
        } else {
            let record = self.volume_record(volume)?;
            let snapshot_volume = self.snapshot_volume(target).await?;
            let dnode = snapshot_volume.object.dnode();
            let mut values = common(dnode.logical_bytes, dnode.physical_bytes);
            values.push(fixed("volsize", snapshot_volume.size_bytes.get()));
            values.push(fixed("volblocksize", record.block_bytes));
            values.extend(self.encryption_values(volume, record.crypt.as_ref()));
            values
        };
        values.extend([
            fixed("guid", info.guid.clone()),
            fixed("createtxg", info.txg),
            fixed("creation", info.created_unix_seconds),
            fixed("userrefs", info.userrefs),
        ]);
        Ok(values)
    }
}

/// A dataset's guid and creation txg, then its inheritable settings and
/// user properties (it has `local` ones), with their sources.
fn dataset_values(
    guid: u64,
    created_txg: u64,
    own: &Own<'_>,
    inherited: &BTreeMap<String, (String, String)>,
) -> Vec<(String, String, String)> {
    let mut values = vec![
        fixed("guid", format!("{guid:#x}")),
        fixed("createtxg", created_txg),
    ];
    for (name, _) in INHERITABLE {
        if let Some((value, source)) = lookup(own, inherited, name) {
            values.push((name.into(), value, source));
        }
    }
    for name in SPACE_PROPERTIES {
        values.push(limit_row(name, own.get(name)));
    }
    let mut user: BTreeMap<String, (String, String)> = BTreeMap::new();
    for (name, (value, from)) in inherited.iter().filter(|(name, _)| is_user_property(name)) {
        user.insert(
            name.clone(),
            (value.clone(), format!("inherited from {from}")),
        );
    }
    for (name, found) in own
        .all()
        .into_iter()
        .filter(|(name, _)| is_user_property(name))
    {
        user.insert(name, found);
    }
    values.extend(
        user.into_iter()
            .map(|(name, (value, source))| (name, value, source)),
    );
    values
}

/// The `get` row of quota or reservation `name`, set locally to `stored`
/// or not set (none, by default: never inherited).
/// `stored`: its value and source (`local`, `received`), if set.
fn limit_row(name: &str, stored: Option<(String, String)>) -> (String, String, String) {
    match stored {
        Some((value, source)) => (name.into(), value, source),
        None => (name.into(), "none".into(), "default".into()),
    }
}

fn space_values(
    space: &crate::pool::datasets::snapshot::VolumeSpace,
) -> Vec<(String, String, String)> {
    vec![
        fixed("used", space.used_bytes),
        fixed("referenced", space.referenced_bytes),
        fixed("usedbydataset", space.used_by_dataset_bytes),
        fixed("usedbysnapshots", space.used_by_snapshots_bytes),
        fixed("usedbyrefreservation", space.used_by_refreservation_bytes),
        fixed("usedbychildren", space.used_by_children_bytes),
        fixed("written", space.written_bytes),
        fixed("logicalused", space.logical_used_bytes),
        fixed("logicalreferenced", space.logical_referenced_bytes),
        fixed("compressratio", format!("{:.2}x", space.compress_ratio)),
    ]
}
