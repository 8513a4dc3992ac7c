//! The keys of encrypted datasets, on the pool: load, unload and change
//! a key, find a dataset's encryption root and the key a new dataset
//! takes. The key records, their wrapping and the keys loaded now are
//! [`crate::pool::dataset::keys`]'s.

use std::rc::Rc;

use zeroize::Zeroizing;

use crate::crypto::{CryptoError, DatasetKey, KeyFormat, KeyParams, MasterKey};
use crate::pool::dataset::directory::CryptRecord;
use crate::pool::dataset::keys::{
    check_keylocation, decode_wrapped, derive_wrapping, hex, invalid, key_file, read_key_file,
    CreateKey, NewEncryption,
};
use crate::pool::volume::Volume;
use crate::pool::{Pool, PoolError};
impl Pool {
    /// Whether `volume`'s data can be read and written now: it is not
    /// encrypted, or its key is loaded. NBD exports only such volumes.
    pub fn volume_key_available(&self, volume: &Volume) -> bool {
        volume
            .key_guid()
            .is_none_or(|guid| self.datasets.keys.available(guid))
    }

    /// The key of an encrypted volume's blocks, or why there is none.
    pub(crate) fn data_key(&self, guid: u64) -> Result<Rc<DatasetKey>, PoolError> {
        self.datasets.keys.get(guid).ok_or_else(|| {
            PoolError::KeyUnavailable("an encrypted dataset's key is not loaded".into())
        })
    }

    /// The encryption record dataset `short` is created with, from `key`
    /// (see [`CreateKey`]), and whether it is a new encryption root whose
    /// key this loaded (the caller unloads it again if the dataset is not
    /// made). One rule for volumes and filesystems, created or received:
    /// a new root (its master key made, a passphrase stretched), the
    /// sender's root (a raw stream), or the key of the encrypted
    /// filesystem it is under, refused with `encryption=off` there or when
    /// that key is not loaded.
    pub(crate) async fn crypt_of_new(
        &self,
        short: &str,
        key: Option<CreateKey>,
    ) -> Result<(Option<CryptRecord>, bool), PoolError> {
        Ok(match key {
            Some(CreateKey::New(encryption)) => (
                Some(
                    self.new_encryption_root(&format!("{}/{short}", self.name), encryption)
                        .await?,
                ),
                true,
            ),
            Some(CreateKey::Received(record)) => (Some(record), false),
            Some(CreateKey::Off) => (self.inherited_crypt(short, true)?, false),
            None => (self.inherited_crypt(short, false)?, false),
        })
    }

    /// A new encryption root for a volume or filesystem being created: its
    /// master key, wrapped under the user's key, loaded.
    pub(crate) async fn new_encryption_root(
        &self,
        name: &str,
        encryption: NewEncryption,
    ) -> Result<CryptRecord, PoolError> {
        let material = match encryption.material {
            Some(material) => material,
            None => read_key_file(name, &encryption.keylocation)?,
        };
        let wrapping = derive_wrapping(encryption.params, material).await?;
        let master = MasterKey::generate(encryption.suite).map_err(invalid)?;
        let wrapped = master
            .wrap(&wrapping, &encryption.params)
            .map_err(invalid)?;
        let record = CryptRecord {
            key_guid: crate::format::new_guid(),
            wrapped_key: hex(&wrapped.encode()),
            keylocation: encryption.keylocation,
        };
        // A new guid: no key of it is loaded.
        let _ = self
            .datasets
            .keys
            .keys
            .insert(record.key_guid, DatasetKey::new(master));
        Ok(record)
    }

