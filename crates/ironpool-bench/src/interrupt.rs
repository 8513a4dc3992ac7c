//! Ctrl-C: the first SIGINT asks the run to stop after tearing targets down
//! and writing a partial report; servers must never be left running.

use std::sync::atomic::{AtomicBool, Ordering};

/// Set by the SIGINT handler.
static REQUESTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_sigint(_signal: libc::c_int) {
    // Only an atomic store: async-signal-safe.
    REQUESTED.store(true, Ordering::SeqCst);
}

/// The SIGINT disposition to restore when the run ends.
pub struct Guard {
    previous: libc::sigaction,
}

/// Installs the SIGINT handler until the guard drops.
pub fn install() -> std::io::Result<Guard> {
    REQUESTED.store(false, Ordering::SeqCst);
    // SAFETY: sigaction structs are plain data; zeroed is a valid empty
    // mask and flags. The handler only stores to an atomic.
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = on_sigint as extern "C" fn(libc::c_int) as libc::sighandler_t;
        libc::sigemptyset(&mut action.sa_mask);
        let mut previous: libc::sigaction = std::mem::zeroed();
        if libc::sigaction(libc::SIGINT, &action, &mut previous) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Guard { previous })
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        // SAFETY: restores the disposition saved by install().
        unsafe {
            libc::sigaction(libc::SIGINT, &self.previous, std::ptr::null_mut());
        }
    }
}

/// True once SIGINT arrived.
pub fn requested() -> bool {
    REQUESTED.load(Ordering::SeqCst)
}
