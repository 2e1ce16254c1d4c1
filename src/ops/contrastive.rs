//! The symmetric InfoNCE loss of CLIP over a batch of matching
//! (image, text) embedding pairs: both are L2-normalised, their cosine
//! similarities scaled by exp(log_scale) (a learned temperature), and the
//! loss is the mean of the image-to-text and text-to-image cross-entropies
//! with the matching pair as the target.

use super::cross_entropy::CrossEntropy;
use crate::backend::{Backend, Matmul, Reduce, VocabSubsets};

pub struct Contrastive<B: Backend> {
    pub batch: usize,
    pub dim: usize,
    pub image_n: B::Tensor,
    pub text_n: B::Tensor,
    image_norm: B::Tensor,
    text_norm: B::Tensor,
    /// [image, text] scaled cosines, and [text, image].
    pub logits_i2t: B::Tensor,
    logits_t2i: B::Tensor,
    d_logits_i2t: B::Tensor,
    d_logits_t2i: B::Tensor,
    d_cos: B::Tensor,
    d_image_n: B::Tensor,
    d_text_n: B::Tensor,
    products: B::Tensor,
    scale_slots: B::Tensor,
    i2t: CrossEntropy<B>,
    t2i: CrossEntropy<B>,
    targets: B::Ids,
    full: VocabSubsets<B>,
    /// The loss, one element.
    pub loss: B::Tensor,
}

impl<B: Backend> Contrastive<B> {
    pub fn new(b: &B, batch: usize, dim: usize) -> Self {
        let square = batch * batch;
        let mut i2t = CrossEntropy::new(b, batch, batch);
        let mut t2i = CrossEntropy::new(b, batch, batch);
        i2t.set_weights(b, &vec![1.0; batch], 0.5);
        t2i.set_weights(b, &vec![1.0; batch], 0.5);
        let ids: Vec<u32> = (0..batch as u32).collect();
        Contrastive {
            batch,
            dim,
            image_n: b.zeros(batch * dim),
            text_n: b.zeros(batch * dim),
            image_norm: b.zeros(batch),
            text_norm: b.zeros(batch),
            logits_i2t: b.zeros(square),
            logits_t2i: b.zeros(square),
            d_logits_i2t: b.zeros(square),
            d_logits_t2i: b.zeros(square),
            d_cos: b.zeros(square),
            d_image_n: b.zeros(batch * dim),
            d_text_n: b.zeros(batch * dim),
            products: b.zeros(square),
            scale_slots: b.zeros(2),
            i2t,
            t2i,
            targets: b.ids(&ids),
            full: VocabSubsets::full(b, batch),
            loss: b.zeros(1),
        }
    }

    fn similarities(&self) -> Matmul {
        Matmul::new(self.batch, self.batch, self.dim).trans_b()
    }

    pub fn forward(&mut self, b: &B, image: &B::Tensor, text: &B::Tensor, log_scale: &B::Tensor) {
        let d = self.dim;
        b.l2_normalize(image, &mut self.image_n, &mut self.image_norm, d);
        b.l2_normalize(text, &mut self.text_n, &mut self.text_norm, d);
        let similarities = self.similarities();
        let cos = &mut self.d_cos; // scratch until backward
        b.matmul(&self.image_n, &self.text_n, cos, &similarities);
        b.scale_by_exp(log_scale, cos, &mut self.logits_i2t, false);
        b.matmul(&self.text_n, &self.image_n, cos, &similarities);
        b.scale_by_exp(log_scale, cos, &mut self.logits_t2i, false);
        self.i2t
            .forward(b, &self.logits_i2t, &self.targets, &self.full, true);
        self.t2i
            .forward(b, &self.logits_t2i, &self.targets, &self.full, true);
        b.add(1.0, &self.i2t.loss, 1.0, &self.t2i.loss, &mut self.loss);
    }

    /// Writes d_image and d_text; d_log_scale[0] = the temperature's gradient.
    pub fn backward(
        &mut self,
        b: &B,
        log_scale: &B::Tensor,
        d_image: &mut B::Tensor,
        d_text: &mut B::Tensor,
        d_log_scale: &mut B::Tensor,
    ) {
        let (n, d) = (self.batch, self.dim);
        self.i2t.backward(
            b,
            &self.logits_i2t,
            &self.targets,
            &self.full,
            &mut self.d_logits_i2t,
            false,
        );
        self.t2i.backward(
            b,
            &self.logits_t2i,
            &self.targets,
            &self.full,
            &mut self.d_logits_t2i,
            false,
        );
        // logits = exp(s) cos, so dL/ds = sum(dlogits * logits).
        b.mul(
            1.0,
            &self.d_logits_i2t,
            &self.logits_i2t,
            &mut self.products,
        );
        b.reduce(&self.products, Reduce::Sum, &mut self.scale_slots, 0);
        b.mul(
            1.0,
            &self.d_logits_t2i,
            &self.logits_t2i,
            &mut self.products,
        );
        b.reduce(&self.products, Reduce::Sum, &mut self.scale_slots, 1);
        b.reduce(&self.scale_slots, Reduce::Sum, d_log_scale, 0);
        // cos_i2t = I T^T: dI = dC T, dT = dC^T I. cos_t2i = T I^T likewise.
        b.scale_by_exp(log_scale, &self.d_logits_i2t, &mut self.d_cos, false);
        b.matmul(
            &self.d_cos,
            &self.text_n,
            &mut self.d_image_n,
            &Matmul::new(n, d, n),
        );
        b.matmul(
            &self.d_cos,
            &self.image_n,
            &mut self.d_text_n,
            &Matmul::new(n, d, n).trans_a(),
        );
        b.scale_by_exp(log_scale, &self.d_logits_t2i, &mut self.d_cos, false);
        b.matmul(
            &self.d_cos,
            &self.image_n,
            &mut self.d_text_n,
            &Matmul::new(n, d, n).accumulate(),
        );
        b.matmul(
            &self.d_cos,
            &self.text_n,
            &mut self.d_image_n,
            &Matmul::new(n, d, n).trans_a().accumulate(),
        );
        b.l2_normalize_backward(
            &self.image_n,
            &self.image_norm,
            &self.d_image_n,
            d_image,
            d,
            false,
        );
        b.l2_normalize_backward(
            &self.text_n,
            &self.text_norm,
            &self.d_text_n,
            d_text,
            d,
            false,
        );
    }

    /// The fraction of images whose own text scores highest (reads back).
    pub fn in_batch_accuracy(&self, b: &B) -> f32 {
        let logits = b.to_vec(&self.logits_i2t);
        let n = self.batch;
        let hits = (0..n)
            .filter(|&i| {
                let row = &logits[i * n..(i + 1) * n];
                (0..n).all(|j| j == i || row[j] < row[i])
            })
            .count();
        hits as f32 / n as f32
    }

    pub fn read_loss(&self, b: &B) -> f32 {
        b.to_vec(&self.loss)[0]
    }
}
