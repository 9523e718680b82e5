//! `simulate --plot`: per session, context tokens per request (raw, the host's own compaction, condense)
//! with the window line, and cumulative estimated cost (the same three and the floor); checkpoints,
//! cache breaks and host compactions marked. SVG or PNG by the file's extension, drawn with `plotters` in
//! an embedded font (DejaVu Sans), so the same figures give the same file on every machine.

use anyhow::{anyhow, bail, Context, Result};
use condense_engine::simulate::{ListPrice, Point};
use plotters::coord::Shift;
use plotters::prelude::*;
use std::path::Path;
use std::sync::Once;

/// One session's panel row.
pub(crate) struct Session<'a> {
    pub name: &'a str,
    pub series: &'a [Point],
}

const ROW_HEIGHT: u32 = 300;
const WIDTH: u32 = 1400;
const RAW: RGBColor = RGBColor(200, 60, 60);
const HOST: RGBColor = RGBColor(230, 150, 30);
const CONDENSE: RGBColor = RGBColor(40, 100, 200);
const CHECKPOINT: RGBColor = RGBColor(40, 150, 80);
const FLOOR: RGBColor = RGBColor(120, 120, 120);
const FONT: &str = "sans-serif";

/// Refuses a plot file that is neither `.svg` nor `.png` (before any replay runs).
pub(crate) fn check_path(path: &Path) -> Result<()> {
    match path.extension().and_then(|e| e.to_str()).map(str::to_ascii_lowercase).as_deref() {
        Some("svg" | "png") => Ok(()),
        _ => bail!("--plot {}: a plot is written as FILE.svg or FILE.png", path.display()),
    }
}

/// Writes the plot of `sessions` to `path` (`.svg` or `.png`).
pub(crate) fn write(path: &Path, sessions: &[Session], window: Option<u64>, price: &ListPrice) -> Result<()> {
    static FONT_ONCE: Once = Once::new();
    FONT_ONCE.call_once(|| {
        // The embedded font is a valid TrueType file; were it not, text would fail to draw below with a
        // message naming the plot.
        let _ = plotters::style::register_font(FONT, FontStyle::Normal, dejavu::sans::regular());
    });
    let size = (WIDTH, ROW_HEIGHT * sessions.len().max(1) as u32 + 40);
    check_path(path)?;
    let drawn = if path.extension().is_some_and(|e| e.eq_ignore_ascii_case("svg")) {
        draw(SVGBackend::new(path, size).into_drawing_area(), sessions, window, price)
    } else {
        draw(BitMapBackend::new(path, size).into_drawing_area(), sessions, window, price)
    };
    drawn.with_context(|| format!("writing the plot {}", path.display()))
}

fn draw<DB: DrawingBackend>(root: DrawingArea<DB, Shift>, sessions: &[Session], window: Option<u64>, price: &ListPrice) -> Result<()>
where
    DB::ErrorType: 'static,
{
    let e = |e: DrawingAreaErrorKind<DB::ErrorType>| anyhow!("{e}");
    root.fill(&WHITE).map_err(e)?;
    let (head, body) = root.split_vertically(40);
    let legend = format!(
        "red: raw (no limit)   orange: the host's own compaction{}   blue: condense   grey: the floor   green lines: condense checkpoints   dots: cache breaks   cost: {} list prices",
        window.map(|w| format!(" at a {} window", tokens_label(w))).unwrap_or_default(),
        price.model
    );
    head.draw(&Text::new(legend, (10, 12), (FONT, 15).into_font())).map_err(e)?;
    for (row, s) in body.split_evenly((sessions.len().max(1), 1)).iter().zip(sessions) {
        let (left, right) = row.split_horizontally(WIDTH * 3 / 5);
        tokens_panel(&left, s, window).map_err(e)?;
        cost_panel(&right, s, price).map_err(e)?;
    }
    root.present().map_err(e)
}

