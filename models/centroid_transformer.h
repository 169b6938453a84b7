#pragma once
// Centroid Transformers (Wu et al., section 2.2 and the experiments of section 3):
// encoders that alternate self-attention blocks with centroid attention blocks
// (nn/attention/centroid.h), so the sequence shortens at every centroid block
// (Figure 1b), and the models of the paper's experiments built on them:
//   - CentroidSummarizer: encoder-decoder whose decoder cross-attends to the
//     centroids (section 3.1, Gigaword summarisation);
//   - PointCloudClassifier: the point-cloud network of section 3.2 / Figure 5;
//   - CentroidViT: a vision transformer with one centroid block (section 3.4).
// Every model reports its parameter count and forward MACs for an input size
// through nn::measure_cost (nn/cost.h), which derives them from the layers' GEMMs.
#include <memory>
#include <string>
#include <vector>

#include "core/rng.h"
#include "models/transformer.h"
#include "nn/attention/centroid.h"
#include "nn/cost.h"
#include "nn/blocks/transformer.h"

namespace cf {
namespace models {

// ---- encoder over features ----

struct CentroidTransformerOptions {
  // Sizes, dropout, activation and pre-/post-LN of the self-attention blocks
  // (TransformerEncoderLayer); the centroid blocks share d_model, n_heads, d_ff,
  // dropout and activation (they are always pre-LN: the update of eq. 4 is itself
  // the residual link).
  nn::TransformerLayerOptions layer;
  // One entry per block: "self" or "centroid". Figure 1b alternates them.
  std::vector<std::string> blocks{"self", "centroid", "self", "centroid"};
  // Options of every centroid block (d_model and n_heads are taken from `layer`).
  nn::CentroidAttentionOptions centroid;
  void validate(const char* who) const;
};

struct EncoderOutput {
  Tensor h;     // (B, M_last, D)
  Tensor mask;  // bool (B, M_last), true = padding; undefined when none
};

class CentroidTransformerEncoder : public nn::Module {
 public:
  explicit CentroidTransformerEncoder(const CentroidTransformerOptions& o, Generator& gen = default_generator());
  // x (B, N, D), key_padding_mask bool (B, N). `sampler` draws random-sampling inits.
  EncoderOutput forward(const Tensor& x, const Tensor& key_padding_mask = Tensor(), Generator* sampler = nullptr);
  std::vector<std::shared_ptr<nn::TransformerEncoderLayer>> self_blocks;       // null where the block is a centroid block
  std::vector<std::shared_ptr<nn::CentroidAttentionBlock>> centroid_blocks;    // null where it is a self block

 private:
  std::vector<std::string> kinds_;
};

// ---- summarisation (section 3.1) ----

// TransformerConfig gives the vocabulary, sizes, layer counts and positions (its
// attention must be "full"); the encoder's block `centroid_layer` (1-based; the paper
// replaces "the second self-attention module") is a centroid block with M = N / 3
// ("M is set to N/3") and mean-pooling initialisation (the paper's best, Table 1).
// M and the pooling windows follow the padded length N, not each row's own length: a row's
// outputs depend on how much padding its batch gives it (measured by a bug hunt: up to 0.13 on
// the logits of an 8-token row padded by 1-11 tokens). Batch rows of equal length (or one row at
// a time) where results must not depend on the batch.
struct CentroidSummarizerConfig {
  TransformerConfig base;
  std::vector<int64_t> centroid_layers{2};
  nn::CentroidAttentionOptions centroid = default_centroid();
  static nn::CentroidAttentionOptions default_centroid();
};

class CentroidSummarizer : public nn::Module {
 public:
  explicit CentroidSummarizer(const CentroidSummarizerConfig& c, Generator& gen = default_generator());
  // src int64 (B, Ns), tgt int64 (B, Nt) -> logits (B, Nt, tgt_vocab). Masks as in
  // EncoderDecoder (default: pad_id tokens). `sampler` draws random-sampling inits (null: the global
  // generator, so two calls in eval mode differ unless the generator is reseeded between them).
  Tensor forward(const Tensor& src, const Tensor& src_mask, const Tensor& tgt, const Tensor& tgt_mask = Tensor(),
                 Generator* sampler = nullptr);
  // The centroids (B, M, D) and their mask: what the decoder cross-attends to.
  EncoderOutput encode(const Tensor& src, const Tensor& src_mask = Tensor(), Generator* sampler = nullptr);
  Tensor decode(const EncoderOutput& memory, const Tensor& tgt, const Tensor& tgt_mask = Tensor());
  // Cost of the whole model, and of the encoder alone (what Table 1 reports).
  nn::Cost cost(int64_t batch, int64_t src_len, int64_t tgt_len);
  nn::Cost encoder_cost(int64_t batch, int64_t src_len);

