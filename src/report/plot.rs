//! Line charts as SVG, drawn by plotters: one chart per series, every
//! run's line on shared axes.

use anyhow::{Result, anyhow};
use plotters::prelude::*;

/// Distinct colours for up to eight runs, then again.
const COLOURS: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(23, 190, 207),
];

/// The colour of run `k`, as CSS.
pub fn css_colour(k: usize) -> String {
    let RGBColor(r, g, b) = COLOURS[k % COLOURS.len()];
    format!("rgb({r},{g},{b})")
}

/// One run's points of a series, (step, value).
pub struct Line<'a> {
    pub run: usize,
    pub name: &'a str,
    pub points: Vec<(f64, f64)>,
}

/// The axis range of `values`, padded so that a flat line or a single
/// point still has room.
fn range(values: impl Iterator<Item = f64>) -> Option<std::ops::Range<f64>> {
    let (lo, hi) = values.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
        (lo.min(v), hi.max(v))
    });
    if !lo.is_finite() {
        return None;
    }
    let pad = if hi > lo {
        (hi - lo) * 0.05
    } else if lo != 0.0 {
        lo.abs() * 0.05
    } else {
        1.0
    };
    Some(lo - pad..hi + pad)
}

/// An SVG chart of `title` over steps, one line per run (a marker on each
/// point, so that a series of one epoch still shows); None when no line
/// has a finite point.
pub fn chart(title: &str, lines: &[Line<'_>]) -> Result<Option<String>> {
    let finite = |l: &Line<'_>| -> Vec<(f64, f64)> {
        l.points
            .iter()
            .copied()
            .filter(|(x, y)| x.is_finite() && y.is_finite())
            .collect()
    };
    let lines: Vec<(&Line<'_>, Vec<(f64, f64)>)> =
        lines.iter().map(|l| (l, thin(finite(l)))).collect();
    let all = || lines.iter().flat_map(|(_, p)| p.iter());
    let (Some(xs), Some(ys)) = (range(all().map(|p| p.0)), range(all().map(|p| p.1))) else {
        return Ok(None);
    };
    let mut svg = String::new();
    draw(&mut svg, title, xs, ys, &lines).map_err(|e| anyhow!("drawing the chart {title}: {e}"))?;
    Ok(Some(svg))
}

/// Points drawn per line at most: a long run's per-batch series is kept
/// to the lowest and highest point of each stretch of steps, so that its
/// spikes stay and the SVG stays small.
const MAX_POINTS: usize = 1000;

fn thin(points: Vec<(f64, f64)>) -> Vec<(f64, f64)> {
    if points.len() <= MAX_POINTS {
        return points;
    }
    let stretch = points.len().div_ceil(MAX_POINTS / 2);
    let mut kept = Vec::with_capacity(MAX_POINTS);
    for chunk in points.chunks(stretch) {
        let lowest = chunk.iter().min_by(|a, b| a.1.total_cmp(&b.1));
        let highest = chunk.iter().max_by(|a, b| a.1.total_cmp(&b.1));
        let (Some(&lo), Some(&hi)) = (lowest, highest) else {
            continue;
        };
        kept.extend(if lo.0 <= hi.0 { [lo, hi] } else { [hi, lo] });
    }
    kept
}

/// Points on a line are marked only while there are few of them.
const MARKED_POINTS: usize = 40;

fn draw(
    svg: &mut String,
    title: &str,
    xs: std::ops::Range<f64>,
    ys: std::ops::Range<f64>,
    lines: &[(&Line<'_>, Vec<(f64, f64)>)],
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let root = SVGBackend::with_string(svg, (460, 280)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 16))
        .margin(10)
        .x_label_area_size(32)
        .y_label_area_size(56)
        .build_cartesian_2d(xs, ys)?;
    chart
        .configure_mesh()
        .x_desc("step")
        .x_label_formatter(&|x| format!("{x:.0}"))
        .light_line_style(RGBColor(235, 235, 235))
        .draw()?;
    for (line, points) in lines {
        let colour = COLOURS[line.run % COLOURS.len()];
        chart
            .draw_series(LineSeries::new(
                points.iter().copied(),
                colour.stroke_width(2),
            ))?
            .label(line.name)
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 16, y)], colour.stroke_width(2)));
        if points.len() <= MARKED_POINTS {
            chart.draw_series(points.iter().map(|&p| Circle::new(p, 3, colour.filled())))?;
        }
    }
    if lines.len() > 1 {
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.85))
            .border_style(RGBColor(200, 200, 200))
            .draw()?;
    }
    root.present()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_series_keep_each_stretch_lowest_and_highest_points() {
        let points: Vec<(f64, f64)> = (0..10_000).map(|i| (i as f64, (i % 7) as f64)).collect();
        let spike = (5000.0, 99.0);
        let mut with_spike = points.clone();
        with_spike[5000] = spike;
        let kept = thin(with_spike);
        assert!(kept.len() <= MAX_POINTS);
        assert!(kept.contains(&spike));
        assert!(kept.windows(2).all(|w| w[0].0 <= w[1].0), "in step order");
        assert_eq!(thin(points[..10].to_vec()), points[..10]);
        assert_eq!(range([1e-4, 1e-4].into_iter()), Some(0.95e-4..1.05e-4));
    }
}