    /// The encryption record of dataset `name` (POOL/NAME: a volume or a
    /// filesystem), refused for one that is not encrypted.
    fn crypt_record(&self, name: &str) -> Result<CryptRecord, PoolError> {
        let short = name
            .strip_prefix(&format!("{}/", self.name))
            .unwrap_or(name);
        let directory = self.datasets.directory.read();
        match directory.crypt(short) {
            None => Err(PoolError::InvalidArgument(format!(
                "no volume or filesystem '{name}'"
            ))),
            Some(None) => Err(PoolError::InvalidArgument(format!(
                "{}/{short} is not encrypted",
                self.name
            ))),
            Some(Some(crypt)) => Ok(crypt.clone()),
        }
    }

    /// The key a new dataset `short` created without `encryption=on`
    /// takes: its parent filesystem's when that one is encrypted, as
    /// OpenZFS's children inherit their encryption root's key (its
    /// `encryptionroot` is then the parent's). Refused when the parent is
    /// encrypted and `off_given` (`-o encryption=off`: OpenZFS refuses an
    /// unencrypted child of an encrypted dataset too), or when the parent's
    /// key is not loaded (the child's directory could not be sealed).
    pub(crate) fn inherited_crypt(
        &self,
        short: &str,
        off_given: bool,
    ) -> Result<Option<CryptRecord>, PoolError> {
        let Some(crypt) = self.datasets.directory.read().parent_crypt(short).cloned() else {
            return Ok(None);
        };
        // `parent_crypt` found one: there is a parent.
        let parent = crate::pool::dataset::directory::parent_name(short).unwrap_or_default();
        let name = format!("{}/{short}", self.name);
        if off_given {
            return Err(PoolError::InvalidArgument(format!(
                "cannot create {name} with encryption=off: its parent {}/{parent} is encrypted, and its children share its key (or have one of their own: -o encryption=on -o keyformat=...)",
                self.name
            )));
        }
        if self.datasets.keys.get(crypt.key_guid).is_none() {
            return Err(PoolError::KeyUnavailable(format!(
                "cannot create {name}: it takes the key of {}/{parent}, which is not loaded (load-key it first)",
                self.name
            )));
        }
        Ok(Some(crypt))
    }

    /// Refuses to place a dataset whose key is `key_guid` (None: not
    /// encrypted) at `short`, by a rename or a clone, where its key would
    /// not fit: an unencrypted dataset under an encrypted filesystem, or
    /// one that shares its old parent's key (it took it when it was made)
    /// under a parent with another (its `encryptionroot` would no longer
    /// hold it). OpenZFS refuses both.
    pub(crate) fn check_key_placement(
        &self,
        short: &str,
        key_guid: Option<u64>,
        inherits: bool,
    ) -> Result<(), PoolError> {
        let parent = crate::pool::dataset::directory::parent_name(short);
        let parent_guid = self
            .datasets
            .directory
            .read()
            .parent_crypt(short)
            .map(|crypt| crypt.key_guid);
        let name = format!("{}/{short}", self.name);
        match (key_guid, parent_guid) {
            (None, Some(_)) => Err(PoolError::InvalidArgument(format!(
                "{name}: an unencrypted dataset cannot be under an encrypted filesystem ({}/{})",
                self.name,
                parent.unwrap_or_default()
            ))),
            (Some(guid), parent_guid) if inherits && parent_guid != Some(guid) => {
                Err(PoolError::InvalidArgument(format!(
                    "{name}: it shares the key of its encryption root, which would not be above it (give it a key of its own with change-key first)"
                )))
            }
            _ => Ok(()),
        }
    }

    /// Whether filesystem `fs` may be mounted and its data read: it is not
    /// encrypted, or its key is loaded (and not being unloaded).
    pub fn filesystem_key_available(&self, fs: &crate::pool::filesystem::Filesystem) -> bool {
        fs.key_guid()
            .is_none_or(|guid| self.datasets.keys.available(guid))
    }

