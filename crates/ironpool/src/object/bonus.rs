//! The attributes of an encrypted filesystem's objects, sealed in their
//! dnodes' bonus (`format::sealed_bonus`).
//!
//! They are sealed where a dnode is written into the table (the txg
//! build, [`ObjectSet::stored_bonus`]) and opened where it is read from it
//! ([`ObjectSet::opened_bonus`]): in memory, a loaded object holds its
//! attributes in the clear while the set's key is loaded, and sealed while
//! it is not (a raw receive or send without the key, which carries them
//! as they are). Loading and unloading the key turns the loaded objects
//! over ([`ObjectSet::open_loaded_bonuses`], [`ObjectSet::seal_loaded_bonuses`]),
//! so no attribute stays in memory in the clear once its key is gone.

use crate::crypto::{open_bonus, seal_bonus};
use crate::format::dnode::Bonus;
use crate::format::sealed_bonus::{is_sealed, SealedBonus};
use crate::format::{invalid, Dnode, ObjectType};

use super::{ObjectError, ObjectSet};

/// Whether objects of `object_type` keep their attributes (a znode) in
/// their bonus: an encrypted filesystem seals these.
pub fn holds_attributes(object_type: ObjectType) -> bool {
    matches!(
        object_type,
        ObjectType::FsFile | ObjectType::FsDirectory | ObjectType::FsXattr
    )
}

impl ObjectSet {
    /// Object `id`'s `dnode` as read from the table, its attributes opened
    /// when they are sealed and the set's key is loaded (left sealed when
    /// it is not). Attributes in the clear in a set that seals them all
    /// are refused, as a forged znode would be.
    pub(super) fn opened_bonus(&self, id: u64, dnode: &mut Dnode) -> Result<(), ObjectError> {
        let set_key = self.key.borrow();
        let Some(set_key) = set_key.as_ref() else {
            return Ok(());
        };
        if !holds_attributes(dnode.object_type) {
            return Ok(());
        }
        let corrupt = |error| ObjectError::Corrupt { object: id, error };
        match SealedBonus::decode(&dnode.bonus).map_err(corrupt)? {
            Some(sealed) => {
                if let Some(key) = set_key.ring.get(set_key.guid) {
                    dnode.bonus = open_bonus(&key, id, dnode.object_type, &sealed)
                        .map_err(|error| ObjectError::Sealing { object: id, error })?;
                }
                Ok(())
            }
            None if set_key.sealed_bonuses => Err(corrupt(invalid(
                "attributes",
                "an encrypted filesystem's object holds them in the clear",
            ))),
            None => Ok(()),
        }
    }

    /// The bonus object `id`'s `dnode` is stored with: in an encrypted
    /// filesystem's set, its attributes sealed (as they are when they are
    /// sealed in memory already: received raw without the key); else as
    /// it is. A filesystem made encrypted before attributes were sealed
    /// keeps them in the clear while its key is not loaded (a replay at
    /// import, a raw stream of an older build: they are so on the devices
    /// already). [`ObjectError::KeyUnavailable`] when they are in the clear
    /// in a set that seals them all and its key is not loaded: never met,
    /// as such a set holds them in the clear only while its key is loaded
    /// (unload-key seals them in memory, and every change without the key
    /// keeps them sealed).
    pub fn stored_bonus(&self, id: u64, dnode: &Dnode) -> Result<Bonus, ObjectError> {
        let set_key = self.key.borrow();
        let Some(set_key) = set_key.as_ref() else {
            return Ok(dnode.bonus);
        };
        if !holds_attributes(dnode.object_type) || is_sealed(&dnode.bonus) {
            return Ok(dnode.bonus);
        }
        let Some(key) = set_key.ring.get(set_key.guid) else {
            if !set_key.sealed_bonuses {
                return Ok(dnode.bonus);
            }
            return Err(ObjectError::KeyUnavailable { object: id });
        };
        seal_bonus(&key, id, dnode.object_type, &dnode.bonus)
            .map_err(|error| ObjectError::Sealing { object: id, error })
    }

    /// Whether an object's attributes found in the clear in this set are
    /// refused (every one was sealed from the start).
    pub fn seals_every_bonus(&self) -> bool {
        self.key
            .borrow()
            .as_ref()
            .is_some_and(|key| key.sealed_bonuses)
    }

    /// The attributes `bonus` of object `id` (of `object_type`) as this set
    /// keeps them in memory: opened when they are sealed and the key is
    /// loaded, checked when they are in the clear (a receive).
    pub fn accepted_bonus(
        &self,
        id: u64,
        object_type: ObjectType,
        bonus: Bonus,
    ) -> Result<Bonus, ObjectError> {
        let mut dnode = Dnode {
            object_type,
            bonus,
            ..Dnode::default()
        };
        self.opened_bonus(id, &mut dnode)?;
        Ok(dnode.bonus)
    }

    /// Opens the sealed attributes of every loaded object: the set's key
    /// was just loaded. Returns how many failed their MAC (left sealed:
    /// reading them says so).
    pub fn open_loaded_bonuses(&self) -> usize {
        let mut failed = 0;
        for object in self.loaded() {
            let mut dnode = object.dnode();
            if !is_sealed(&dnode.bonus) {
                continue;
            }
            match self.opened_bonus(object.id, &mut dnode) {
                Ok(()) => object.dnode.borrow_mut().bonus = dnode.bonus,
                Err(_) => failed += 1,
            }
        }
        failed
    }

    /// Seals the attributes of every loaded object in memory: the set's
    /// key is about to go, and no attribute stays in memory in the clear.
    /// The caller committed (no object is dirty), and the key is still
    /// loaded.
    /// On an error, what it sealed is opened again (the key stays).
    pub fn seal_loaded_bonuses(&self) -> Result<(), ObjectError> {
        for object in self.loaded() {
            let dnode = object.dnode();
            match self.stored_bonus(object.id, &dnode) {
                Ok(sealed) => object.dnode.borrow_mut().bonus = sealed,
                Err(error) => {
                    self.open_loaded_bonuses();
                    return Err(error);
                }
            }
        }
        Ok(())
    }

    /// Every loaded object but the table.
    fn loaded(&self) -> Vec<std::rc::Rc<super::Object>> {
        self.objects
            .borrow()
            .iter()
            .filter(|(id, _)| **id != 0)
            .map(|(_, object)| object.clone())
            .collect()
    }
}
