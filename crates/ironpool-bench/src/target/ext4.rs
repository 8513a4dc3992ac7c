//! The `ext4` target: a kernel filesystem on this disk, the limit a
//! filesystem's own tests (metadata, names, buffered writes) are held to.
//! The tool makes an image in `--out` (written out with `--write-out`, as
//! ironpool's disks are), attaches it to a loop device with direct I/O on
//! (so the host's page cache is not a second cache under ext4's), makes
//! ext4 on it and mounts it; fio runs on a file in it. Needs root.
//!
//! ```text
//! losetup --find --show --direct-io=on OUT/ext4/ext4.img
//! mkfs.ext4 -q -F /dev/loopN
//! mount /dev/loopN OUT/ext4/mnt
//! ```

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};

use super::process::run_command;
use super::{describe_mount, files, Access, FillMethod, Instance, SetupContext};
use crate::units::{bytes_human, MIB};

/// Room beside the working set in the image: the metadata and names tests'
/// files, ext4's journal and inode tables, and free space a filesystem
/// needs to write into (a full filesystem measures its allocator, not its
/// speed).
const EXT4_HEADROOM_BYTES: u64 = 512 * MIB;
/// How long losetup, mkfs.ext4, mount and umount may take: they touch a
/// few megabytes.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(120);
/// The file fio uses in the filesystem.
const EXT4_FILE: &str = "ironpool-bench.dat";

/// A mounted loop device the target owns, undone at teardown.
#[derive(Debug)]
pub struct LoopMount {
    /// The loop device, `/dev/loopN`.
    pub device: String,
    /// Where it is mounted.
    pub mount_point: PathBuf,
}

impl LoopMount {
    /// Unmounts and detaches; every step is tried, and the errors joined.
    pub fn undo(&self) -> Result<()> {
        let mut errors = Vec::new();
        let mounted = files::mount_of(&self.mount_point)?
            .is_some_and(|m| Path::new(&m.mount_point) == self.mount_point);
        if mounted {
            let umount = vec!["umount".to_string(), self.mount_point.display().to_string()];
            if let Err(error) = run_command(&umount, COMMAND_TIMEOUT) {
                errors.push(format!("{error:#}"));
            }
        }
        let detach = vec!["losetup".to_string(), "-d".to_string(), self.device.clone()];
        if let Err(error) = run_command(&detach, COMMAND_TIMEOUT) {
            errors.push(format!("{error:#}"));
        }
        if errors.is_empty() {
            Ok(())
        } else {
            anyhow::bail!("{}", errors.join("; "))
        }
    }
}

/// Sets the target up in `OUT/SLUG`.
pub fn setup(label: &str, slug: &str, context: &SetupContext<'_>) -> Result<Instance> {
    let dir = context.out_dir.join(slug);
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let image = dir.join("ext4.img");
    let image_bytes = context.size_bytes * 2 + EXT4_HEADROOM_BYTES;
    files::create_sparse(&image, image_bytes)?;
    let mut instance = Instance::new(
        label.to_string(),
        "ext4",
        Access::File(PathBuf::new()),
        context.size_bytes,
    );
    instance.owned_files.push(image.clone());
    if context.write_out_disks {
        super::ironpool::write_out(&image, image_bytes)?;
    }
    let host = describe_mount(files::mount_of(&image)?.as_ref());
    let attach = vec![
        "losetup".to_string(),
        "--find".to_string(),
        "--show".to_string(),
        "--direct-io=on".to_string(),
        image.display().to_string(),
    ];
    let device = run_command(&attach, COMMAND_TIMEOUT)
        .context("attaching a loop device (the ext4 target needs root)")?
        .trim()
        .to_string();
    instance.setup_commands.push(attach);
    let mount_point = dir.join("mnt");
    // From here teardown undoes the loop device, whatever fails next.
    instance.loop_mount = Some(LoopMount {
        device: device.clone(),
        mount_point: mount_point.clone(),
    });
    let made = make_and_mount(&mut instance, &device, &mount_point);
    if let Err(error) = made {
        let _ = instance.teardown(false);
        return Err(error);
    }
    let file = mount_point.join(EXT4_FILE);
    files::create_sparse(&file, context.size_bytes)?;
    instance.access = Access::File(file.clone());
    let mount = files::mount_of(&file)?;
    instance
        .setup_findings
        .extend(crate::pitfalls::loop_device_buffered(
            label,
            &device,
            files::loop_direct_io(&device),
        ));
    instance.filesystem = mount;
    instance.record_size_bytes = Some(files::preferred_block_size(&file)?);
    instance.fill = FillMethod::Filesystem(mount_point);
    instance.description = format!(
        "file {} on ext4 on {device} (direct I/O on) over a {} image on {host}{}; io_uring, direct=1",
        file.display(),
        bytes_human(image_bytes as f64),
        if context.write_out_disks {
            ", written out with zeros first"
        } else {
            ""
        }
    );
    Ok(instance)
}

fn make_and_mount(instance: &mut Instance, device: &str, mount_point: &Path) -> Result<()> {
    let mkfs = vec![
        "mkfs.ext4".to_string(),
        "-q".to_string(),
        "-F".to_string(),
        device.to_string(),
    ];
    run_command(&mkfs, COMMAND_TIMEOUT).context("mkfs.ext4 (apt-get install e2fsprogs)")?;
    instance.setup_commands.push(mkfs);
    std::fs::create_dir_all(mount_point)
        .with_context(|| format!("creating {}", mount_point.display()))?;
    let mount = vec![
        "mount".to_string(),
        device.to_string(),
        mount_point.display().to_string(),
    ];
    run_command(&mount, COMMAND_TIMEOUT)?;
    instance.setup_commands.push(mount);
    Ok(())
}
