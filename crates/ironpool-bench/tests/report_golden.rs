//! Report generation from a recorded results.json, compared with a golden
//! report.md. The recording (tests/data/results.json) is a real run of
//! raw, nbdkit, a `dir:` target on a 1 GiB loop-mounted ext4 and the
//! stand-in ironpool of tests/data/fake-ironpool.sh, 1 s per test.
//!
//! After an intended change to the report, regenerate the golden file:
//! `UPDATE_GOLDEN=1 cargo test -p ironpool-bench --test report_golden`.

use std::path::{Path, PathBuf};

use ironpool_bench::results::Results;
use ironpool_bench::{analysis, charts, report};

fn data(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name)
}

fn fixture() -> Results {
    Results::load(&data("results.json")).expect("the recorded results.json loads")
}

fn updating() -> bool {
    std::env::var_os("UPDATE_GOLDEN").is_some()
}

#[test]
fn report_matches_golden() {
    let mut results = fixture();
    let rendered = report::render(&results);
    let golden_path = data("report.golden.md");
    if updating() {
        std::fs::write(&golden_path, &rendered).unwrap();
        results.findings = analysis::findings(&results);
        results.save(&data("results.json")).unwrap();
    }
    let golden = std::fs::read_to_string(&golden_path).expect("tests/data/report.golden.md exists");
    if rendered != golden {
        let (line, (want, got)) = golden
            .lines()
            .zip(rendered.lines())
            .enumerate()
            .find(|(_, (want, got))| want != got)
            .unwrap_or((
                golden.lines().count().min(rendered.lines().count()),
                ("(end)", "(end)"),
            ));
        panic!(
            "report.md differs from the golden file at line {}:\n  golden:   {want}\n  rendered: {got}\n\
             (UPDATE_GOLDEN=1 regenerates it after an intended change)",
            line + 1
        );
    }
}

#[test]
fn stored_findings_are_computed_from_the_figures() {
    let results = fixture();
    assert_eq!(results.findings, analysis::findings(&results));
    assert!(results.findings.iter().any(|f| f.check == "qd-scaling"));
    assert!(results.findings.iter().any(|f| f.check == "flush-batching"));
    assert!(results.findings.iter().any(|f| f.check == "fill-cliff"));
    assert!(results
        .findings
        .iter()
        .any(|f| f.check == "device-aggregation"));
}

#[test]
fn results_survive_a_round_trip() {
    let results = fixture();
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("golden-roundtrip-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("results.json");
    results.save(&path).unwrap();
    assert_eq!(Results::load(&path).unwrap(), results);
}

#[test]
fn charts_render_from_the_recording() {
    let results = fixture();
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("golden-charts-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let written = charts::render_all(&results, &dir).unwrap();
    let names: Vec<String> = written
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        names,
        [
            "qd-randwrite-16k-iops.png",
            "qd-randwrite-16k-p99.png",
            "qd-randread-4k-iops.png",
            "qd-randread-4k-p99.png",
            "bandwidth-pool-report.png",
            "bandwidth-durable.png",
            "fill.png"
        ]
    );
    for path in written {
        let bytes = std::fs::read(&path).unwrap();
        assert!(
            bytes.starts_with(b"\x89PNG\r\n\x1a\n") && bytes.len() > 10_000,
            "{}",
            path.display()
        );
    }
}
