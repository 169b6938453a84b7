#pragma once
// The attention interface every variant implements, so a model swaps its
// attention by configuration (DESIGN.md section 5).
//
// MultiHeadAttention projects the inputs and splits heads; the attention object
// sees per-head tensors and returns per-head outputs:
//   q (B, H, Nq, Dk), k (B, H, Nk, Dk), v (B, H, Nk, Dv) -> (B, H, Nq, Dv).
// Masks: key_padding_mask is bool (B, Nk), TRUE MEANS PADDING (ignored), as in
// PyTorch; query_padding_mask the same for the queries (self-attention passes
// the key mask). causal: query i sees key j only when j <= i + (Nk - Nq), i.e.
// queries are aligned with the last Nq keys (Nq == Nk in self-attention).
// A query that may attend to nothing outputs zeros.
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/rng.h"
#include "core/tensor.h"
#include "nn/config.h"
#include "nn/module.h"

namespace cf {
namespace nn {

class AuxLosses;  // nn/losses.h: auxiliary losses a layer adds during forward

struct AttentionArgs {
  Tensor q, k, v;
  Tensor key_padding_mask;    // bool (B, Nk) or undefined
  Tensor query_padding_mask;  // bool (B, Nq) or undefined
  bool causal = false;
  // The layer input before projection, (B, Nq, D): for variants that cluster the
  // hidden states themselves (neural clustering attention, eqs. 2-5).
  Tensor query_input;
  AuxLosses* aux = nullptr;  // where a variant adds its auxiliary losses, if the model collects them
};

class Attention : public Module {
 public:
  virtual Tensor forward(const AttentionArgs& args) = 0;
  // The name this variant is configured by ("full", ...).
  virtual std::string type() const = 0;
  // True when the keys are the queries' projection: always for LSH attention (the Reformer
  // hashes queries and keys as one, and normalises the keys), and for any variant built with
  // the option "shared_qk": true (make_attention), which then reads k = q as it is (e.g.
  // clustered attention on a model trained with shared queries and keys). MultiHeadAttention
  // has no key projection for such a variant and passes k = q.
  virtual bool shares_qk() const { return shared_qk_; }
  void set_shared_qk(bool on) { shared_qk_ = on; }
  // False for a variant that cannot mask causally (clustered attention: every member takes its
  // centroid's weights over all keys, later ones included). A layer that always runs causally (a
  // decoder's self-attention, MultiHeadAttention::require_causal) refuses such a variant when it is
  // built or switched to, not at its first forward.
  virtual bool supports_causal() const { return true; }

 private:
  bool shared_qk_ = false;
};

// What a factory needs: the variant's name, the sizes, and its options, read
// through a Config so that unknown or mistyped options are errors naming the key
// (the factory calls options.finish()). In a model config the options are the
// keys of the "attention" object besides "type".
struct AttentionSpec {
  std::string type = "full";
  int64_t d_model = 0, n_heads = 0;
  Config options{nlohmann::json::object(), "attention"};
  // Draws the initial values of a variant's own parameters (neural clustering's C
  // and W^C); null: the global generator. A layer passes the generator it is
  // built with, so a model's initial weights depend only on that generator.
  Generator* gen = nullptr;
};

// Builds the variant named by spec.type. The list of variants lives in one place
// (nn/attention/registry.cpp), which every new variant joins.
std::shared_ptr<Attention> make_attention(const AttentionSpec& spec);
std::vector<std::string> attention_types();

// ---- shared helpers for variants and their dense references ----

// bool (Nq, Nk), true where key j is after query i under the causal rule above.
Tensor causal_mask(int64_t nq, int64_t nk, Device device = Device::cpu());

// Checks the shapes, dtypes and masks of args; `who` names the caller in errors.
void check_attention_args(const AttentionArgs& args, const char* who);

// Autocast (issue 26), for variants whose clustering or kernels have no 16-bit path yet:
// args with q, k, v and query_input cast to float32 where they are bfloat16/float16
// (differentiable casts; only while autocast is on; k stays q when it was q). Such a variant's
// forward calls it while
// autocast is on and runs its body under AutocastGuard(std::nullopt): a float32 island with
// a float32 output, as flash_attention under autocast (docs/design-notes.md, "Autocast").
AttentionArgs autocast_float32_args(const AttentionArgs& args);

// The blocked-positions mask of args as bool broadcastable to (B, H, Nq, Nk):
// key padding OR causal. Undefined when nothing is masked.
Tensor dense_block_mask(const AttentionArgs& args);

}  // namespace nn
}  // namespace cf
