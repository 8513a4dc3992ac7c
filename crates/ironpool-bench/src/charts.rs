//! PNG charts: IOPS and p99 latency against queue depth (a line per target
//! and job count), bandwidth bars per test (a panel per test, a bar per
//! target), and figures against fill level.
//!
//! Rendered in memory with plotters' bitmap backend and an embedded font
//! (DejaVu Sans, see fonts/LICENSE-DejaVu.txt), so nothing depends on the
//! system's fonts; encoded with the `png` crate.

use std::fs::File;
use std::io::BufWriter;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use anyhow::{anyhow, Context, Result};
use plotters::prelude::*;
use plotters::style::FontStyle;

use crate::results::{Results, TestResult};
use crate::suites::{Pattern, Suite};
use crate::units::{count_human, latency_human, rate_human, size_short};

/// The embedded font.
static FONT_BYTES: &[u8] = include_bytes!("../fonts/DejaVuSans.ttf");
/// The family name charts ask plotters for.
const FONT_FAMILY: &str = "sans-serif";
/// Line and bar colours, one per target in run order (the raw baseline
/// first, in dark grey); the palette is Tableau 10, easy to tell apart.
const PALETTE: [RGBColor; 8] = [
    RGBColor(80, 80, 80),
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
];
/// Line chart size in pixels.
const LINE_CHART_SIZE: (u32, u32) = (960, 600);
/// Size of one panel of a multi-panel chart.
const PANEL_SIZE: (u32, u32) = (420, 300);
/// Height of the legend strip above the panels.
const LEGEND_HEIGHT: u32 = 40;
/// Panels per row.
const PANELS_PER_ROW: usize = 3;

/// What a chart shows.
#[derive(Debug, Clone, PartialEq)]
enum ChartKind {
    /// A metric against queue depth for one qd-scaling workload.
    QueueDepth {
        pattern: Pattern,
        block_size_bytes: u64,
        p99: bool,
    },
    /// Bandwidth bars of one suite's tests.
    Bars { suite: Suite },
    /// Headline figures against fill level.
    Fill,
}

/// A chart the report links to.
#[derive(Debug, Clone, PartialEq)]
pub struct ChartPlan {
    /// File name in the output directory.
    pub file_name: String,
    /// Title, also the report's alt text.
    pub title: String,
    kind: ChartKind,
}

/// The charts a run's results call for, in report order.
pub fn plan(results: &Results) -> Vec<ChartPlan> {
    let tests = || {
        results
            .targets
            .iter()
            .flat_map(|t| t.tests.iter())
            .filter(|t| t.is_ok())
    };
    let mut charts = Vec::new();
    let mut workloads: Vec<(Pattern, u64)> = Vec::new();
    for test in tests().filter(|t| t.suite == Suite::QdScaling) {
        let key = (test.workload.pattern, test.workload.block_size_bytes);
        if !workloads.contains(&key) {
            workloads.push(key);
        }
    }
    for (pattern, block_size_bytes) in workloads {
        let name = format!(
            "{}-{}",
            pattern.fio_rw(),
            size_short(block_size_bytes).to_lowercase()
        );
        for p99 in [false, true] {
            let metric = if p99 { "p99" } else { "iops" };
            charts.push(ChartPlan {
                file_name: format!("qd-{name}-{metric}.png"),
                title: format!(
                    "{} {} vs queue depth: {}",
                    pattern.fio_rw(),
                    size_short(block_size_bytes),
                    if p99 { "p99 latency" } else { "IOPS" }
                ),
                kind: ChartKind::QueueDepth {
                    pattern,
                    block_size_bytes,
                    p99,
                },
            });
        }
    }
    for suite in [Suite::PoolReport, Suite::Durable, Suite::Send, Suite::Raidz] {
        if tests().any(|t| t.suite == suite) {
            charts.push(ChartPlan {
                file_name: format!("bandwidth-{}.png", suite.name()),
                title: format!("{}: bandwidth per test", suite.name()),
                kind: ChartKind::Bars { suite },
            });
        }
    }
    for suite in OWN_FIGURE_SUITES {
        if tests().any(|t| t.suite == suite) {
            charts.push(ChartPlan {
                file_name: format!("{}.png", suite.name()),
                title: format!(
                    "{}: each test's figure (IOPS, MiB/s, or operations per second)",
                    suite.name()
                ),
                kind: ChartKind::Bars { suite },
            });
        }
    }
    if tests().any(|t| t.fill_target_percent.is_some()) {
        charts.push(ChartPlan {
            file_name: "fill.png".to_string(),
            title: "fill: IOPS (random) and bandwidth (sequential) vs fill level".to_string(),
            kind: ChartKind::Fill,
        });
    }
    charts
}

