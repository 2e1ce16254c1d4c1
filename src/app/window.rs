//! The app in a native window (eframe, wgpu renderer), with what scripts
//! need to check it headless: a screenshot after N frames, and frame-time
//! and memory figures written as JSON.

use super::{CaptuneApp, Source, Tab};
use crate::progress::Progress;
use crate::source::embeddings::CaptionData;
use anyhow::{Context, Result, anyhow};
use serde::Serialize;
use std::path::PathBuf;
use std::sync::mpsc::{Receiver, TryRecvError};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// What the window waits for: the data set with its embeddings, and the
/// retriever that made them (it judges the captions of a run trained in
/// the app).
pub struct Loaded {
    pub data: CaptionData,
    pub retriever: Option<PathBuf>,
}

/// Loads the data (on a thread of its own while the window shows the progress).
pub type Loader = Box<dyn FnOnce(&Progress) -> Result<Loaded> + Send>;

#[derive(Clone, Debug, Default)]
pub struct WindowOptions {
    pub tab: Option<Tab>,
    /// After `frames` frames, save the window's pixels here (PNG) and close.
    pub screenshot: Option<PathBuf>,
    /// Close after this many frames (drawn continuously, to measure).
    pub frames: Option<usize>,
    /// Write frame times and peak memory here (JSON) on closing.
    pub stats: Option<PathBuf>,
    pub size: Option<[f32; 2]>,
}

/// What `--stats` writes.
#[derive(Debug, Serialize)]
pub struct FrameStats {
    pub frames: usize,
    pub mean_frame_ms: f64,
    pub p95_frame_ms: f64,
    pub max_frame_ms: f64,
    pub frames_per_s: f64,
    /// Peak resident memory of the process (VmHWM), when the OS tells.
    pub peak_memory_mib: Option<f64>,
    pub training_step: Option<usize>,
    /// Frames drawn while the data was still loading (the window opens first).
    pub loading_frames: usize,
    /// Seconds from opening the window to its first frame, and to the app's.
    pub first_frame_s: f64,
    pub app_ready_s: f64,
}

/// The window's content: the loading screen, then the app.
enum Stage {
    Loading {
        progress: Progress,
        done: Receiver<Result<Loaded>>,
        source: Option<Source>,
    },
    Ready(Box<CaptuneApp>),
    Failed(String),
}

struct Window {
    stage: Stage,
    loading_frames: usize,
    opened: Instant,
    first_frame_s: Option<f64>,
    app_ready_s: Option<f64>,
    options: WindowOptions,
    frame_ms: Vec<f64>,
    last: Option<Instant>,
    shot: Arc<Mutex<Option<Result<(), String>>>>,
    shot_asked: bool,
    /// Where the statistics go when eframe drops the app.
    out: Arc<Mutex<Option<FrameStats>>>,
    /// Why loading failed, for `run` to return.
    out_failure: Arc<Mutex<Option<String>>>,
}

