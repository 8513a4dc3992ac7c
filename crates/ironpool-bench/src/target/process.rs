//! Child processes: servers we start (nbdkit, `ironpool serve`) and one-shot
//! commands (`ironpool create`, `nbdinfo`), all with time limits.
//!
//! A server runs in its own session, so a Ctrl-C on the terminal reaches
//! fio and us but not the server: we stop it ourselves, by PID, with SIGTERM
//! (ironpool then exports the pool cleanly), and reap it.

use std::fs::File;
use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

/// How often waits look at a child or a file again: short enough that a
/// server that is ready costs no noticeable delay.
const POLL_INTERVAL: Duration = Duration::from_millis(50);

/// How long a server may take to exit after SIGTERM before it is killed:
/// ironpool syncs and exports the pool on SIGTERM, which takes a txg sync.
pub const SERVER_STOP_TIMEOUT: Duration = Duration::from_secs(60);

/// Lines of a server's log quoted in an error.
const LOG_TAIL_LINES: usize = 20;

/// A server process we started, stopped by PID when dropped at the latest.
#[derive(Debug)]
pub struct ServerProcess {
    name: String,
    child: Option<Child>,
    pid: u32,
    log_path: PathBuf,
}

impl ServerProcess {
    /// Starts `command` in a new session with stdin closed and stdout and
    /// stderr appended to `log_path`.
    pub fn spawn(name: &str, command: &mut Command, log_path: &Path) -> Result<ServerProcess> {
        let log = File::create(log_path)
            .with_context(|| format!("creating server log {}", log_path.display()))?;
        let log_err = log
            .try_clone()
            .context("duplicating the server log handle")?;
        command.stdin(Stdio::null()).stdout(log).stderr(log_err);
        // SAFETY: setsid() is async-signal-safe and touches no memory of the
        // parent; it runs in the forked child before exec.
        unsafe {
            command.pre_exec(|| {
                if libc::setsid() < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = command
            .spawn()
            .with_context(|| format!("starting {name} ({})", display_command(command)))?;
        Ok(ServerProcess {
            name: name.to_string(),
            pid: child.id(),
            child: Some(child),
            log_path: log_path.to_path_buf(),
        })
    }

    /// The server's PID.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Waits until every path in `ready_paths` exists (sockets, pidfile),
    /// failing early with the server's log if it exits.
    pub fn wait_ready(&mut self, ready_paths: &[&Path], timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            if ready_paths.iter().all(|p| p.exists()) {
                return Ok(());
            }
            if let Some(child) = self.child.as_mut() {
                if let Some(status) = child.try_wait().context("checking the server")? {
                    self.child = None;
                    bail!(
                        "{} exited ({status}) before it was ready; {}",
                        self.name,
                        self.log_tail()
                    );
                }
            }
            if Instant::now() >= deadline {
                let missing: Vec<String> = ready_paths
                    .iter()
                    .filter(|p| !p.exists())
                    .map(|p| p.display().to_string())
                    .collect();
                bail!(
                    "{} was not ready after {} s (still missing: {}); {}",
                    self.name,
                    timeout.as_secs(),
                    missing.join(", "),
                    self.log_tail()
                );
            }
            std::thread::sleep(POLL_INTERVAL);
        }
    }

    /// utime + stime of the server so far, in seconds.
    pub fn cpu_seconds(&self) -> Result<f64> {
        let path = format!("/proc/{}/stat", self.pid);
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {path} ({} CPU time)", self.name))?;
        let ticks = cpu_ticks_from_stat(&text).with_context(|| format!("parsing {path}"))?;
        Ok(ticks as f64 / clock_ticks_per_second())
    }

    /// Sends SIGTERM and waits for the exit; kills it after `timeout`.
    pub fn stop(&mut self, timeout: Duration) -> Result<()> {
        let Some(mut child) = self.child.take() else {
            return Ok(());
        };
        if child.try_wait().context("checking the server")?.is_some() {
            return Ok(());
        }
        let pid = libc::pid_t::try_from(self.pid).context("server PID out of range")?;
        // SAFETY: plain syscall; the PID is our own unreaped child, so it
        // cannot have been reused by another process.
        unsafe { libc::kill(pid, libc::SIGTERM) };
        let status = wait_with_deadline(&mut child, timeout)?;
        match status {
            Some(status) if status.success() || status.signal_is(libc::SIGTERM) => Ok(()),
            Some(status) => bail!(
                "{} exited with {status} after SIGTERM; {}",
                self.name,
                self.log_tail()
            ),
            None => {
                child.kill().context("killing the server")?;
                child.wait().context("reaping the server")?;
                bail!(
                    "{} did not exit within {} s of SIGTERM and was killed",
                    self.name,
                    timeout.as_secs()
                )
            }
        }
    }

    /// The last lines of the server's log, for error messages.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log_path).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        let tail = lines[lines.len().saturating_sub(LOG_TAIL_LINES)..].join("\n");
        if tail.trim().is_empty() {
            format!("its log {} is empty", self.log_path.display())
        } else {
            format!("end of its log {}:\n{tail}", self.log_path.display())
        }
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        if self.child.is_some() {
            // Best effort on an error path: never leave a server running.
            let _ = self.stop(SERVER_STOP_TIMEOUT);
        }
    }
}

/// Exit-by-signal test for `ExitStatus`.
trait SignalIs {
    fn signal_is(&self, signal: i32) -> bool;
}

impl SignalIs for ExitStatus {
    fn signal_is(&self, signal: i32) -> bool {
        use std::os::unix::process::ExitStatusExt;
        self.signal() == Some(signal)
    }
}

/// Waits for a child until `timeout`; `None` if it is still running.
pub fn wait_with_deadline(child: &mut Child, timeout: Duration) -> Result<Option<ExitStatus>> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(status) = child.try_wait().context("waiting for a child process")? {
            return Ok(Some(status));
        }
        if Instant::now() >= deadline {
            return Ok(None);
        }
        std::thread::sleep(POLL_INTERVAL);
    }
}