/// The axis maximum for a raw series peaking at `raw` beside the series that matter peaking at `kept`:
/// raw's peak when it is within 4× of them, else theirs (and raw runs off the top: `true`).
fn scale_for(raw: u64, kept: u64) -> (u64, bool) {
    if raw > kept.saturating_mul(4) && kept > 0 { (kept, true) } else { (raw.max(kept), false) }
}

/// Tokens as people read them: 950, 12.5k, 1.2M.
fn tokens_label(v: u64) -> String {
    match v {
        0..1_000 => v.to_string(),
        1_000..1_000_000 => format!("{}k", trim(v as f64 / 1e3)),
        _ => format!("{}M", trim(v as f64 / 1e6)),
    }
}

fn trim(x: f64) -> String {
    let s = if x >= 100.0 { format!("{x:.0}") } else { format!("{x:.1}") };
    s.strip_suffix(".0").map(str::to_string).unwrap_or(s)
}

fn dollars_label(v: f64) -> String {
    if v >= 100.0 { format!("${v:.0}") } else if v >= 1.0 { format!("${v:.2}") } else { format!("${v:.3}") }
}

/// `name` followed by `rest`, with the start of `name` cut (`…`) until the title fits the panel's width:
/// the end of a session's name is what tells it apart.
fn fit_title<DB: DrawingBackend>(area: &DrawingArea<DB, Shift>, name: &str, rest: &str) -> String {
    let room = area.dim_in_pixel().0.saturating_sub(24);
    let font: TextStyle = (FONT, 15).into();
    let width = |t: &str| area.estimate_text_size(t, &font).map_or(t.chars().count() as u32 * 9, |(w, _)| w);
    let mut chars: Vec<char> = name.chars().collect();
    let mut title = format!("{name}{rest}");
    while width(&title) > room && !chars.is_empty() {
        chars.remove(0);
        title = format!("…{}{rest}", chars.iter().collect::<String>());
    }
    title
}

fn tokens_panel<DB: DrawingBackend>(area: &DrawingArea<DB, Shift>, s: &Session, window: Option<u64>) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    let n = s.series.len().max(2) as u64;
    let raw_peak = s.series.iter().map(|p| p.raw).max().unwrap_or(0);
    let kept_peak = s.series.iter().map(|p| p.host.max(p.rendered)).max().unwrap_or(0).max(window.unwrap_or(0));
    // Raw far above what is sent would flatten the lines that matter: it runs off the top instead.
    let (scale, off) = scale_for(raw_peak, kept_peak);
    let top = (scale as f64 * 1.08).max(1000.0) as u64;
    let what = match off {
        true => format!(": context per request (raw peaks at {}, off the scale)", tokens_label(raw_peak)),
        false => ": context per request".to_string(),
    };
    let caption = fit_title(area, s.name, &what);
    let mut chart = ChartBuilder::on(area)
        .caption(caption, (FONT, 15))
        .margin(8)
        .x_label_area_size(32)
        .y_label_area_size(56)
        .build_cartesian_2d(1u64..n, 0u64..top)?;
    chart
        .configure_mesh()
        .x_desc("request")
        .y_desc("tokens")
        .y_label_formatter(&|v| tokens_label(*v))
        .label_style((FONT, 12))
        .light_line_style(WHITE.mix(0.0))
        .draw()?;
    for (i, _) in s.series.iter().enumerate().filter(|(_, p)| p.checkpoint) {
        let x = i as u64 + 1;
        chart.draw_series(LineSeries::new([(x, 0), (x, top)], CHECKPOINT.mix(0.35)))?;
    }
    if let Some(w) = window {
        chart.draw_series(LineSeries::new([(1, w), (n, w)], BLACK.stroke_width(1)))?;
        chart.draw_series([Text::new(format!("window {}", tokens_label(w)), (n - n / 8, w), (FONT, 12).into_font())])?;
    }
    let line = |pick: fn(&Point) -> u64| s.series.iter().enumerate().map(move |(i, p)| (i as u64 + 1, pick(p)));
    chart.draw_series(LineSeries::new(line(|p| p.raw), RAW))?;
    if s.series.iter().any(|p| p.host != p.raw) {
        chart.draw_series(LineSeries::new(line(|p| p.host), HOST))?;
        chart.draw_series(s.series.iter().enumerate().filter(|(_, p)| p.host_compacted()).map(|(i, p)| Circle::new((i as u64 + 1, p.host), 3, HOST.filled())))?;
    }
    chart.draw_series(LineSeries::new(line(|p| p.rendered), CONDENSE.stroke_width(2)))?;
    chart.draw_series(s.series.iter().enumerate().filter(|(_, p)| p.broke).map(|(i, p)| Circle::new((i as u64 + 1, p.rendered), 2, CONDENSE.filled())))?;
    Ok(())
}

