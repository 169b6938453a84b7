// cf-bench model (apps/bench/bench.h).
#include <optional>
#include <vector>

#include "bench/bench.h"

namespace cf::bench {

namespace {

// ---------------------------------------------------------------- model

}  // namespace

// One training step (forward, backward, AdamW) and one inference step of a
// Transformer encoder classifier: token embedding + sinusoidal positions, 2
// post-LN layers (d = 256, 4 heads, FFN 1024, ReLU, no dropout), mean pooling, a
// linear head and cross-entropy. apps/bench/peers.py builds the same model in
// PyTorch (nn.TransformerEncoder) for the side-by-side table.
json bench_model(const BenchOptions& o) {
  const int64_t B = o.batch_size, vocab = 1000, classes = 10;
  const std::vector<int64_t>& sizes = o.sizes;
  json rows = json::array();
  for (int64_t n : sizes) {
    double full_train = -1, full_infer = -1, full_graph = -1, full_infer_graph = -1;
    for (const std::string& variant : o.variants) {
      cf::apps::EncoderBenchConfig bc;  // apps/common/attention_bench.h, shared with cf-efficiency
      bc.variant = variant;
      bc.n = n;
      bc.batch = B;
      bc.layers = 2;
      bc.d_model = 256;
      bc.heads = 4;
      bc.d_ff = 1024;
      bc.vocab = vocab;
      bc.classes = classes;
      bc.seed = uint64_t(1000 + n);
      bc.device = g_device;
      cf::apps::EncoderBench model(bc);
      const int64_t reps = o.repeat > 0 ? o.repeat : (n >= 2048 ? 2 : 5);
      json r;
      r["name"] = "model_" + variant + "_" + std::to_string(n);
      r["params"] = {{"variant", variant}, {"n", n}, {"batch", B}, {"layers", 2}, {"d_model", 256},
                     {"heads", 4}, {"d_ff", 1024}, {"vocab", vocab}, {"classes", classes},
                     {"parameters", model.num_parameters()}, {"repeat", reps}, {"dtype", "float32"}};
      if (low_dtype(o)) r["params"]["autocast"] = dtype_label(o);  // float32 weights, 16-bit matmuls
      cf::AutocastGuard autocast(low_dtype(o));
      // A variant without a 16-bit path (--precision bf16|fp16) gets a skipped row (apps/common/precision.h).
      cf::apps::Measurement train, infer;
      const std::optional<std::string> no_16bit = cf::apps::skip_without_16bit(low_dtype(o).has_value(), [&] {
        train = model.measure_train(reps, 1);
        infer = model.measure_infer(reps, 1);
      });
      if (no_16bit) {
        r["skipped"] = *no_16bit;
        rows.push_back(r);
        continue;
      }
      const double t_train = train.median_s;
      r["train_step_time_s"] = t_train;
      r["train_tokens_per_s"] = double(B * n) / t_train;
      r["train_peak_bytes"] = train.peak_bytes;
      const double t_infer = infer.median_s;
      r["infer_step_time_s"] = t_infer;
      r["infer_tokens_per_s"] = double(B * n) / t_infer;
      r["infer_peak_bytes"] = infer.peak_bytes;
      // Kernel calls a step (core/kernel_calls.h): what fusion cuts, on either device.
      r["train_kernel_calls_per_step"] = train.kernel_calls;
      r["infer_kernel_calls_per_step"] = infer.kernel_calls;
      if (g_device.is_cuda()) {  // issue 25: the host waits for nothing inside a step
        r["train_device_to_host_per_step"] = train.transfers.device_to_host;
        r["train_synchronizations_per_step"] = train.transfers.synchronizations;
        // A pageable host-to-device copy waits for the stream too (a factory filled on the host).
        r["train_host_to_device_per_step"] = train.transfers.host_to_device;
        r["infer_host_to_device_per_step"] = infer.transfers.host_to_device;
        r["infer_device_to_host_per_step"] = infer.transfers.device_to_host;
        r["infer_synchronizations_per_step"] = infer.transfers.synchronizations;
        r["train_kernel_launches_per_step"] = train.transfers.kernel_launches;
        r["infer_kernel_launches_per_step"] = infer.transfers.kernel_launches;
      }
      if (o.cuda_graph) {  // issue 25: the launches of a small step, replayed as one graph
        for (const bool training : {true, false}) {
          const std::string k = training ? "train_graph" : "infer_graph";
          try {
            const cf::apps::Measurement graph =
                training ? model.measure_train_graph(reps) : model.measure_infer_graph(reps);
            r[k + "_step_time_s"] = graph.median_s;
            r[k + "_ratio_vs_eager"] = graph.median_s / (training ? t_train : t_infer);
            r[k + "_launches_per_step"] = graph.transfers.kernel_launches;
            r[k + "_device_to_host_per_step"] = graph.transfers.device_to_host;
            r[k + "_synchronizations_per_step"] = graph.transfers.synchronizations;
            r[k + "_peak_bytes"] = graph.peak_bytes;
            double& full = training ? full_graph : full_infer_graph;
            if (variant == "full") full = graph.median_s;
            if (full > 0) r[k + "_ratio_vs_full"] = graph.median_s / full;
          } catch (const cf::DeviceError& e) {  // a step a graph cannot hold (core/cuda_graph.h)
            r[k + "_skipped"] = e.what();
          }
        }
      }
      if (variant == "full") {
        full_train = t_train;
        full_infer = t_infer;
      }
      if (full_train > 0) r["train_ratio_vs_full"] = t_train / full_train;
      if (full_infer > 0) r["infer_ratio_vs_full"] = t_infer / full_infer;
      rows.push_back(r);
    }
  }
  return report("model", rows);
}

}  // namespace cf::bench