/// Renders every planned chart into `dir`; returns the files written.
pub fn render_all(results: &Results, dir: &Path) -> Result<Vec<PathBuf>> {
    register_font()?;
    let mut written = Vec::new();
    for chart in plan(results) {
        let path = dir.join(&chart.file_name);
        let (width, height, pixels) = match &chart.kind {
            ChartKind::QueueDepth {
                pattern,
                block_size_bytes,
                p99,
            } => draw_queue_depth(results, &chart.title, *pattern, *block_size_bytes, *p99)?,
            ChartKind::Bars { suite } => draw_bars(results, *suite)?,
            ChartKind::Fill => draw_fill(results)?,
        };
        write_png(&path, width, height, &pixels)?;
        written.push(path);
    }
    Ok(written)
}

fn register_font() -> Result<()> {
    static REGISTERED: OnceLock<bool> = OnceLock::new();
    let ok = *REGISTERED.get_or_init(|| {
        plotters::style::register_font(FONT_FAMILY, FontStyle::Normal, FONT_BYTES).is_ok()
    });
    if ok {
        Ok(())
    } else {
        Err(anyhow!("the embedded chart font does not load"))
    }
}

fn plot_error<E: std::fmt::Display>(error: E) -> anyhow::Error {
    anyhow!("drawing a chart: {error}")
}

fn color_of(results: &Results, label: &str) -> RGBColor {
    let index = results
        .targets
        .iter()
        .position(|t| t.label == label)
        .unwrap_or(0);
    PALETTE[index % PALETTE.len()]
}

/// Queue depth on a log2 axis: QD 1, 4, 16, 64 sit at 0, 2, 4, 6.
fn log2_depth(iodepth: u32) -> f64 {
    f64::from(iodepth.max(1)).log2()
}

/// One line of a queue-depth chart.
struct Series {
    name: String,
    color: RGBColor,
    dashed: bool,
    points: Vec<(f64, f64)>,
}