fn cost_panel<DB: DrawingBackend>(area: &DrawingArea<DB, Shift>, s: &Session, price: &ListPrice) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    let cumulative = |cost: &dyn Fn(&Point) -> f64| {
        let mut sum = 0.0;
        s.series.iter().enumerate().map(move |(i, p)| {
            sum += cost(p);
            (i as u64 + 1, sum)
        }).collect::<Vec<_>>()
    };
    let raw = cumulative(&|p| price.dollars(p.raw, p.raw_cached, 0));
    let host = cumulative(&|p| price.dollars(p.host, p.host_cached, p.host_summarizing));
    let condense = cumulative(&|p| price.dollars(p.rendered, p.rendered_cached, 0));
    let floor = cumulative(&|p| price.floor_dollars(p.raw_new));
    let last = |v: &[(u64, f64)]| v.last().map(|p| p.1).unwrap_or(0.0);
    let cents = |d: f64| (d * 100.0) as u64;
    let (scale, _) = scale_for(cents(last(&raw)), cents(last(&host)).max(cents(last(&condense))));
    let top = (scale as f64 / 100.0).max(0.001) * 1.08;
    let n = s.series.len().max(2) as u64;
    let mut chart = ChartBuilder::on(area)
        .caption(
            format!("cumulative cost: raw {}, host {}, condense {}, floor {}", dollars_label(last(&raw)), dollars_label(last(&host)), dollars_label(last(&condense)), dollars_label(last(&floor))),
            (FONT, 15),
        )
        .margin(8)
        .x_label_area_size(32)
        .y_label_area_size(56)
        .build_cartesian_2d(1u64..n, 0.0..top)?;
    chart
        .configure_mesh()
        .x_desc("request")
        .y_desc(format!("US$ ({})", price.model))
        .y_label_formatter(&|v| dollars_label(*v))
        .label_style((FONT, 12))
        .light_line_style(WHITE.mix(0.0))
        .draw()?;
    chart.draw_series(LineSeries::new(raw, RAW))?;
    if s.series.iter().any(|p| p.host != p.raw) {
        chart.draw_series(LineSeries::new(host, HOST))?;
    }
    chart.draw_series(LineSeries::new(floor, FLOOR))?;
    chart.draw_series(LineSeries::new(condense, CONDENSE.stroke_width(2)))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raw_far_above_the_rest_runs_off_the_scale() {
        assert_eq!(scale_for(5_900_000, 200_000), (200_000, true));
        assert_eq!(scale_for(400_000, 200_000), (400_000, false));
        assert_eq!(scale_for(900, 0), (900, false));
    }

    #[test]
    fn labels_read_as_people_write_them() {
        assert_eq!(tokens_label(950), "950");
        assert_eq!(tokens_label(12_500), "12.5k");
        assert_eq!(tokens_label(32_000), "32k");
        assert_eq!(tokens_label(1_200_000), "1.2M");
        assert_eq!(dollars_label(0.0421), "$0.042");
        assert_eq!(dollars_label(12.345), "$12.35");
    }
}
