//! Scoring captions: the metrics against pycocoevalcap and by hand, and
//! the HTML report.

mod metrics;
mod report;
