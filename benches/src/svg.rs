//! Plots of benchmark results as SVG: a line chart (latency against batch
//! number) and a grouped bar chart (throughput, memory), on a linear or a
//! logarithmic axis. SVG text needs no font to lay out, so the plots are
//! written as plain SVG, the same bytes on every machine.

use std::fmt::Write;

const WIDTH: f64 = 820.0;
const HEIGHT: f64 = 440.0;
const LEFT: f64 = 80.0;
const RIGHT: f64 = 20.0;
const TOP: f64 = 60.0;
const BOTTOM: f64 = 60.0;

/// Colours of the series, in order: weir first.
pub const COLOURS: [&str; 4] = ["#1b6ac9", "#d9541e", "#2e9e44", "#8a4fbf"];

/// A y axis: its range and whether it is logarithmic.
#[derive(Debug, Clone, Copy)]
pub struct Axis {
    min: f64,
    max: f64,
    log: bool,
}

impl Axis {
    /// An axis that holds `values`: from zero, or (`log`) from the decade
    /// below the least.
    pub fn fitting(values: impl IntoIterator<Item = f64>, log: bool) -> Axis {
        let finite: Vec<f64> = values.into_iter().filter(|v| v.is_finite() && *v > 0.0).collect();
        let hi = finite.iter().copied().fold(1e-9, f64::max);
        let lo = finite.iter().copied().fold(f64::INFINITY, f64::min);
        if log {
            let lo = if lo.is_finite() { lo } else { 1.0 };
            Axis {
                min: 10f64.powf(lo.log10().floor()),
                max: 10f64.powf(hi.log10().ceil()),
                log,
            }
        } else {
            let step = nice_step(hi / 5.0);
            Axis {
                min: 0.0,
                max: (hi / step).ceil() * step,
                log,
            }
        }
    }

    /// Where `v` goes, from 0 (bottom) to 1 (top).
    fn at(&self, v: f64) -> f64 {
        let v = v.clamp(self.min, self.max);
        if self.log {
            (v.log10() - self.min.log10()) / (self.max.log10() - self.min.log10())
        } else {
            (v - self.min) / (self.max - self.min)
        }
    }

    fn ticks(&self) -> Vec<f64> {
        if self.log {
            let (a, b) = (self.min.log10().round() as i32, self.max.log10().round() as i32);
            (a..=b).map(|e| 10f64.powi(e)).collect()
        } else {
            let step = nice_step(self.max / 5.0);
            (0..=((self.max / step).round() as usize))
                .map(|i| i as f64 * step)
                .collect()
        }
    }
}

/// 1, 2 or 5 times a power of ten, at least `raw`.
fn nice_step(raw: f64) -> f64 {
    let raw = raw.max(1e-9);
    let p = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|m| m * p)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * p)
}

/// A number as a tick label: 0.5, 3, 1,200, 2.5M.
pub fn short(v: f64) -> String {
    match v.abs() {
        a if a >= 1e6 => format!("{}M", trim(v / 1e6)),
        a if a >= 1e4 => format!("{}k", trim(v / 1e3)),
        _ => trim(v),
    }
}

/// Three significant digits at most, no trailing zeros.
fn trim(v: f64) -> String {
    let decimals = match v.abs() {
        a if a >= 100.0 => 0,
        a if a >= 10.0 => 1,
        _ => 2,
    };
    let s = format!("{v:.decimals$}");
    match s.contains('.') {
        true => s.trim_end_matches('0').trim_end_matches('.').to_string(),
        false => s,
    }
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

/// The frame: title, y axis with its grid and label, x label.
fn frame(out: &mut String, title: &str, x_label: &str, y_label: &str, y: Axis) {
    let plot_h = HEIGHT - TOP - BOTTOM;
    let _ = write!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="12">
<rect width="100%" height="100%" fill="white"/>
<text x="{}" y="24" text-anchor="middle" font-size="15">{}</text>
"#,
        WIDTH / 2.0,
        escape(title)
    );
    for t in y.ticks() {
        let py = TOP + plot_h * (1.0 - y.at(t));
        let _ = writeln!(
            out,
            r##"<line x1="{LEFT}" y1="{py:.1}" x2="{:.1}" y2="{py:.1}" stroke="#ddd"/><text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"##,
            WIDTH - RIGHT,
            LEFT - 6.0,
            py + 4.0,
            short(t)
        );
    }
    let _ = writeln!(
        out,
        r#"<line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{:.1}" stroke="black"/><line x1="{LEFT}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="black"/>"#,
        HEIGHT - BOTTOM,
        HEIGHT - BOTTOM,
        WIDTH - RIGHT,
        HEIGHT - BOTTOM
    );
    let _ = writeln!(
        out,
        r#"<text x="18" y="{:.1}" text-anchor="middle" transform="rotate(-90 18 {:.1})">{}</text><text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
        TOP + plot_h / 2.0,
        TOP + plot_h / 2.0,
        escape(y_label),
        LEFT + (WIDTH - LEFT - RIGHT) / 2.0,
        HEIGHT - 14.0,
        escape(x_label)
    );
}