  std::shared_ptr<nn::Embedding> src_embedding, tgt_embedding;
  std::shared_ptr<CentroidTransformerEncoder> encoder;
  std::shared_ptr<nn::LayerNorm> encoder_norm, decoder_norm;  // pre-LN only
  std::vector<std::shared_ptr<nn::TransformerDecoderLayer>> decoder_layers;
  std::shared_ptr<nn::Linear> head;

 private:
  std::shared_ptr<nn::UnaryModule> src_pos_, tgt_pos_;
  std::shared_ptr<nn::Dropout> drop_;
  int64_t pad_id_, vocab_, tgt_vocab_;
};

// ---- point-cloud classification (section 3.2, Figure 5) ----

struct PointCloudOptions {
  int64_t num_classes = 40;  // ModelNet40
  // "The dimension of the 4 attention blocks is 64-128-128-512."
  std::vector<int64_t> widths{64, 128, 128, 512};
  // Figure 5 / section 3.2: SA, CA (N -> N/2), SA, CA (N/2 -> N/8).
  std::vector<std::string> blocks{"self", "centroid", "self", "centroid"};
  std::vector<double> downsample{1, 2, 1, 4};  // per block (centroid blocks only)
  int64_t n_heads = 4;
  int64_t ff_mult = 2;          // d_ff = ff_mult * width
  int64_t knn = 40;             // "We set K = 40 in all the KNN masks"
  int64_t iterations = 1;       // T (Table 3: T = 1 for the performance-efficiency balance; 0: sampling alone)
  // "We use Farthest Point Sampling (FPS) as our initialization function"; or
  // "random", or "kmeans" (Table 3's baseline: FPS seeds, then kmeans_iters Lloyd
  // steps in xyz). Each centroid sits at its seed point (its cluster's mean for
  // "kmeans"): the next block samples from there, and the up-sampling reads it.
  std::string init = "fps";
  int64_t kmeans_iters = 3;     // "K-means for 3 iterations" (Table 3)
  int64_t fuse_dim = 1024;      // the fully connected layer after concatenating every block's features
  std::vector<int64_t> head{512, 256};  // hidden widths of the 3-layer MLP head
  double dropout = 0.5;         // in the MLP head
  double negative_slope = 0.2;  // "All the activation functions ... LeakyReLU with a negative slope of 0.2"
  void validate(const char* who) const;
};

class PointCloudClassifier : public nn::Module {
 public:
  explicit PointCloudClassifier(const PointCloudOptions& o, Generator& gen = default_generator());
  // points (B, N, 3) -> logits (B, num_classes).
  Tensor forward(const Tensor& points, Generator* sampler = nullptr);
  nn::Cost cost(int64_t batch, int64_t num_points);

  std::shared_ptr<nn::Linear> embed;
  std::vector<std::shared_ptr<nn::Linear>> width_proj;  // null where the width does not change
  std::vector<std::shared_ptr<nn::TransformerEncoderLayer>> self_blocks;
  std::vector<std::shared_ptr<nn::CentroidAttentionBlock>> centroid_blocks;
  std::shared_ptr<nn::Linear> fuse, fc1, fc2, fc3;

 private:
  PointCloudOptions o_;
  std::shared_ptr<nn::Dropout> drop_;
};

// ---- vision transformer (section 3.4, Figure 7) ----

struct CentroidViTOptions {
  int64_t image_size = 224, in_channels = 3;
  // Patch embedding: a (kernel x kernel, stride, padding) convolution. DeiT: 16/16/0
  // (196 tokens); the paper's overlapping setting: 16/14/1 (256 tokens).
  int64_t patch_kernel = 16, patch_stride = 16, patch_padding = 0;
  int64_t d_model = 192, n_heads = 3, d_ff = 768, n_layers = 12;  // DeiT-tiny
  int64_t centroid_at = 6;  // 1-based layer replaced by the centroid block (Table 5: "centroid @")
  int64_t num_classes = 1000;
  double dropout = 0.0;
  void validate(const char* who) const;
};

class CentroidViT : public nn::Module {
 public:
  explicit CentroidViT(const CentroidViTOptions& o, Generator& gen = default_generator());
  // images (B, C, H, W) float -> logits (B, num_classes).
  Tensor forward(const Tensor& images);
  int64_t num_tokens() const { return grid_ * grid_; }
  nn::Cost cost(int64_t batch);

  std::shared_ptr<nn::Linear> patch_proj;
  std::shared_ptr<nn::LearnedPositionalEncoding> positions;
  std::vector<std::shared_ptr<nn::TransformerEncoderLayer>> self_blocks;  // null at centroid_at
  std::shared_ptr<nn::CentroidAttentionBlock> centroid_block;
  std::shared_ptr<nn::LayerNorm> final_norm;
  std::shared_ptr<nn::Linear> head;

 private:
  Tensor patches(const Tensor& images) const;  // (B, C, H, W) -> (B, grid^2, C * k * k)
  CentroidViTOptions o_;
  int64_t grid_;
};

}  // namespace models
}  // namespace cf