    /// `load-key`: opens the master key of dataset `name` with the user's
    /// key (`material`, or read from its `keylocation`), so that it and
    /// every dataset sharing its key can be served (the server mounts such
    /// filesystems). A wrong key is refused
    /// and nothing is opened.
    pub async fn load_key(
        self: &Rc<Self>,
        name: &str,
        material: Option<Zeroizing<Vec<u8>>>,
    ) -> Result<(), PoolError> {
        let record = self.crypt_record(name)?;
        if self.datasets.keys.get(record.key_guid).is_some() {
            return Err(PoolError::InvalidArgument(format!(
                "the key of {name} is already loaded"
            )));
        }
        let wrapped = decode_wrapped(name, &record)?;
        let material = match material {
            Some(material) => material,
            None => read_key_file(name, &record.keylocation)?,
        };
        let wrapping = derive_wrapping(wrapped.params, material).await?;
        let master = wrapped.unwrap(&wrapping).map_err(|error| match error {
            CryptoError::WrongKey => {
                PoolError::InvalidArgument(format!("wrong key for {name}: nothing was loaded"))
            }
            other => invalid(other),
        })?;
        let key = DatasetKey::new(master);
        self.check_macs(record.key_guid, &key).await?;
        // Another load of the same key may have finished while this one
        // derived: the first stays.
        let mut opened = Ok(());
        if self.datasets.keys.keys.insert(record.key_guid, key) {
            opened = self.open_attributes(name, record.key_guid).await;
        }
        self.datasets.exports_gone.notify_all();
        // The server mounts the filesystems it opens.
        self.datasets.filesystems_changed.notify_all();
        opened
    }

    /// Checks the MAC of every authenticated dataset under key `guid` (its
    /// heads and snapshots) with `key`, before the key is loaded: a root
    /// dnode whose portable digest does not give its MAC was altered on the
    /// devices by someone without the key (or damaged past its checksum),
    /// and nothing of the key is loaded. The tree below each root is
    /// checked as it is read: each metadata block against the digest its
    /// pointer holds (docs/FORMAT.md, "Object-set MAC").
    async fn check_macs(&self, guid: u64, key: &DatasetKey) -> Result<(), PoolError> {
        let roots = self.datasets.directory.read().roots_under_key(guid);
        for (short, id) in roots {
            let name = format!("{}/{short}", self.name);
            let object = self
                .objects
                .open(id)
                .await
                .map_err(|error| PoolError::Corrupt(format!("{name}: {error}")))?;
            let dnode = object.dnode();
            if !dnode.is_authenticated() {
                continue;
            }
            let digest = crate::format::portable::dnode_digest(&dnode)
                .map_err(|error| PoolError::Corrupt(format!("{name}: {error}")))?;
            let mac = key.objset_mac(&digest).map_err(invalid)?;
            if mac != dnode.mac {
                return Err(PoolError::Corrupt(format!(
                    "{name}: its metadata does not give its MAC: altered on the devices without the key, or damaged; the key was not loaded"
                )));
            }
            object.mac_digest.set(Some(digest));
        }
        Ok(())
    }