fn draw_queue_depth(
    results: &Results,
    title: &str,
    pattern: Pattern,
    block_size_bytes: u64,
    p99: bool,
) -> Result<(u32, u32, Vec<u8>)> {
    let (width, height) = LINE_CHART_SIZE;
    let mut pixels = vec![255u8; (width * height * 3) as usize];
    let mut series: Vec<Series> = Vec::new();
    for target in &results.targets {
        let mut jobs: Vec<u32> = target.tests.iter().map(|t| t.workload.numjobs).collect();
        jobs.sort_unstable();
        jobs.dedup();
        for numjobs in jobs {
            let mut points: Vec<(f64, f64)> = target
                .tests
                .iter()
                .filter(|t| {
                    t.is_ok() && t.suite == Suite::QdScaling && t.workload.numjobs == numjobs
                })
                .filter(|t| {
                    t.workload.pattern == pattern && t.workload.block_size_bytes == block_size_bytes
                })
                .map(|t| {
                    (
                        log2_depth(t.workload.iodepth),
                        if p99 {
                            // Latency on a log10 axis of microseconds: the
                            // curves span two or three decades.
                            (t.p99_ns().unwrap_or(0) as f64 / 1e3).max(1.0).log10()
                        } else {
                            t.total_iops()
                        },
                    )
                })
                .collect();
            points.sort_by(|a, b| a.0.total_cmp(&b.0));
            if !points.is_empty() {
                let name = format!(
                    "{}, {} job{}",
                    target.label,
                    numjobs,
                    if numjobs == 1 { "" } else { "s" }
                );
                series.push(Series {
                    name,
                    color: color_of(results, &target.label),
                    dashed: numjobs > 1,
                    points,
                });
            }
        }
    }
    let x_max = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.0))
        .fold(0.0, f64::max);
    let values = || series.iter().flat_map(|s| s.points.iter().map(|p| p.1));
    let (y_min, y_max) = if p99 {
        let low = values().fold(f64::INFINITY, f64::min);
        let high = values().fold(0.0, f64::max);
        (
            low.min(high).floor().max(0.0),
            high.ceil().max(low.floor() + 1.0),
        )
    } else {
        (0.0, values().fold(0.0, f64::max).max(1.0) * 1.1)
    };
    {
        let root = BitMapBackend::with_buffer(&mut pixels, (width, height)).into_drawing_area();
        let mut chart = ChartBuilder::on(&root)
            .caption(title, (FONT_FAMILY, 24))
            .margin(16)
            .x_label_area_size(48)
            .y_label_area_size(90)
            .build_cartesian_2d(-0.3f64..x_max + 0.3, y_min..y_max)
            .map_err(plot_error)?;
        let x_formatter = |x: &f64| {
            if (x - x.round()).abs() < 1e-6 && *x >= 0.0 {
                format!("{}", 2f64.powf(x.round()) as u64)
            } else {
                String::new()
            }
        };
        let y_formatter = |y: &f64| {
            if p99 {
                latency_human(10f64.powf(*y) * 1e3)
            } else if *y == 0.0 {
                "0".to_string()
            } else {
                count_human(*y)
            }
        };
        chart
            .configure_mesh()
            .x_labels((x_max.round() as usize) + 1)
            .x_label_formatter(&x_formatter)
            .y_label_formatter(&y_formatter)
            .x_desc("queue depth (per job)")
            .y_desc(if p99 {
                "p99 latency (log scale)"
            } else {
                "IOPS"
            })
            .label_style((FONT_FAMILY, 15))
            .axis_desc_style((FONT_FAMILY, 17))
            .draw()
            .map_err(plot_error)?;
        for Series {
            name,
            color,
            dashed,
            points,
        } in &series
        {
            let style = color.stroke_width(3);
            if *dashed {
                chart
                    .draw_series(DashedLineSeries::new(points.clone(), 10, 6, style))
                    .map_err(plot_error)?
                    .label(name.as_str())
                    .legend(move |(x, y)| {
                        plotters::element::DashedPathElement::new(
                            vec![(x, y), (x + 24, y)],
                            6,
                            4,
                            style,
                        )
                    });
            } else {
                chart
                    .draw_series(LineSeries::new(points.clone(), style))
                    .map_err(plot_error)?
                    .label(name.as_str())
                    .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 24, y)], style));
            }
            chart
                .draw_series(points.iter().map(|p| Circle::new(*p, 4, color.filled())))
                .map_err(plot_error)?;
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .label_font((FONT_FAMILY, 15))
            .draw()
            .map_err(plot_error)?;
        root.present().map_err(plot_error)?;
    }
    Ok((width, height, pixels))
}

/// Test names of `tests` in first-seen order.
fn test_names<'a>(tests: impl Iterator<Item = &'a TestResult>) -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    for test in tests {
        if !names.contains(&test.name) {
            names.push(test.name.clone());
        }
    }
    names
}

/// Panel grid size for `count` panels plus the legend strip.
fn grid(count: usize) -> (usize, usize, u32, u32) {
    let columns = count.clamp(1, PANELS_PER_ROW);
    let rows = count.div_ceil(columns).max(1);
    (
        rows,
        columns,
        PANEL_SIZE.0 * columns as u32,
        PANEL_SIZE.1 * rows as u32 + LEGEND_HEIGHT,
    )
}

/// A strip naming each target's colour.
fn draw_legend<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    entries: &[(String, RGBColor)],
) -> Result<()> {
    let mut x = 12;
    for (label, color) in entries {
        area.draw(&Rectangle::new([(x, 12), (x + 18, 30)], color.filled()))
            .map_err(plot_error)?;
        // ab_glyph places text by its vertical middle: align it with the swatch.
        area.draw(&Text::new(label.clone(), (x + 24, 21), (FONT_FAMILY, 16)))
            .map_err(plot_error)?;
        x += 24 + 9 * label.chars().count() as i32 + 30;
    }
    Ok(())
}

/// The suites whose bars show each test's own figure (IOPS for random I/O,
/// MiB/s for sequential, operations per second for system calls) rather
/// than bandwidth: their tests mix the three.
const OWN_FIGURE_SUITES: [Suite; 9] = [
    Suite::Fs,
    Suite::Snapshot,
    Suite::Cache,
    Suite::Poll,
    Suite::Scheduler,
    Suite::Datasets,
    Suite::Soak,
    Suite::Grow,
    Suite::Stall,
];

