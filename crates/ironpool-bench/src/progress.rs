//! What the operator sees while a run goes: on a terminal, one status line
//! (step, current test, elapsed, ETA) redrawn in place above which finished
//! tests scroll; otherwise plain log lines.

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

use crate::units::duration_human;

/// Status line redraws at most this often: smooth enough, cheap enough.
const REDRAW_INTERVAL: Duration = Duration::from_millis(250);

/// The ETA's overhead factor (actual time over planned time so far) is
/// clamped to this range, so one slow prefill does not make it absurd.
const OVERHEAD_FACTOR_MAX: f64 = 3.0;

/// The progress display.
#[derive(Debug)]
pub struct Progress {
    terminal: bool,
    started: Instant,
    planned_total_seconds: f64,
    planned_done_seconds: f64,
    steps_total: usize,
    steps_done: usize,
    current: Option<(String, Instant, f64)>,
    last_draw: Option<Instant>,
}

impl Progress {
    /// A display for `steps_total` steps planned to take `planned_total_seconds`.
    pub fn new(steps_total: usize, planned_total_seconds: f64) -> Progress {
        Progress {
            terminal: std::io::stderr().is_terminal(),
            started: Instant::now(),
            planned_total_seconds,
            planned_done_seconds: 0.0,
            steps_total,
            steps_done: 0,
            current: None,
            last_draw: None,
        }
    }

    /// Prints a line (above the status line on a terminal).
    pub fn log(&mut self, message: &str) {
        let mut stderr = std::io::stderr().lock();
        if self.terminal {
            let _ = write!(stderr, "\r\x1b[2K");
        }
        let _ = writeln!(stderr, "ironpool-bench: {message}");
        drop(stderr);
        self.last_draw = None;
        self.tick();
    }

    /// Starts a step (a test) planned to take `planned_seconds`.
    pub fn begin(&mut self, label: &str, planned_seconds: f64) {
        self.current = Some((label.to_string(), Instant::now(), planned_seconds));
        if !self.terminal {
            let message = format!("[{}/{}] {label}", self.steps_done + 1, self.steps_total);
            self.log(&message);
        }
        self.last_draw = None;
        self.tick();
    }

    /// Ends the current step with a one-line result.
    pub fn end(&mut self, result: &str) {
        if let Some((label, _, planned)) = self.current.take() {
            self.steps_done += 1;
            self.planned_done_seconds += planned;
            let message = format!(
                "[{}/{}] {label}: {result}",
                self.steps_done, self.steps_total
            );
            self.log(&message);
        }
    }

    /// Adds an unplanned step (a filler write) planned to take `planned_seconds`.
    pub fn add_step(&mut self, planned_seconds: f64) {
        self.steps_total += 1;
        self.planned_total_seconds += planned_seconds;
    }

    /// Removes a step that will not run from the plan.
    pub fn skip(&mut self, planned_seconds: f64) {
        self.steps_total = self.steps_total.saturating_sub(1);
        self.planned_total_seconds = (self.planned_total_seconds - planned_seconds).max(0.0);
    }

    /// Redraws the status line if due (terminal only).
    pub fn tick(&mut self) {
        if !self.terminal
            || self
                .last_draw
                .is_some_and(|t| t.elapsed() < REDRAW_INTERVAL)
        {
            return;
        }
        self.last_draw = Some(Instant::now());
        let Some((label, step_started, planned)) = &self.current else {
            return;
        };
        let elapsed = self.started.elapsed().as_secs_f64();
        let in_step = step_started.elapsed().as_secs_f64();
        let remaining =
            (self.planned_total_seconds - self.planned_done_seconds - in_step.min(*planned))
                .max(0.0);
        let line = format!(
            "[{}/{}] {label}  {} into test · {} elapsed · ETA {}",
            self.steps_done + 1,
            self.steps_total,
            duration_human(in_step),
            duration_human(elapsed),
            duration_human(remaining * self.overhead_factor())
        );
        let mut stderr = std::io::stderr().lock();
        let _ = write!(stderr, "\r\x1b[2K{line}");
        let _ = stderr.flush();
    }

    /// Clears the status line at the end.
    pub fn finish(&mut self) {
        if self.terminal {
            let _ = write!(std::io::stderr(), "\r\x1b[2K");
        }
    }

    /// Seconds taken per planned second so far (setup, prefill, fio start).
    fn overhead_factor(&self) -> f64 {
        if self.planned_done_seconds < 1.0 {
            return 1.0;
        }
        (self.started.elapsed().as_secs_f64() / self.planned_done_seconds)
            .clamp(1.0, OVERHEAD_FACTOR_MAX)
    }
}