/// Runs a command to completion within `timeout` and returns its stdout;
/// fails with its stderr when it exits non-zero.
pub fn run_command(argv: &[String], timeout: Duration) -> Result<String> {
    run_command_with_env(argv, &[], timeout)
}

/// [`run_command`] with extra environment variables.
pub fn run_command_with_env(
    argv: &[String],
    env: &[(&str, &Path)],
    timeout: Duration,
) -> Result<String> {
    let (program, args) = argv.split_first().context("empty command")?;
    let shown = argv.join(" ");
    let mut child = Command::new(program)
        .args(args)
        .envs(env.iter().map(|(key, value)| (*key, *value)))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting `{shown}`"))?;
    let stdout = child.stdout.take().context("child stdout")?;
    let stderr = child.stderr.take().context("child stderr")?;
    let out_reader = std::thread::spawn(move || read_all(stdout));
    let err_reader = std::thread::spawn(move || read_all(stderr));
    let status = wait_with_deadline(&mut child, timeout)?;
    let Some(status) = status else {
        child
            .kill()
            .context("killing a command past its time limit")?;
        child.wait().context("reaping a killed command")?;
        bail!(
            "`{shown}` did not finish within {} s and was killed",
            timeout.as_secs()
        );
    };
    let stdout = out_reader.join().unwrap_or_default();
    let stderr = err_reader.join().unwrap_or_default();
    if !status.success() {
        bail!("`{shown}` failed ({status}): {}", stderr.trim());
    }
    Ok(stdout)
}

fn read_all(mut source: impl Read) -> String {
    let mut bytes = Vec::new();
    let _ = source.read_to_end(&mut bytes);
    String::from_utf8_lossy(&bytes).into_owned()
}

/// utime + stime (fields 14 and 15) of a /proc/PID/stat line, in clock
/// ticks. The command name (field 2) is in parentheses and may contain
/// spaces and parentheses, so fields are counted after the last `)`.
pub fn cpu_ticks_from_stat(text: &str) -> Result<u64> {
    let after_name = text
        .rfind(')')
        .map(|i| &text[i + 1..])
        .context("no `)` after the command name")?;
    // After the name: field 3 (state) is index 0, so utime (14) is index 11.
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    let field = |index: usize| -> Result<u64> {
        fields
            .get(index)
            .context("line too short")?
            .parse::<u64>()
            .context("not a number")
    };
    Ok(field(11)? + field(12)?)
}

/// The kernel's USER_HZ, for /proc tick counts.
pub fn clock_ticks_per_second() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if ticks > 0 {
        ticks as f64
    } else {
        100.0
    }
}

/// A command as a shell-like line, for messages and results.json.
pub fn display_command(command: &Command) -> String {
    command_argv(command).join(" ")
}

/// A command's program and arguments.
pub fn command_argv(command: &Command) -> Vec<String> {
    std::iter::once(command.get_program())
        .chain(command.get_args())
        .map(|s| s.to_string_lossy().into_owned())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_proc_stat() {
        let line =
            "6872 (nbd kit (x)) S 1 6868 5648 0 -1 4194304 449 0 11 0 6 90 0 0 20 0 1 0 102775";
        assert_eq!(cpu_ticks_from_stat(line).unwrap(), 96);
        assert!(cpu_ticks_from_stat("12 (short) S 1").is_err());
    }

    #[test]
    fn runs_commands_with_limits() {
        let echo = vec!["sh".to_string(), "-c".to_string(), "echo hi".to_string()];
        assert_eq!(run_command(&echo, Duration::from_secs(10)).unwrap(), "hi\n");
        let failing = vec![
            "sh".to_string(),
            "-c".to_string(),
            "echo bad >&2; exit 3".to_string(),
        ];
        let error = run_command(&failing, Duration::from_secs(10))
            .unwrap_err()
            .to_string();
        assert!(error.contains("bad"), "{error}");
        let slow = vec!["sleep".to_string(), "5".to_string()];
        assert!(run_command(&slow, Duration::from_millis(200)).is_err());
    }
}
