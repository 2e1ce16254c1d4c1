//! The desktop app: driven through egui_kittest, and in a real window
//! under Xvfb.

mod kittest;
mod window;