/// A bar's height and unit: bandwidth for the pool report, the durable,
/// send and raidz suites; each test's own figure for [`OWN_FIGURE_SUITES`].
fn bar_value(suite: Suite, test: &TestResult) -> (f64, &'static str) {
    let mib = test.total_bandwidth() / (1024.0 * 1024.0);
    if !OWN_FIGURE_SUITES.contains(&suite) {
        return (mib, "MiB/s");
    }
    match test.ops_per_second {
        Some(rate) => (rate, "ops/s"),
        None if test.workload.pattern.is_sequential() => (mib, "MiB/s"),
        None => (test.total_iops(), "IOPS"),
    }
}

fn draw_bars(results: &Results, suite: Suite) -> Result<(u32, u32, Vec<u8>)> {
    let in_suite = |t: &&TestResult| t.is_ok() && t.suite == suite;
    let names = test_names(
        results
            .targets
            .iter()
            .flat_map(|t| t.tests.iter())
            .filter(in_suite),
    );
    let labels: Vec<String> = results
        .targets
        .iter()
        .filter(|t| t.tests.iter().any(|x| in_suite(&x)))
        .map(|t| t.label.clone())
        .collect();
    let (rows, columns, width, height) = grid(names.len());
    let mut pixels = vec![255u8; (width * height * 3) as usize];
    {
        let root = BitMapBackend::with_buffer(&mut pixels, (width, height)).into_drawing_area();
        let (legend_area, panels_area) = root.split_vertically(LEGEND_HEIGHT);
        let legend: Vec<(String, RGBColor)> = labels
            .iter()
            .map(|l| (l.clone(), color_of(results, l)))
            .collect();
        draw_legend(&legend_area, &legend)?;
        let panels = panels_area.split_evenly((rows, columns));
        for (name, panel) in names.iter().zip(panels.iter()) {
            let bars: Vec<(usize, f64, RGBColor)> = labels
                .iter()
                .enumerate()
                .filter_map(|(i, label)| {
                    let target = results.targets.iter().find(|t| &t.label == label)?;
                    let test = target
                        .tests
                        .iter()
                        .find(|t| in_suite(t) && &t.name == name)?;
                    Some((i, bar_value(suite, test).0, color_of(results, label)))
                })
                .collect();
            let unit = results
                .targets
                .iter()
                .flat_map(|t| t.tests.iter())
                .find(|t| in_suite(t) && &t.name == name)
                .map_or("MiB/s", |test| bar_value(suite, test).1);
            let y_max = bars.iter().map(|b| b.1).fold(0.0, f64::max).max(1.0) * 1.2;
            let mut chart = ChartBuilder::on(panel)
                .caption(name.as_str(), (FONT_FAMILY, 17))
                .margin(10)
                .x_label_area_size(8)
                .y_label_area_size(64)
                .build_cartesian_2d(-0.6f64..labels.len() as f64 - 0.4, 0f64..y_max)
                .map_err(plot_error)?;
            chart
                .configure_mesh()
                .disable_x_mesh()
                .x_labels(0)
                .y_labels(5)
                .y_label_formatter(&|y: &f64| format!("{y:.0}"))
                .y_desc(unit)
                .label_style((FONT_FAMILY, 13))
                .axis_desc_style((FONT_FAMILY, 14))
                .draw()
                .map_err(plot_error)?;
            for (i, mib, color) in &bars {
                let x = *i as f64;
                chart
                    .draw_series(std::iter::once(Rectangle::new(
                        [(x - 0.35, 0.0), (x + 0.35, *mib)],
                        color.filled(),
                    )))
                    .map_err(plot_error)?;
                let text = rate_human(mib * 1024.0 * 1024.0);
                chart
                    .draw_series(std::iter::once(Text::new(
                        text,
                        (x - 0.33, mib + y_max * 0.07),
                        (FONT_FAMILY, 12),
                    )))
                    .map_err(plot_error)?;
            }
        }
        root.present().map_err(plot_error)?;
    }
    Ok((width, height, pixels))
}