/// Opens the window at once and runs until it is closed; `load` runs
/// meanwhile, its progress shown, and the app starts on what it returns.
pub fn run(load: Loader, source: Source, options: WindowOptions) -> Result<()> {
    let size = options.size.unwrap_or([1280.0, 800.0]);
    let native = eframe::NativeOptions {
        viewport: egui::ViewportBuilder::default()
            .with_title("captune")
            .with_inner_size(size),
        renderer: eframe::Renderer::Wgpu,
        ..Default::default()
    };
    let opened = Instant::now();
    let stats = options.stats.clone();
    let result: Arc<Mutex<Option<FrameStats>>> = Arc::default();
    let out = Arc::clone(&result);
    let shot: Arc<Mutex<Option<Result<(), String>>>> = Arc::default();
    let shot_seen = Arc::clone(&shot);
    let failure: Arc<Mutex<Option<String>>> = Arc::default();
    let out_failure = Arc::clone(&failure);
    eframe::run_native(
        "captune",
        native,
        Box::new(move |cc| {
            let progress = Progress::hidden();
            let (send, done) = std::sync::mpsc::channel();
            let (thread_progress, repaint) = (progress.clone(), cc.egui_ctx.clone());
            std::thread::spawn(move || {
                let _ = send.send(load(&thread_progress));
                repaint.request_repaint();
            });
            Ok(Box::new(Window {
                stage: Stage::Loading {
                    progress,
                    done,
                    source: Some(source),
                },
                loading_frames: 0,
                opened,
                first_frame_s: None,
                app_ready_s: None,
                options,
                frame_ms: Vec::new(),
                last: None,
                shot: shot_seen,
                shot_asked: false,
                out,
                out_failure,
            }))
        }),
    )
    .map_err(|e| {
        anyhow!(
            "cannot open the window: {e}; `captune app` needs a display (X11 or Wayland) and a \
             GPU or software Vulkan/GL driver (Debian: apt-get install mesa-vulkan-drivers)"
        )
    })?;
    if let Some(Err(e)) = shot.lock().expect("screenshot lock").take() {
        return Err(anyhow!(e));
    }
    if let Some(why) = failure.lock().expect("failure lock").take() {
        return Err(anyhow!(why));
    }
    if let (Some(path), Some(s)) = (stats, result.lock().expect("stats lock").take()) {
        std::fs::write(&path, serde_json::to_string_pretty(&s)? + "\n")
            .with_context(|| format!("{}: cannot write the frame statistics", path.display()))?;
    }
    Ok(())
}

impl Drop for Window {
    fn drop(&mut self) {
        *self.out.lock().expect("stats lock") = Some(self.stats());
    }
}

impl eframe::App for Window {
    fn ui(&mut self, ui: &mut egui::Ui, _frame: &mut eframe::Frame) {
        self.frame(ui);
    }

    /// The panels' colour: the panels themselves paint no background here.
    fn clear_color(&self, visuals: &egui::Visuals) -> [f32; 4] {
        visuals.panel_fill.to_normalized_gamma_f32()
    }
}

impl Window {
    fn frame(&mut self, ui: &mut egui::Ui) {
        let now = Instant::now();
        if let Some(last) = self.last.replace(now) {
            self.frame_ms
                .push(now.duration_since(last).as_secs_f64() * 1000.0);
        }
        self.show(ui);
        let since = self.opened.elapsed().as_secs_f64();
        self.first_frame_s.get_or_insert(since);
        if matches!(self.stage, Stage::Ready(_)) {
            self.app_ready_s.get_or_insert(since);
        }
        let ctx = ui.ctx().clone();
        match &self.stage {
            Stage::Loading { .. } => {
                // Frames are measured from the app's first.
                self.frame_ms.clear();
                self.loading_frames += 1;
                return;
            }
            Stage::Failed(_) if self.options.frames.is_some() => {
                // A script waits for frames that will not come: end (with the error).
                ctx.send_viewport_cmd(egui::ViewportCommand::Close);
                return;
            }
            _ => {}
        }
        let Some(frames) = self.options.frames else {
            return;
        };
        // Measuring: draw continuously, as a busy user would make it.
        ctx.request_repaint();
        if self.frame_ms.len() < frames {
            return;
        }
        match (&self.options.screenshot, self.shot_asked) {
            (Some(path), false) => {
                self.shot_asked = true;
                let (path, done, repaint) = (path.clone(), Arc::clone(&self.shot), ctx.clone());
                ctx.request_screenshot(move |image| {
                    let saved = save_png(&image, &path);
                    *done.lock().expect("screenshot lock") = Some(saved);
                    repaint.request_repaint();
                });
            }
            (Some(_), true) if self.shot.lock().expect("screenshot lock").is_none() => {}
            _ => ctx.send_viewport_cmd(egui::ViewportCommand::Close),
        }
    }

    /// Shows why loading failed; `run` returns it as its error when the window closes.
    fn fail(&mut self, why: String) {
        *self.out_failure.lock().expect("failure lock") = Some(why.clone());
        self.stage = Stage::Failed(why);
    }