    /// The key of `guid` was just loaded (by this call: one that raced it
    /// found it loaded and does nothing): the objects its filesystems (and
    /// their snapshots opened) hold with sealed attributes are opened, and
    /// the files a crash left unlinked in them, which the import could not
    /// free without the key, are freed now, before they are mounted; and
    /// so are set the times an older build's keyless replay kept. An
    /// intent log an import claimed is replayed first, and made durable
    /// before this returns. Each filesystem is taken whole meanwhile, as a
    /// rollback or destroy takes it.
    async fn open_attributes(self: &Rc<Self>, name: &str, guid: u64) -> Result<(), PoolError> {
        let filesystems: Vec<Rc<crate::pool::filesystem::Filesystem>> = self
            .all_filesystems()
            .into_iter()
            .map(|(_, fs)| fs)
            .chain(self.datasets.snapshot_filesystems.all_held())
            .filter(|fs| fs.key_guid() == Some(guid))
            .collect();
        for fs in &filesystems {
            let failed = fs.objects.open_loaded_bonuses();
            if failed > 0 {
                eprintln!(
                    "ironpool: {}: the attributes of {failed} objects failed their MAC (altered, or damaged in every copy)",
                    fs.name()
                );
            }
        }
        let mut replayed_any = false;
        for fs in filesystems {
            if fs.is_snapshot() {
                continue;
            }
            let _whole = fs.exclusive().await;
            if fs.is_retired() {
                continue;
            }
            self.set_replayed_times(&fs).await;
            // Its intent log, claimed at import, is replayed now; the
            // files that left with no names go after it, as at an import.
            let replayed = self.replay_claimed(&fs).await;
            replayed_any |= replayed;
            if !fs.orphans_sealed.replace(false) && !replayed {
                continue;
            }
            let _hold = self.txg.hold_builds();
            match fs.reclaim_unlinked(self).await {
                Ok(freed) if freed > 0 => eprintln!(
                    "ironpool: {}: freed {freed} objects removed while in use before the last shutdown (its key, {name}'s, is loaded)",
                    fs.name()
                ),
                Ok(_) => {}
                Err(error) => eprintln!(
                    "ironpool: {}: files left unlinked were not freed: {error}",
                    fs.name()
                ),
            }
        }
        // What was replayed is durable before the filesystems are served,
        // as an import's replay is; a removal that waited for the claims
        // goes on.
        if replayed_any {
            let txg = self.txg.open();
            self.txg.wait_durable(self, txg).await.map_err(|error| {
                PoolError::Io(format!(
                    "{name}: its key is loaded, and its intent log replayed, but the replay is not durable: {error}"
                ))
            })?;
            self.removal_resume();
        }
        Ok(())
    }

    /// Sets the times filesystem `fs`'s replay kept for its key (see
    /// `FilesystemRecord::replayed_times`), and drops them, in one txg.
    /// Times that could not be set for a reason that may pass (the key
    /// unloaded meanwhile, a read error) stay for the next load; damaged
    /// ones (their MAC failed) and those of files freed since go.
    async fn set_replayed_times(self: &Rc<Self>, fs: &crate::pool::filesystem::Filesystem) {
        use crate::pool::filesystem::FsError;
        let short = fs.short_name();
        let times = match self.filesystem_record(&short) {
            Some(record) if !record.replayed_times.is_empty() => record.replayed_times,
            _ => return,
        };
        let _hold = self.txg.hold_builds();
        let mut kept = Vec::new();
        for times in times {
            let result = match kept_attr(&times) {
                Some(attr) => fs.set_replayed_times(times.object, &attr).await,
                None => Err(FsError::Corrupt("malformed kept times".into())),
            };
            match result {
                // Freed since (it had no names left).
                Ok(()) | Err(FsError::NotFound) => {}
                Err(error) => {
                    eprintln!(
                        "ironpool: {}: file {}: the times its intent log kept were not set: {error}",
                        fs.name(),
                        times.object
                    );
                    if !matches!(error, FsError::Corrupt(_)) {
                        kept.push(times);
                    }
                }
            }
        }
        if let Some(record) = self.datasets.directory.edit().filesystems.get_mut(&short) {
            record.replayed_times = kept;
        }
    }

    /// `load-key -a` and `serve --load-keys`: loads the key of every
    /// encrypted dataset not loaded whose `keylocation` is a file. Returns
    /// each attempt, by dataset name.
    pub async fn load_keys_from_files(self: &Rc<Self>) -> Vec<(String, Result<(), PoolError>)> {
        let records: Vec<(String, CryptRecord)> = self
            .datasets
            .directory
            .read()
            .crypts()
            .filter(|(short, _)| !crate::pool::is_hidden_dataset(short))
            .map(|(short, crypt)| (short.clone(), crypt.clone()))
            .collect();
        let mut results = Vec::new();
        for (short, record) in records {
            if self.datasets.keys.get(record.key_guid).is_some()
                || key_file(&record.keylocation).is_none()
            {
                continue;
            }
            let name = format!("{}/{short}", self.name);
            let result = self.load_key(&name, None).await;
            results.push((name, result));
        }
        results
    }

