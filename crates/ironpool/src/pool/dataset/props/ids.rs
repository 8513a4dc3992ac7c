//! The names and values of user, group and project quotas
//! (`userquota@NAME`, `groupquota@NAME`, `projectquota@ID`): which
//! property names they are, the ids a name stands for on the server's
//! host, and the values they take. How a filesystem keeps and checks
//! them is `pool::filesystem::id_space`'s.

use std::collections::BTreeMap;

use rustc_hash::FxHashMap;
use serde::Serialize;

use crate::pool::PoolError;

/// Whose space: a user's, a group's or a project's.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum IdKind {
    User,
    Group,
    Project,
}

/// Every kind of id, in the order `userspace`, `groupspace` and
/// `projectspace` are named.
pub const ID_KINDS: [IdKind; 3] = [IdKind::User, IdKind::Group, IdKind::Project];

impl IdKind {
    /// The prefix of its quota property.
    pub(in crate::pool) fn quota_prefix(self) -> &'static str {
        match self {
            IdKind::User => "userquota@",
            IdKind::Group => "groupquota@",
            IdKind::Project => "projectquota@",
        }
    }

    /// The prefix of its read-only figure.
    fn used_prefix(self) -> &'static str {
        match self {
            IdKind::User => "userused@",
            IdKind::Group => "groupused@",
            IdKind::Project => "projectused@",
        }
    }
}

/// The property holding the quota of `kind` `id`, as stored.
pub fn quota_name(kind: IdKind, id: u32) -> String {
    format!("{}{id}", kind.quota_prefix())
}

/// An id's quota or figure named by a property (`userquota@alice`,
/// `groupused@100`): its kind, whether it is the quota, and the name.
pub fn id_property(name: &str) -> Option<(IdKind, bool, &str)> {
    ID_KINDS.into_iter().find_map(|kind| {
        if let Some(id) = name.strip_prefix(kind.quota_prefix()) {
            return Some((kind, true, id));
        }
        name.strip_prefix(kind.used_prefix())
            .map(|id| (kind, false, id))
    })
}

/// The numeric id of user or group `name` (digits: itself), looked up on
/// this host; a project is named by its number.
pub fn resolve_id(kind: IdKind, name: &str) -> Result<u32, PoolError> {
    if let Ok(id) = name.parse::<u32>() {
        return Ok(id);
    }
    if kind == IdKind::Project {
        return Err(PoolError::InvalidArgument(format!(
            "a project is named by its number ('{name}' is not one)"
        )));
    }
    let unknown = || {
        PoolError::InvalidArgument(format!(
            "no {} named '{name}' on this host (give the numeric id)",
            match kind {
                IdKind::User => "user",
                IdKind::Group | IdKind::Project => "group",
            }
        ))
    };
    let c_name = std::ffi::CString::new(name).map_err(|_| unknown())?;
    let found = match kind {
        IdKind::User => host_entry(
            // SAFETY: every pointer is valid for the call.
            |entry, buffer, size, found| unsafe {
                libc::getpwnam_r(c_name.as_ptr(), entry, buffer, size, found)
            },
            |entry: &libc::passwd| entry.pw_uid,
        ),
        IdKind::Group | IdKind::Project => host_entry(
            // SAFETY: as above.
            |entry, buffer, size, found| unsafe {
                libc::getgrnam_r(c_name.as_ptr(), entry, buffer, size, found)
            },
            |entry: &libc::group| entry.gr_gid,
        ),
    };
    match found {
        Ok(Some(id)) => Ok(id),
        Ok(None) => Err(unknown()),
        Err(error) => Err(PoolError::InvalidArgument(format!(
            "looking up '{name}': {error}"
        ))),
    }
}

/// The name of user or group `id` on this host, if it has one (for
/// `userspace` and `groupspace`).
pub fn id_name(kind: IdKind, id: u32) -> Option<String> {
    if kind == IdKind::Project {
        return None;
    }
    let name = |name: *const libc::c_char| {
        // SAFETY: a found entry's name is a NUL-terminated string in the
        // lookup's buffer, which lives while it is read.
        unsafe { std::ffi::CStr::from_ptr(name) }
            .to_string_lossy()
            .into_owned()
    };
    let found = match kind {
        IdKind::User => host_entry(
            // SAFETY: every pointer is valid for the call.
            |entry, buffer, size, found| unsafe {
                libc::getpwuid_r(id, entry, buffer, size, found)
            },
            |entry: &libc::passwd| name(entry.pw_name),
        ),
        IdKind::Group | IdKind::Project => host_entry(
            // SAFETY: as above.
            |entry, buffer, size, found| unsafe {
                libc::getgrgid_r(id, entry, buffer, size, found)
            },
            |entry: &libc::group| name(entry.gr_name),
        ),
    };
    found.ok().flatten()
}

/// The largest buffer a user or group lookup gets (a group's members are
/// in it): past this, the name is not looked up.
const ID_LOOKUP_BUFFER_MAX: usize = 1 << 20;

/// An entry of the host's user or group database: plain old data, for
/// which all zeroes is a valid value.
trait HostEntry {}
impl HostEntry for libc::passwd {}
impl HostEntry for libc::group {}

/// One entry of the host's user or group database, found by `call` (a
/// `getpw*_r` or `getgr*_r`) and read by `read` while the strings it
/// points to are valid; None when there is none. The buffer for those
/// strings (a group's members too) grows while too small, up to
/// [`ID_LOOKUP_BUFFER_MAX`].
fn host_entry<E: HostEntry, T>(
    call: impl Fn(*mut E, *mut libc::c_char, usize, *mut *mut E) -> libc::c_int,
    read: impl FnOnce(&E) -> T,
) -> std::io::Result<Option<T>> {
    let mut size = 16 << 10;
    loop {
        let mut buffer = vec![0 as libc::c_char; size];
        // SAFETY: `E` is a `HostEntry`: all zeroes is a valid value.
        let mut entry: E = unsafe { std::mem::zeroed() };
        let mut found: *mut E = std::ptr::null_mut();
        match call(&mut entry, buffer.as_mut_ptr(), buffer.len(), &mut found) {
            0 if found.is_null() => return Ok(None),
            0 => return Ok(Some(read(&entry))),
            libc::ERANGE if size < ID_LOOKUP_BUFFER_MAX => size *= 2,
            error => return Err(std::io::Error::from_raw_os_error(error)),
        }
    }
}

/// Checks an assignment of `userquota@NAME`, `groupquota@NAME` or
/// `projectquota@ID`: the
/// property as stored (the numeric id) and its value (bytes, or `none`).
pub fn validate_id_quota(name: &str, value: &str) -> Result<Option<(String, String)>, PoolError> {
    let Some((kind, true, id)) = id_property(name) else {
        if id_property(name).is_some() {
            return Err(PoolError::InvalidArgument(format!("{name} is read-only")));
        }
        return Ok(None);
    };
    let id = resolve_id(kind, id)?;
    let value = crate::pool::dataset::quota::limit_value(name, value)?;
    Ok(Some((quota_name(kind, id), value)))
}

/// The user, group and project quotas `properties` set (ids without one, or
/// `none`, are not there).
pub fn id_quotas(properties: &BTreeMap<String, String>) -> FxHashMap<(IdKind, u32), u64> {
    properties
        .iter()
        .filter_map(|(name, value)| {
            let (kind, true, id) = id_property(name)? else {
                return None;
            };
            let bytes = value.parse::<u64>().ok().filter(|bytes| *bytes > 0)?;
            Some(((kind, id.parse().ok()?), bytes))
        })
        .collect()
}
