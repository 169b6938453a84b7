#include "models/centroid_transformer.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "autograd/ops/elementwise.h"
#include "autograd/ops/random.h"
#include "autograd/ops/reduce.h"
#include "autograd/ops/shape.h"
#include "core/error.h"

namespace cf {
namespace models {

namespace {

nn::CentroidAttentionOptions centroid_options(const nn::CentroidAttentionOptions& c, int64_t d, int64_t h) {
  nn::CentroidAttentionOptions o = c;
  o.d_model = d;
  o.n_heads = h;
  return o;
}

std::string describe(const Tensor& t) { return t.defined() ? t.describe() : std::string("undefined"); }

}  // namespace

// ---------------------------------------------------------------- encoder

void CentroidTransformerOptions::validate(const char* who) const {
  CF_CHECK(!blocks.empty(), ValueError, "[", who, "] needs at least one block");
  for (const std::string& b : blocks)
    CF_CHECK(b == "self" || b == "centroid", ValueError, "[", who, "] blocks are \"self\" or \"centroid\", got \"", b,
             "\"");
  CF_CHECK(layer.attention.type == "full", ValueError, "[", who,
           "] the self-attention blocks of a centroid transformer use full attention, got \"", layer.attention.type,
           "\"");
  centroid_options(centroid, layer.d_model, layer.n_heads).validate(who);
}

CentroidTransformerEncoder::CentroidTransformerEncoder(const CentroidTransformerOptions& o, Generator& gen)
    : kinds_(o.blocks) {
  o.validate("CentroidTransformerEncoder");
  auto list = register_module("blocks", std::make_shared<nn::ModuleList>());
  const nn::CentroidAttentionOptions co = centroid_options(o.centroid, o.layer.d_model, o.layer.n_heads);
  for (const std::string& kind : o.blocks) {
    if (kind == "self") {
      self_blocks.push_back(list->push_back(std::make_shared<nn::TransformerEncoderLayer>(o.layer, gen)));
      centroid_blocks.push_back(nullptr);
    } else {
      self_blocks.push_back(nullptr);
      centroid_blocks.push_back(list->push_back(
          std::make_shared<nn::CentroidAttentionBlock>(co, o.layer.d_ff, o.layer.activation, o.layer.dropout, gen)));
    }
  }
}

EncoderOutput CentroidTransformerEncoder::forward(const Tensor& x, const Tensor& mask, Generator* sampler) {
  EncoderOutput out{x, mask};
  for (size_t i = 0; i < kinds_.size(); ++i) {
    if (self_blocks[i]) {
      out.h = self_blocks[i]->forward(out.h, out.mask);
    } else {
      // Figure 1b: the centroid block replaces the sequence by its M centroids; the
      // following blocks (and a decoder) see only those.
      nn::CentroidBlockOutput c = centroid_blocks[i]->forward(out.h, out.mask, Tensor(), sampler);
      out.h = c.u;
      out.mask = c.mask;
    }
  }
  return out;
}

// ---------------------------------------------------------------- summariser

nn::CentroidAttentionOptions CentroidSummarizerConfig::default_centroid() {
  nn::CentroidAttentionOptions o;
  o.init = "mean";
  o.downsample = 3;
  return o;
}

CentroidSummarizer::CentroidSummarizer(const CentroidSummarizerConfig& c, Generator& gen)
    : pad_id_(c.base.pad_id),
      vocab_(c.base.vocab_size),
      tgt_vocab_(c.base.tgt_vocab_size > 0 ? c.base.tgt_vocab_size : c.base.vocab_size) {
  const TransformerConfig& b = c.base;
  b.validate("CentroidSummarizer");
  CF_CHECK(b.pad_id < tgt_vocab_, ValueError, "[CentroidSummarizer] pad_id ", b.pad_id,
           " out of range for tgt_vocab_size ", tgt_vocab_);
  CentroidTransformerOptions eo;
  eo.layer = b.layer;
  eo.centroid = c.centroid;
  eo.blocks.assign(size_t(b.n_layers), "self");
  for (int64_t l : c.centroid_layers) {
    CF_CHECK(l >= 1 && l <= b.n_layers, ValueError, "[CentroidSummarizer] centroid layer ", l,
             " out of range for n_layers = ", b.n_layers, " (1-based)");
    eo.blocks[size_t(l - 1)] = "centroid";
  }
  const int64_t d = b.layer.d_model;
  src_embedding = register_module("src_embedding", std::make_shared<nn::Embedding>(b.vocab_size, d, b.pad_id, gen));
  auto positions = [&]() -> std::shared_ptr<nn::UnaryModule> {
    if (b.positional == "learned") return std::make_shared<nn::LearnedPositionalEncoding>(b.max_len, d, gen);
    return std::make_shared<nn::SinusoidalPositionalEncoding>(b.max_len, d);
  };
  src_pos_ = register_module("src_positions", positions());
  drop_ = register_module("dropout", std::make_shared<nn::Dropout>(b.layer.dropout));
  encoder = register_module("encoder", std::make_shared<CentroidTransformerEncoder>(eo, gen));
  if (b.layer.norm_first) encoder_norm = register_module("encoder_norm", std::make_shared<nn::LayerNorm>(d));
  tgt_embedding = register_module("tgt_embedding", std::make_shared<nn::Embedding>(tgt_vocab_, d, b.pad_id, gen));
  tgt_pos_ = register_module("tgt_positions", positions());
  // "When decoding, the cross-attention is applied between the generated sequence
  // and the centroids": the decoder layers are the baseline's, fed the centroids.
  auto list = register_module("decoder_layers", std::make_shared<nn::ModuleList>());
  const int64_t n_dec = b.n_decoder_layers > 0 ? b.n_decoder_layers : b.n_layers;
  for (int64_t i = 0; i < n_dec; ++i)
    decoder_layers.push_back(list->push_back(std::make_shared<nn::TransformerDecoderLayer>(b.layer, gen)));
  if (b.layer.norm_first) decoder_norm = register_module("decoder_norm", std::make_shared<nn::LayerNorm>(d));
  head = register_module("head", std::make_shared<nn::Linear>(d, tgt_vocab_, true, gen));
}

EncoderOutput CentroidSummarizer::encode(const Tensor& src, const Tensor& given_mask, Generator* sampler) {
  CF_CHECK(src.defined() && src.dtype() == kInt64 && src.dim() == 2, ValueError,
           "[CentroidSummarizer] src must be int64 (B, N), got ", describe(src));
  if (given_mask.defined())
    CF_CHECK(given_mask.dtype() == kBool && given_mask.shape() == src.shape(), ShapeError,
             "[CentroidSummarizer] src_mask must be bool ", shape_str(src.shape()), ", got ", given_mask.describe());
  const Tensor mask = given_mask.defined() ? given_mask : padding_mask(src, pad_id_);
  EncoderOutput out =
      encoder->forward(drop_->forward(src_pos_->forward(src_embedding->forward(src))), mask, sampler);
  if (encoder_norm) out.h = encoder_norm->forward(out.h);
  return out;
}

Tensor CentroidSummarizer::decode(const EncoderOutput& memory, const Tensor& tgt, const Tensor& given_mask) {
  CF_CHECK(tgt.defined() && tgt.dtype() == kInt64 && tgt.dim() == 2, ValueError,
           "[CentroidSummarizer] tgt must be int64 (B, N), got ", describe(tgt));
  if (given_mask.defined())
    CF_CHECK(given_mask.dtype() == kBool && given_mask.shape() == tgt.shape(), ShapeError,
             "[CentroidSummarizer] tgt_mask must be bool ", shape_str(tgt.shape()), ", got ", given_mask.describe());
  const Tensor mask = given_mask.defined() ? given_mask : padding_mask(tgt, pad_id_);
  Tensor h = drop_->forward(tgt_pos_->forward(tgt_embedding->forward(tgt)));
  for (auto& l : decoder_layers) h = l->forward(h, memory.h, mask, memory.mask);
  if (decoder_norm) h = decoder_norm->forward(h);
  return head->forward(h);
}

Tensor CentroidSummarizer::forward(const Tensor& src, const Tensor& src_mask, const Tensor& tgt,
                                   const Tensor& tgt_mask, Generator* sampler) {
  return decode(encode(src, src_mask, sampler), tgt, tgt_mask);
}

nn::Cost CentroidSummarizer::cost(int64_t batch, int64_t src_len, int64_t tgt_len) {
  Generator g(0);  // sample inputs on the model's device
  const Device dev = src_embedding->weight.device();
  Tensor src = randint(std::max<int64_t>(pad_id_ + 1, 0), vocab_, {batch, src_len}, g).to(dev);
  Tensor tgt = randint(std::max<int64_t>(pad_id_ + 1, 0), tgt_vocab_, {batch, tgt_len}, g).to(dev);
  return nn::measure_cost(*this, [&] { return std::vector<Tensor>{forward(src, Tensor(), tgt)}; });
}

nn::Cost CentroidSummarizer::encoder_cost(int64_t batch, int64_t src_len) {
  Generator g(0);
  const Device dev = src_embedding->weight.device();
  Tensor src = randint(std::max<int64_t>(pad_id_ + 1, 0), vocab_, {batch, src_len}, g).to(dev);
  nn::Cost c = nn::measure_cost(*this, [&] { return std::vector<Tensor>{encode(src).h}; });
  c.params = src_embedding->num_parameters() + src_pos_->num_parameters() + encoder->num_parameters() +
             (encoder_norm ? encoder_norm->num_parameters() : 0);
  return c;
}

// ---------------------------------------------------------------- point clouds

void PointCloudOptions::validate(const char* who) const {
  CF_CHECK(num_classes > 0, ValueError, "[", who, "] num_classes must be positive, got ", num_classes);
  CF_CHECK(!widths.empty() && widths.size() == blocks.size() && downsample.size() == blocks.size(), ValueError, "[",
           who, "] widths, blocks and downsample need one entry per block, got ", widths.size(), ", ", blocks.size(),
           " and ", downsample.size());
  for (size_t i = 0; i < blocks.size(); ++i) {
    CF_CHECK(blocks[i] == "self" || blocks[i] == "centroid", ValueError, "[", who,
             "] blocks are \"self\" or \"centroid\", got \"", blocks[i], "\"");
    CF_CHECK(widths[i] > 0 && n_heads > 0 && widths[i] % n_heads == 0, ValueError, "[", who, "] width ", widths[i],
             " of block ", i + 1, " (1-based) must be a positive multiple of n_heads (", n_heads, ")");
    CF_CHECK(downsample[i] >= 1, ValueError, "[", who, "] downsample of block ", i + 1, " (1-based) must be >= 1, got ",
             downsample[i]);
  }
  CF_CHECK(ff_mult > 0 && knn >= 0 && iterations >= 0 && fuse_dim > 0 && head.size() == 2 && head[0] > 0 &&
               head[1] > 0 && dropout >= 0 && dropout < 1,
           ValueError, "[", who,
           "] needs ff_mult > 0, knn >= 0, iterations >= 0, fuse_dim > 0, two positive head widths and dropout in "
           "[0, 1)");
  // The nearest-neighbour up-sampling needs each centroid's position in xyz: the
  // sampling initialisations keep their seed point, K-Means its cluster's mean.
  CF_CHECK(init == "fps" || init == "random" || init == "kmeans", ValueError, "[", who,
           "] init must be \"fps\", \"random\" or \"kmeans\" (inits that place each centroid in xyz), got \"",
           init, "\"");
  CF_CHECK(kmeans_iters >= 1, ValueError, "[", who, "] kmeans_iters must be >= 1, got ", kmeans_iters);
}

PointCloudClassifier::PointCloudClassifier(const PointCloudOptions& o, Generator& gen) : o_(o) {
  o.validate("PointCloudClassifier");
  // The slope at full precision (std::to_string's six decimals made a slope of 1e-7 zero).
  std::ostringstream slope;
  slope.precision(17);
  slope << o.negative_slope;
  const std::string act = "leaky_relu:" + slope.str();
  embed = register_module("embed", std::make_shared<nn::Linear>(3, o.widths[0], true, gen));
  auto list = register_module("blocks", std::make_shared<nn::ModuleList>());
  auto projs = register_module("width_proj", std::make_shared<nn::ModuleList>());
  int64_t prev = o.widths[0], total = 0;
  for (size_t i = 0; i < o.blocks.size(); ++i) {
    const int64_t w = o.widths[i];
    total += w;
    // A block that widens the features starts with a linear map to its width.
    width_proj.push_back(w != prev ? projs->push_back(std::make_shared<nn::Linear>(prev, w, true, gen)) : nullptr);
    prev = w;
    if (o.blocks[i] == "self") {
      nn::TransformerLayerOptions l;
      l.d_model = w;
      l.n_heads = o.n_heads;
      l.d_ff = o.ff_mult * w;
      l.dropout = 0.0;
      l.activation = act;
      l.norm_first = true;
      self_blocks.push_back(list->push_back(std::make_shared<nn::TransformerEncoderLayer>(l, gen)));
      centroid_blocks.push_back(nullptr);
    } else {
      nn::CentroidAttentionOptions c;
      c.d_model = w;
      c.n_heads = o.n_heads;
      c.init = o.init;
      c.kmeans_iters = o.kmeans_iters;
      c.downsample = o.downsample[i];
      c.knn = o.knn;
      c.iterations = o.iterations;
      self_blocks.push_back(nullptr);
      centroid_blocks.push_back(list->push_back(std::make_shared<nn::CentroidAttentionBlock>(c, o.ff_mult * w, act, 0.0, gen)));
    }
  }
  // "we concatenate all the layers' feature together and pass through a fully
  // connected layer", then max + average pooling and a 3-layer MLP.
  fuse = register_module("fuse", std::make_shared<nn::Linear>(total, o.fuse_dim, true, gen));
  fc1 = register_module("fc1", std::make_shared<nn::Linear>(2 * o.fuse_dim, o.head[0], true, gen));
  fc2 = register_module("fc2", std::make_shared<nn::Linear>(o.head[0], o.head[1], true, gen));
  fc3 = register_module("fc3", std::make_shared<nn::Linear>(o.head[1], o.num_classes, true, gen));
  drop_ = register_module("dropout", std::make_shared<nn::Dropout>(o.dropout));
}

Tensor PointCloudClassifier::forward(const Tensor& points, Generator* sampler) {
  CF_CHECK(points.defined() && points.dim() == 3 && points.shape()[2] == 3 && is_floating(points.dtype()),
           ShapeError, "[PointCloudClassifier] expected float points (B, N, 3), got ", describe(points));
  const double slope = o_.negative_slope;
  Tensor h = leaky_relu(embed->forward(points), slope);
  Tensor xyz = points.detach();  // where each current token sits, for FPS and up-sampling
  std::vector<Tensor> feats;
  for (size_t i = 0; i < o_.blocks.size(); ++i) {
    if (width_proj[i]) h = width_proj[i]->forward(h);
    if (self_blocks[i]) {
      h = self_blocks[i]->forward(h);
    } else {
      // FPS (and K-Means) run on the points' coordinates; the KNN of the centroid
      // update runs in feature space ("the KNN is calculated in feature space in the
      // centroid attention blocks"). Each centroid takes its init's position in xyz.
      nn::CentroidBlockOutput c = centroid_blocks[i]->forward(h, Tensor(), xyz, sampler);
      h = c.u;
      xyz = c.positions;
    }
    // "we fuse the features in each layer by upsampling their number of points to N
    // using nearest-neighbor sampling": each input point takes the features of the
    // nearest current token (in xyz).
    const int64_t n = points.shape()[1];
    if (h.shape()[1] == n) {
      feats.push_back(h);
    } else {
      Tensor nn_idx = reshape(nn::knn_indices(points.detach(), xyz, 1), {points.shape()[0], n});
      feats.push_back(nn::gather_rows(h, nn_idx));
    }
  }
  Tensor f = leaky_relu(fuse->forward(cat(feats, 2)), slope);  // (B, N, fuse_dim)
  // "The output feature will pass through a max pooling and a average pooling layer
  // separately. At last, we concatenate them together."
  Tensor g = cat({amax(f, {1}), mean(f, {1})}, 1);
  g = drop_->forward(leaky_relu(fc1->forward(g), slope));
  g = drop_->forward(leaky_relu(fc2->forward(g), slope));
  return fc3->forward(g);
}

nn::Cost PointCloudClassifier::cost(int64_t batch, int64_t num_points) {
  Generator g(0);
  Tensor pts = randn({batch, num_points, 3}, kFloat32, g).to(embed->weight.device());  // the model's device
  return nn::measure_cost(*this, [&] { return std::vector<Tensor>{forward(pts)}; });
}

// ---------------------------------------------------------------- vision transformer

void CentroidViTOptions::validate(const char* who) const {
  CF_CHECK(image_size > 0 && in_channels > 0 && patch_kernel > 0 && patch_stride > 0 && patch_padding >= 0,
           ValueError, "[", who, "] needs positive image_size, in_channels, patch_kernel, patch_stride and "
           "patch_padding >= 0");
  CF_CHECK(image_size + 2 * patch_padding >= patch_kernel, ValueError, "[", who, "] image_size ", image_size,
           " (padding ", patch_padding, ") is smaller than the patch kernel ", patch_kernel);
  CF_CHECK(d_model > 0 && n_heads > 0 && d_model % n_heads == 0 && d_ff > 0 && n_layers > 0, ValueError, "[", who,
           "] needs d_model a positive multiple of n_heads, d_ff > 0 and n_layers > 0");
  CF_CHECK(centroid_at >= 0 && centroid_at <= n_layers, ValueError, "[", who, "] centroid_at ", centroid_at,
           " out of range [0, n_layers = ", n_layers, "] (1-based; 0: no centroid block)");
  CF_CHECK(num_classes > 0 && dropout >= 0 && dropout < 1, ValueError, "[", who,
           "] needs num_classes > 0 and dropout in [0, 1)");
}

CentroidViT::CentroidViT(const CentroidViTOptions& o, Generator& gen) : o_(o) {
  o.validate("CentroidViT");
  grid_ = (o.image_size + 2 * o.patch_padding - o.patch_kernel) / o.patch_stride + 1;
  const int64_t k = o.patch_kernel;
  // The patch convolution as one GEMM over unfolded patches (counted as MACs).
  patch_proj = register_module("patch_proj", std::make_shared<nn::Linear>(o.in_channels * k * k, o.d_model, true, gen));
  positions = register_module("positions", std::make_shared<nn::LearnedPositionalEncoding>(grid_ * grid_, o.d_model, gen));
  nn::TransformerLayerOptions l;
  l.d_model = o.d_model;
  l.n_heads = o.n_heads;
  l.d_ff = o.d_ff;
  l.dropout = o.dropout;
  l.activation = "gelu";
  l.norm_first = true;
  auto list = register_module("blocks", std::make_shared<nn::ModuleList>());
  for (int64_t i = 1; i <= o.n_layers; ++i) {
    if (i == o.centroid_at) {
      // Section 3.4: reshape the N tokens to sqrt(N) x sqrt(N), "apply a depth-wise
      // convolution layer with kernel size 3, stride 2, padding 1" to get N/4 tokens
      // as the initialisation, and "set T = 1".
      nn::CentroidAttentionOptions c;
      c.d_model = o.d_model;
      c.n_heads = o.n_heads;
      c.init = "conv2d";
      c.conv_kernel = 3;
      c.conv_stride = 2;
      c.conv_padding = 1;
      c.iterations = 1;
      centroid_block = list->push_back(std::make_shared<nn::CentroidAttentionBlock>(c, o.d_ff, "gelu", o.dropout, gen));
      self_blocks.push_back(nullptr);
    } else {
      self_blocks.push_back(list->push_back(std::make_shared<nn::TransformerEncoderLayer>(l, gen)));
    }
  }
  final_norm = register_module("final_norm", std::make_shared<nn::LayerNorm>(o.d_model));
  head = register_module("head", std::make_shared<nn::Linear>(o.d_model, o.num_classes, true, gen));
}

Tensor CentroidViT::patches(const Tensor& images) const {
  const int64_t b = images.shape()[0], c = o_.in_channels, k = o_.patch_kernel, s = o_.patch_stride;
  Tensor img = o_.patch_padding > 0
                   ? pad(images, {o_.patch_padding, o_.patch_padding, o_.patch_padding, o_.patch_padding})
                   : images;
  const int64_t span = s * (grid_ - 1) + 1;
  std::vector<Tensor> taps;  // one strided (B, C, grid, grid) window per kernel position
  for (int64_t a = 0; a < k; ++a)
    for (int64_t e = 0; e < k; ++e) taps.push_back(slice(slice(img, 2, a, a + span, s), 3, e, e + span, s));
  Tensor p = stack(taps, 4);                           // (B, C, g, g, k*k)
  p = permute(p, {0, 2, 3, 1, 4});                     // (B, g, g, C, k*k): PyTorch's (C, kh, kw) weight order
  return reshape(p, {b, grid_ * grid_, c * k * k});
}

Tensor CentroidViT::forward(const Tensor& images) {
  CF_CHECK(images.defined() && images.dim() == 4 && images.shape()[1] == o_.in_channels &&
               images.shape()[2] == o_.image_size && images.shape()[3] == o_.image_size && is_floating(images.dtype()),
           ShapeError, "[CentroidViT] expected float images (B, ", o_.in_channels, ", ", o_.image_size, ", ",
           o_.image_size, "), got ", describe(images));
  Tensor h = positions->forward(patch_proj->forward(patches(images)));
  for (size_t i = 0; i < self_blocks.size(); ++i)
    h = self_blocks[i] ? self_blocks[i]->forward(h) : centroid_block->forward(h).u;
  // Mean over the final tokens (no class token: the centroid block's grid reshaping
  // needs the tokens to form a square grid).
  return head->forward(mean(final_norm->forward(h), {1}));
}

nn::Cost CentroidViT::cost(int64_t batch) {
  Generator g(0);
  const Device dev = patch_proj->weight.device();  // sample images on the model's device
  Tensor img = randn({batch, o_.in_channels, o_.image_size, o_.image_size}, kFloat32, g).to(dev);
  return nn::measure_cost(*this, [&] { return std::vector<Tensor>{forward(img)}; });
}

}  // namespace models
}  // namespace cf
