//! Scoring captions: the metrics against pycocoevalcap and by hand, and
//! the HTML report.

mod fluency;
mod meteor;
mod metrics;
mod report;