/// A legend of `names` in a row above the plot's top right corner, clear
/// of the bars and lines.
fn legend(out: &mut String, names: &[&str]) {
    for (i, name) in names.iter().enumerate() {
        let y = TOP - 8.0;
        let x = WIDTH - RIGHT - 90.0 * (names.len() - i) as f64;
        let _ = writeln!(
            out,
            r#"<rect x="{x:.1}" y="{:.1}" width="14" height="10" fill="{}"/><text x="{:.1}" y="{:.1}">{}</text>"#,
            y - 9.0,
            COLOURS[i % COLOURS.len()],
            x + 20.0,
            y,
            escape(name)
        );
    }
}

/// A line per series, its values against their index (batch 0, 1, ...).
pub fn lines(title: &str, x_label: &str, y_label: &str, log: bool, series: &[(&str, &[f64])]) -> String {
    let y = Axis::fitting(series.iter().flat_map(|(_, v)| v.iter().copied()), log);
    let n = series.iter().map(|(_, v)| v.len()).max().unwrap_or(1).max(2);
    let mut out = String::new();
    frame(&mut out, title, x_label, y_label, y);
    let (plot_w, plot_h) = (WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM);
    let x_step = nice_step((n - 1) as f64 / 6.0);
    let mut t = 0.0;
    while t <= (n - 1) as f64 {
        let px = LEFT + plot_w * t / (n - 1) as f64;
        let _ = writeln!(
            out,
            r#"<text x="{px:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
            HEIGHT - BOTTOM + 16.0,
            short(t)
        );
        t += x_step;
    }
    for (i, (_, values)) in series.iter().enumerate() {
        let points: Vec<String> = values
            .iter()
            .enumerate()
            .filter(|(_, v)| v.is_finite())
            .map(|(j, v)| {
                let px = LEFT + plot_w * j as f64 / (n - 1) as f64;
                let py = TOP + plot_h * (1.0 - y.at(*v));
                format!("{px:.1},{py:.1}")
            })
            .collect();
        let _ = writeln!(
            out,
            r#"<polyline fill="none" stroke="{}" stroke-width="1.2" points="{}"/>"#,
            COLOURS[i % COLOURS.len()],
            points.join(" ")
        );
    }
    legend(&mut out, &series.iter().map(|(name, _)| *name).collect::<Vec<_>>());
    out.push_str("</svg>\n");
    out
}

/// Grouped bars: for each group (a label under the x axis), one bar per
/// series, its value written above it. `series` names the bars of a group
/// in order; a group's missing value (NaN) draws no bar.
pub fn bars(title: &str, y_label: &str, log: bool, series: &[&str], groups: &[(&str, Vec<f64>)]) -> String {
    let y = Axis::fitting(groups.iter().flat_map(|(_, v)| v.iter().copied()), log);
    let mut out = String::new();
    frame(&mut out, title, "", y_label, y);
    let (plot_w, plot_h) = (WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM);
    let slot = plot_w / groups.len().max(1) as f64;
    let bar = (slot * 0.7) / series.len().max(1) as f64;
    for (g, (label, values)) in groups.iter().enumerate() {
        let x0 = LEFT + slot * g as f64 + slot * 0.15;
        for (i, v) in values.iter().enumerate().filter(|(_, v)| v.is_finite()) {
            let top = TOP + plot_h * (1.0 - y.at(*v));
            let x = x0 + bar * i as f64;
            let _ = writeln!(
                out,
                r#"<rect x="{x:.1}" y="{top:.1}" width="{:.1}" height="{:.1}" fill="{}"/><text x="{:.1}" y="{:.1}" text-anchor="middle" font-size="11">{}</text>"#,
                bar - 2.0,
                (HEIGHT - BOTTOM - top).max(0.0),
                COLOURS[i % COLOURS.len()],
                x + bar / 2.0 - 1.0,
                top - 4.0,
                short(*v)
            );
        }
        let _ = writeln!(
            out,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
            LEFT + slot * (g as f64 + 0.5),
            HEIGHT - BOTTOM + 18.0,
            escape(label)
        );
    }
    legend(&mut out, series);
    out.push_str("</svg>\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn axes_hold_their_values() {
        let lin = Axis::fitting([3.0, 47.0], false);
        assert_eq!((lin.min, lin.max), (0.0, 50.0));
        let log = Axis::fitting([4.2, 980.0], true);
        assert_eq!((log.min, log.max), (1.0, 1000.0));
        assert_eq!(log.ticks(), vec![1.0, 10.0, 100.0, 1000.0]);
        assert!((log.at(10.0) - 1.0 / 3.0).abs() < 1e-9);
    }

    #[test]
    fn labels_are_short() {
        assert_eq!(short(2_500_000.0), "2.5M");
        assert_eq!(short(12_000.0), "12k");
        assert_eq!(short(0.5), "0.5");
        assert_eq!(short(300.0), "300");
        assert_eq!(short(1521.53), "1522");
        assert_eq!(short(47.87), "47.9");
        assert_eq!(short(13.91e6), "13.9M");
    }

    #[test]
    fn charts_draw_each_series_and_bar() {
        let svg = lines(
            "t",
            "batch",
            "ms",
            true,
            &[("weir", &[5.0, 6.0]), ("Spark", &[300.0, 250.0])],
        );
        assert_eq!(svg.matches("<polyline").count(), 2);
        let svg = bars(
            "t",
            "rows/s",
            false,
            &["weir", "Spark"],
            &[("Delta", vec![9e6, f64::NAN])],
        );
        assert_eq!(svg.matches("<rect x=").count(), 1 + 2, "one bar and two legend keys");
        assert!(svg.ends_with("</svg>\n"));
    }
}