fn draw_fill(results: &Results) -> Result<(u32, u32, Vec<u8>)> {
    let filled = |t: &&TestResult| t.is_ok() && t.fill_target_percent.is_some();
    let names = test_names(
        results
            .targets
            .iter()
            .flat_map(|t| t.tests.iter())
            .filter(filled),
    );
    let labels: Vec<String> = results
        .targets
        .iter()
        .filter(|t| t.tests.iter().any(|x| filled(&x)))
        .map(|t| t.label.clone())
        .collect();
    let baseline = results.baseline().filter(|b| !labels.contains(&b.label));
    let mut legend: Vec<(String, RGBColor)> = labels
        .iter()
        .map(|l| (l.clone(), color_of(results, l)))
        .collect();
    legend.extend(baseline.map(|b| {
        (
            format!("{} (no fill level)", b.label),
            color_of(results, &b.label),
        )
    }));
    let (rows, columns, width, height) = grid(names.len());
    let mut pixels = vec![255u8; (width * height * 3) as usize];
    {
        let root = BitMapBackend::with_buffer(&mut pixels, (width, height)).into_drawing_area();
        let (legend_area, panels_area) = root.split_vertically(LEGEND_HEIGHT);
        draw_legend(&legend_area, &legend)?;
        let panels = panels_area.split_evenly((rows, columns));
        for (name, panel) in names.iter().zip(panels.iter()) {
            let mut lines: Vec<(RGBColor, Vec<(f64, f64)>)> = Vec::new();
            // The raw baseline has no fill level: a flat reference line.
            let reference = baseline.and_then(|b| {
                let t = b.tests.iter().find(|t| t.is_ok() && &t.name == name)?;
                let value = if t.workload.pattern.is_sequential() {
                    t.total_bandwidth() / (1024.0 * 1024.0)
                } else {
                    t.total_iops()
                };
                Some((color_of(results, &b.label), value))
            });
            let mut sequential = false;
            for label in &labels {
                let Some(target) = results.targets.iter().find(|t| &t.label == label) else {
                    continue;
                };
                let mut points: Vec<(f64, f64)> = target
                    .tests
                    .iter()
                    .filter(|t| filled(t) && &t.name == name)
                    .map(|t| {
                        sequential = t.workload.pattern.is_sequential();
                        let level = t
                            .fill_measured_percent
                            .unwrap_or(f64::from(t.fill_target_percent.unwrap_or(0)));
                        let value = if sequential {
                            t.total_bandwidth() / (1024.0 * 1024.0)
                        } else {
                            t.total_iops()
                        };
                        (level, value)
                    })
                    .collect();
                points.sort_by(|a, b| a.0.total_cmp(&b.0));
                lines.push((color_of(results, label), points));
            }
            let y_max = lines
                .iter()
                .flat_map(|l| l.1.iter().map(|p| p.1))
                .chain(reference.map(|r| r.1))
                .fold(0.0, f64::max)
                .max(1.0)
                * 1.15;
            let mut chart = ChartBuilder::on(panel)
                .caption(name.as_str(), (FONT_FAMILY, 17))
                .margin(10)
                .x_label_area_size(36)
                .y_label_area_size(64)
                .build_cartesian_2d(0f64..100f64, 0f64..y_max)
                .map_err(plot_error)?;
            let y_formatter = |y: &f64| {
                if sequential {
                    format!("{y:.0}")
                } else {
                    count_human(*y)
                }
            };
            let x_formatter = |x: &f64| format!("{x:.0}");
            chart
                .configure_mesh()
                .x_labels(6)
                .x_label_formatter(&x_formatter)
                .y_labels(5)
                .y_label_formatter(&y_formatter)
                .x_desc("fill %")
                .y_desc(if sequential { "MiB/s" } else { "IOPS" })
                .label_style((FONT_FAMILY, 13))
                .axis_desc_style((FONT_FAMILY, 14))
                .draw()
                .map_err(plot_error)?;
            if let Some((color, value)) = reference {
                let style = color.stroke_width(2);
                chart
                    .draw_series(DashedLineSeries::new(
                        vec![(0.0, value), (100.0, value)],
                        8,
                        6,
                        style,
                    ))
                    .map_err(plot_error)?;
            }
            for (color, points) in lines {
                chart
                    .draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))
                    .map_err(plot_error)?;
                chart
                    .draw_series(points.iter().map(|p| Circle::new(*p, 3, color.filled())))
                    .map_err(plot_error)?;
            }
        }
        root.present().map_err(plot_error)?;
    }
    Ok((width, height, pixels))
}

fn write_png(path: &Path, width: u32, height: u32, rgb: &[u8]) -> Result<()> {
    let file = File::create(path).with_context(|| format!("creating {}", path.display()))?;
    let mut encoder = png::Encoder::new(BufWriter::new(file), width, height);
    encoder.set_color(png::ColorType::Rgb);
    encoder.set_depth(png::BitDepth::Eight);
    let mut writer = encoder
        .write_header()
        .with_context(|| format!("writing {}", path.display()))?;
    writer
        .write_image_data(rgb)
        .with_context(|| format!("writing {}", path.display()))?;
    writer
        .finish()
        .with_context(|| format!("finishing {}", path.display()))
}