    /// `unload-key`: the volumes of `name`'s key stop being served (their
    /// NBD clients are disconnected), what their write-back holds is
    /// written out under the key, and the key leaves memory (zeroed). Its
    /// filesystems must not be mounted (refused: unmount them first); their
    /// written-behind blocks are written out and a txg seals their
    /// directories' changes before the key goes, and the directory blocks
    /// their object sets hold opened are dropped.
    pub async fn unload_key(self: &Rc<Self>, name: &str) -> Result<(), PoolError> {
        // No receive, clone or other change of datasets meanwhile: what
        // they would write under the key is written before it goes.
        let _admin = self.datasets.admin_lock.acquire(1).await;
        let record = self.crypt_record(name)?;
        let guid = record.key_guid;
        if self.datasets.keys.get(guid).is_none() {
            return Err(PoolError::InvalidArgument(format!(
                "the key of {name} is not loaded"
            )));
        }
        if !self.datasets.keys.keys.begin_unload(guid) {
            return Err(PoolError::InvalidArgument(format!(
                "the key of {name} is being unloaded"
            )));
        }
        self.datasets.exports_gone.notify_all();
        let sharing: Vec<Rc<Volume>> = self
            .datasets
            .volumes
            .named()
            .into_iter()
            .map(|(_, volume)| volume)
            .filter(|volume| volume.key_guid() == Some(guid))
            .collect();
        let filesystems: Vec<Rc<crate::pool::filesystem::Filesystem>> = self
            .all_filesystems()
            .into_iter()
            .map(|(_, fs)| fs)
            .filter(|fs| fs.key_guid() == Some(guid))
            .collect();
        if let Some(fs) = filesystems
            .iter()
            .find(|fs| self.mounted_at(&fs.short_name()).is_some())
        {
            self.datasets.keys.keys.end_unload(guid);
            return Err(PoolError::InvalidArgument(format!(
                "{} is mounted: unmount it first (ironpool unmount {})",
                fs.name(),
                fs.name()
            )));
        }
        // A receive under the key writes directories with it between its
        // commands: it finishes (or is abandoned) first.
        if let Some(fs) = filesystems
            .iter()
            .find(|fs| crate::pool::is_hidden_dataset(&fs.short_name()))
        {
            self.datasets.keys.keys.end_unload(guid);
            return Err(PoolError::InvalidArgument(format!(
                "a receive into {} is in progress under this key: let it finish, or abandon it (receive -A), first",
                fs.name()
            )));
        }
        let mut drained = Ok(());
        for volume in &sharing {
            drained = drained.and(self.drain_volume(volume).await);
        }
        if !filesystems.is_empty() && drained.is_ok() {
            // Their written-behind blocks are sealed as they go out, and
            // their directories' blocks at the txg build: both before the
            // key goes.
            for fs in &filesystems {
                fs.settle_writes(None).await;
            }
            drained = self.commit().await;
        }
        if let Err(error) = drained {
            // The key stays: held blocks not written out need it.
            self.datasets.keys.keys.end_unload(guid);
            return Err(error);
        }
        // Snapshot views keep no data of their own; the ones opened are
        // dropped so that a later export opens them afresh.
        for volume in self.datasets.snapshot_volumes.all() {
            if volume.key_guid() == Some(guid) {
                self.datasets.snapshot_volumes.remove(&volume.name());
            }
        }
        // No attribute stays in memory in the clear once the key is gone.
        let sealing: Vec<Rc<crate::pool::filesystem::Filesystem>> = filesystems
            .iter()
            .cloned()
            .chain(self.datasets.snapshot_filesystems.all_held())
            .filter(|fs| fs.key_guid() == Some(guid))
            .collect();
        for (index, fs) in sealing.iter().enumerate() {
            if let Err(error) = fs.objects.seal_loaded_bonuses() {
                // The key stays: what was sealed is opened again.
                for done in &sealing[..index] {
                    done.objects.open_loaded_bonuses();
                }
                self.datasets.keys.keys.end_unload(guid);
                return Err(PoolError::Io(format!("{}: {error}", fs.name())));
            }
        }
        self.datasets.keys.keys.remove(guid);
        self.datasets.keys.keys.end_unload(guid);
        // Their directories' blocks are cached opened in their object
        // sets, and so are those of their snapshots opened.
        for fs in filesystems {
            fs.objects.drop_opened();
        }
        for fs in self.datasets.snapshot_filesystems.all_held() {
            if fs.key_guid() == Some(guid) {
                fs.objects.drop_opened();
            }
        }
        // The read cache holds opened blocks as plaintext: none stays once
        // their key is gone (the cache does not know whose they are, so
        // every opened block goes; an unload is rare).
        self.store.cache.drop_opened();
        // A mount that began before the unload and ended after it (a
        // load-key and an unload-key in a row) is taken down by the server.
        self.datasets.filesystems_changed.notify_all();
        Ok(())
    }

