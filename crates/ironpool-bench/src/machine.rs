//! The machine description recorded with every run: figures belong to a
//! machine, and BENCHMARKS.md says to compare only within one.

use crate::results::Machine;

/// Describes this machine; `fio_version` comes from the caller, who ran fio.
pub fn describe(fio_version: String) -> Machine {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let os_release = std::fs::read_to_string("/etc/os-release").unwrap_or_default();
    Machine {
        kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .unwrap_or_default()
            .trim()
            .to_string(),
        os: os_pretty_name(&os_release).unwrap_or_default(),
        cpu_model: cpu_model(&cpuinfo).unwrap_or_else(|| "unknown".to_string()),
        cpu_count: std::thread::available_parallelism()
            .map(|n| n.get() as u32)
            .unwrap_or(1),
        memory_bytes: memory_bytes(&meminfo).unwrap_or(0),
        page_size_bytes: page_size_bytes(),
        fio_version,
        nbdkit_version: None,
        ironpool_version: None,
    }
}

/// The page size of this machine.
pub fn page_size_bytes() -> u64 {
    // SAFETY: sysconf has no preconditions.
    u64::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096)
}

/// The first `model name` of /proc/cpuinfo.
pub fn cpu_model(cpuinfo: &str) -> Option<String> {
    cpuinfo
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split_once(':'))
        .map(|(_, v)| v.trim().to_string())
}

/// MemTotal of /proc/meminfo, in bytes.
pub fn memory_bytes(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// PRETTY_NAME of /etc/os-release.
pub fn os_pretty_name(os_release: &str) -> Option<String> {
    let line = os_release.lines().find(|l| l.starts_with("PRETTY_NAME="))?;
    Some(line["PRETTY_NAME=".len()..].trim_matches('"').to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_proc_files() {
        assert_eq!(
            cpu_model("processor\t: 0\nmodel name\t: AMD EPYC 7B13\n").as_deref(),
            Some("AMD EPYC 7B13")
        );
        assert_eq!(
            memory_bytes("MemTotal:       24576000 kB\n"),
            Some(24_576_000 * 1024)
        );
        assert_eq!(
            os_pretty_name("NAME=x\nPRETTY_NAME=\"Debian GNU/Linux 12 (bookworm)\"\n").as_deref(),
            Some("Debian GNU/Linux 12 (bookworm)")
        );
    }
}