    /// The loading screen until the data is ready, then the app.
    fn show(&mut self, ui: &mut egui::Ui) {
        if let Stage::Loading {
            progress,
            done,
            source,
        } = &mut self.stage
        {
            match done.try_recv() {
                Ok(Ok(loaded)) => {
                    let mut source = source.take().expect("the source waits for the data");
                    if let Source::Train(setup) = &mut source {
                        setup.retriever.clone_from(&loaded.retriever);
                    }
                    let mut app = CaptuneApp::new(ui.ctx(), Arc::new(loaded.data), source);
                    if let Some(retriever) = loaded.retriever {
                        app.judge_with(retriever);
                    }
                    if let Some(tab) = self.options.tab {
                        app.tab = tab;
                    }
                    app.paint_background = false;
                    self.stage = Stage::Ready(Box::new(app));
                }
                Ok(Err(e)) => self.fail(format!("{e:#}")),
                Err(TryRecvError::Disconnected) => self.fail("the loading thread stopped".into()),
                Err(TryRecvError::Empty) => {
                    loading_screen(ui, progress);
                    ui.ctx()
                        .request_repaint_after(std::time::Duration::from_millis(100));
                    return;
                }
            }
        }
        match &mut self.stage {
            Stage::Ready(app) => app.show(ui),
            Stage::Failed(why) => {
                egui::CentralPanel::default_margins().show(ui, |ui| {
                    ui.heading("captune could not load its data");
                    ui.colored_label(ui.visuals().error_fg_color, why.as_str());
                    ui.label("Close the window, fix the command's options and start it again.");
                });
            }
            Stage::Loading { .. } => unreachable!("handled above"),
        }
    }

    fn stats(&self) -> FrameStats {
        let mut sorted = self.frame_ms.clone();
        sorted.sort_by(f64::total_cmp);
        let n = sorted.len();
        let mean = sorted.iter().sum::<f64>() / n.max(1) as f64;
        FrameStats {
            frames: n,
            mean_frame_ms: mean,
            p95_frame_ms: sorted.get(n * 95 / 100).copied().unwrap_or(0.0),
            max_frame_ms: sorted.last().copied().unwrap_or(0.0),
            frames_per_s: if mean > 0.0 { 1000.0 / mean } else { 0.0 },
            peak_memory_mib: crate::bench::peak_memory_mib(),
            training_step: match &self.stage {
                Stage::Ready(app) => app.live_status().map(|s| s.step),
                _ => None,
            },
            loading_frames: self.loading_frames,
            first_frame_s: self.first_frame_s.unwrap_or(0.0),
            app_ready_s: self.app_ready_s.unwrap_or(0.0),
        }
    }
}

/// What the window shows while the data loads: the job and its progress.
fn loading_screen(ui: &mut egui::Ui, progress: &Progress) {
    egui::CentralPanel::default_margins().show(ui, |ui| {
        ui.heading("captune");
        ui.add_space(8.0);
        match progress.current() {
            Some(job) => {
                ui.label(format!("{}: {} of {}", job.what, job.done, job.total));
                let fraction = job.done as f32 / job.total.max(1) as f32;
                ui.add(egui::ProgressBar::new(fraction).show_percentage());
            }
            None => {
                ui.label("reading the data set...");
                ui.spinner();
            }
        }
        ui.add_space(8.0);
        ui.label(
            "Image embeddings are cached on disk after the first start, so the next start is quick.",
        );
    });
}

fn save_png(image: &egui::ColorImage, path: &PathBuf) -> Result<(), String> {
    let [w, h] = image.size;
    let bytes: Vec<u8> = image.pixels.iter().flat_map(|c| c.to_array()).collect();
    image::RgbaImage::from_raw(w as u32, h as u32, bytes)
        .ok_or_else(|| "the screenshot has the wrong size".to_string())?
        .save(path)
        .map_err(|e| format!("{}: cannot write the screenshot: {e}", path.display()))
}