    /// `set keylocation=`: where `load-key` finds the key of volume
    /// `short` (encrypted; the value checked), for every volume that shares
    /// the key, as `change-key -o keylocation=` sets it, but without the
    /// key: only the location changes. Written by the caller's commit.
    pub(crate) fn set_keylocation(&self, short: &str, location: String) {
        let mut directory = self.datasets.directory.edit();
        let Some(key_guid) = directory.crypt(short).flatten().map(|crypt| crypt.key_guid) else {
            return;
        };
        for crypt in directory.crypts_sharing_key(key_guid) {
            crypt.keylocation = location.clone();
        }
    }

    /// `change-key`: wraps the master key of `name` (loaded) under a new
    /// user's key, in every volume that shares it, in one commit. The data
    /// is not rewritten; the old key opens nothing after the commit.
    pub async fn change_key(
        self: &Rc<Self>,
        name: &str,
        format: Option<KeyFormat>,
        keylocation: Option<String>,
        iterations: Option<u32>,
        material: Option<Zeroizing<Vec<u8>>>,
    ) -> Result<(), PoolError> {
        let _admin = self.datasets.admin_lock.acquire(1).await;
        self.txg.ensure_writable()?;
        let record = self.crypt_record(name)?;
        let Some(key) = self.datasets.keys.get(record.key_guid) else {
            return Err(PoolError::KeyUnavailable(format!(
                "{name}: load its key before changing it"
            )));
        };
        let old = decode_wrapped(name, &record)?;
        let format = format.unwrap_or(old.params.format);
        let iterations = match (format, iterations) {
            (KeyFormat::Passphrase, None) if old.params.format == KeyFormat::Passphrase => {
                Some(old.params.iterations)
            }
            (_, iterations) => iterations,
        };
        let params = KeyParams::new(format, iterations).map_err(invalid)?;
        let keylocation = keylocation.unwrap_or(record.keylocation.clone());
        check_keylocation(&keylocation)?;
        let material = match material {
            Some(material) => material,
            None => read_key_file(name, &keylocation)?,
        };
        let wrapping = derive_wrapping(params, material).await?;
        let wrapped = key.master().wrap(&wrapping, &params).map_err(invalid)?;
        let wrapped = hex(&wrapped.encode());
        {
            let mut directory = self.datasets.directory.edit();
            for crypt in directory.crypts_sharing_key(record.key_guid) {
                crypt.wrapped_key = wrapped.clone();
                crypt.keylocation = keylocation.clone();
            }
        }
        self.commit().await
    }

