//! Drawing a scene into an `image::RgbImage`: each pixel centre is tested
//! against each object's shape (no anti-aliasing, so pixels are exact and
//! the tests can check them).

use super::scene::{Background, Colour, Fill, Object, Scene, Shape, Size};
use image::{Rgb, RgbImage};

pub fn colour_rgb(c: Colour) -> Rgb<u8> {
    Rgb(match c {
        Colour::Red => [220, 40, 40],
        Colour::Green => [40, 170, 60],
        Colour::Blue => [40, 80, 220],
        Colour::Yellow => [235, 210, 40],
        Colour::Purple => [150, 60, 190],
        Colour::Orange => [245, 140, 30],
        Colour::Pink => [250, 130, 200],
        Colour::Brown => [130, 80, 35],
    })
}

pub fn background_rgb(b: Background) -> Rgb<u8> {
    Rgb(match b {
        Background::White => [245, 245, 245],
        Background::Gray => [128, 128, 128],
        Background::Black => [20, 20, 20],
        Background::Beige => [225, 210, 175],
        Background::Teal => [20, 110, 115],
    })
}

/// Where and how big an object is drawn in an image of `size` pixels.
#[derive(Clone, Copy, Debug)]
pub struct Placement {
    pub cx: f32,
    pub cy: f32,
    pub radius: f32,
    /// Outline thickness in pixels.
    pub line: f32,
    /// Stripe height in pixels (stripes alternate colour and background).
    pub band: i32,
}

impl Placement {
    pub fn of(object: &Object, size: u32) -> Placement {
        let cell = size as f32 / 3.0;
        let radius = cell
            * match object.size {
                Size::Big => 0.44,
                Size::Small => 0.27,
            };
        Placement {
            cx: (object.cell.col as f32 + 0.5) * cell,
            cy: (object.cell.row as f32 + 0.5) * cell,
            radius,
            line: (size as f32 / 40.0).max(1.5),
            band: (size as i32 / 32).max(2),
        }
    }

    /// The pixel that holds the object's centre.
    pub fn centre_pixel(&self) -> (u32, u32) {
        (self.cx.floor() as u32, self.cy.floor() as u32)
    }
}

/// Whether (dx, dy), in units of the radius with y pointing down, lies
/// inside the shape.
fn inside(shape: Shape, dx: f32, dy: f32) -> bool {
    match shape {
        Shape::Circle => dx * dx + dy * dy <= 1.0,
        Shape::Square => dx.abs().max(dy.abs()) <= 0.82,
        Shape::Diamond => dx.abs() + dy.abs() <= 1.0,
        // Apex at the top (dy = -1), base at dy = 0.8.
        Shape::Triangle => dy <= 0.8 && dx.abs() <= (dy + 1.0) / 1.8 * 0.95,
        Shape::Cross => {
            let (ax, ay) = (dx.abs(), dy.abs());
            (ax <= 0.32 && ay <= 0.95) || (ay <= 0.32 && ax <= 0.95)
        }
        Shape::Star => inside_star(dx, dy),
    }
}

/// A five-pointed star (outer radius 1, inner 0.45), point up: ray casting
/// against its ten vertices.
fn inside_star(dx: f32, dy: f32) -> bool {
    let vertex = |k: usize| {
        let r = if k.is_multiple_of(2) { 1.0 } else { 0.45 };
        let angle = -std::f32::consts::FRAC_PI_2 + k as f32 * std::f32::consts::PI / 5.0;
        (r * angle.cos(), r * angle.sin())
    };
    let mut inside = false;
    for k in 0..10 {
        let (x1, y1) = vertex(k);
        let (x2, y2) = vertex((k + 1) % 10);
        if (y1 > dy) != (y2 > dy) && dx < x1 + (dy - y1) / (y2 - y1) * (x2 - x1) {
            inside = !inside;
        }
    }
    inside
}

/// Whether the object paints pixel (px, py), given its placement.
fn paints(object: &Object, at: &Placement, px: u32, py: u32) -> bool {
    let (x, y) = (px as f32 + 0.5 - at.cx, py as f32 + 0.5 - at.cy);
    if !inside(object.shape, x / at.radius, y / at.radius) {
        return false;
    }
    match object.fill {
        Fill::Solid => true,
        Fill::Outline => {
            let inner = at.radius - at.line;
            !inside(object.shape, x / inner, y / inner)
        }
        Fill::Striped => {
            let row = py as i32 - at.centre_pixel().1 as i32;
            row.rem_euclid(2 * at.band) < at.band
        }
    }
}

pub fn render(scene: &Scene, size: u32) -> RgbImage {
    let mut image = RgbImage::from_pixel(size, size, background_rgb(scene.background));
    for object in &scene.objects {
        let at = Placement::of(object, size);
        let reach = at.radius.ceil() as i64 + 1;
        let (cx, cy) = (at.cx as i64, at.cy as i64);
        let span =
            |c: i64| (c - reach).max(0) as u32..((c + reach).min(size as i64 - 1) + 1) as u32;
        for py in span(cy) {
            for px in span(cx) {
                if paints(object, &at, px, py) {
                    image.put_pixel(px, py, colour_rgb(object.colour));
                }
            }
        }
    }
    image
}