    /// The dataset whose key dataset `short` uses, by full name (the
    /// `encryptionroot` property): up its clones' origins and its parents
    /// while they share its key. A clone shares its origin's key, and a
    /// child created without a key of its own its parent's, so its root is
    /// the dataset the chain began with; a dataset created with its key,
    /// or received raw, is its own. None for one that is not encrypted.
    pub(crate) fn encryption_root(&self, short: &str) -> Option<String> {
        let directory = self.datasets.directory.read();
        let key_guid = directory.crypt(short)??.key_guid;
        let shares_key = |other: &str| {
            directory.crypt(other).flatten().map(|crypt| crypt.key_guid) == Some(key_guid)
        };
        let mut root = short.to_string();
        // Each step goes to an older dataset (a clone's origin) or up to a
        // parent (a child that took its key), while they share the key; the
        // bound stops a directory whose origins were damaged into a circle.
        for _ in 0..directory.volumes.len() + directory.filesystems.len() {
            let origin = directory
                .lineage(&root)
                .and_then(|lineage| lineage.origin.as_ref())
                .map(|origin| origin.volume.clone())
                .filter(|origin| shares_key(origin));
            let parent = crate::pool::dataset::directory::parent_name(&root)
                .filter(|parent| shares_key(parent))
                .map(str::to_string);
            match origin.or(parent) {
                Some(next) => root = next,
                None => break,
            }
        }
        Some(format!("{}/{root}", self.name))
    }

    /// The encryption properties of volume `short` (`get`): encryption,
    /// keyformat, keylocation, pbkdf2iters, keystatus and encryptionroot,
    /// as (name, value, source); `off`, `none` and `-` for one that is not
    /// encrypted.
    pub(crate) fn encryption_values(
        &self,
        short: &str,
        crypt: Option<&CryptRecord>,
    ) -> Vec<(String, String, String)> {
        use crate::pool::dataset::props::fixed;
        let Some(crypt) = crypt else {
            return vec![
                fixed("encryption", "off"),
                fixed("keyformat", "none"),
                fixed("keylocation", "none"),
                fixed("pbkdf2iters", "0"),
                fixed("keystatus", "none"),
                fixed("encryptionroot", "-"),
            ];
        };
        let Ok(wrapped) = decode_wrapped("", crypt) else {
            return vec![fixed("keystatus", "damaged")];
        };
        let root = self
            .encryption_root(short)
            .unwrap_or_else(|| format!("{}/{short}", self.name));
        let status = match self.datasets.keys.available(crypt.key_guid) {
            true => "available",
            false => "unavailable",
        };
        vec![
            fixed("encryption", wrapped.suite.name()),
            fixed("keyformat", wrapped.params.format.name()),
            fixed("keylocation", &crypt.keylocation),
            fixed("pbkdf2iters", wrapped.params.iterations),
            fixed("keystatus", status),
            fixed("encryptionroot", root),
        ]
    }
}

/// The attribute record a filesystem's replay kept `times` of; None when
/// they are malformed (the directory was altered).
fn kept_attr(
    times: &crate::pool::dataset::directory::ReplayedTimes,
) -> Option<crate::pool::dataset::intent_log::FileAttr> {
    use crate::format::intent_log::SealedTimes;
    use crate::format::znode::Timestamp;
    let at = |(seconds, nanos): (i64, u32)| Timestamp { seconds, nanos };
    let sealed = match &times.sealed {
        Some(text) => {
            let mut body = times.length.to_le_bytes().to_vec();
            body.extend(crate::pool::dataset::keys::unhex(text)?);
            Some(SealedTimes::from_body(&body).ok()?.1)
        }
        None => None,
    };
    if sealed.is_none() && (times.mtime.is_none() || times.ctime.is_none()) {
        return None;
    }
    Some(crate::pool::dataset::intent_log::FileAttr {
        txg: times.log_txg,
        length: times.length,
        mtime: times.mtime.map(at).unwrap_or_default(),
        ctime: times.ctime.map(at).unwrap_or_default(),
        sealed,
    })
}
