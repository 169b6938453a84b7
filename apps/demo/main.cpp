// cf-demo: trains a 2-layer MLP (1 -> hidden -> 1, tanh) on a noisy sine with
// the eager autograd engine and hand-written SGD, printing the falling loss as
// JSON lines and a final JSON summary. Data is generated (no download).
#include <chrono>
#include <cmath>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>

#include "cf.h"
#include "common/cli.h"
#include "common/options.h"
#include "common/report.h"

using json = nlohmann::ordered_json;
using cf::apps::UsageError;

namespace {

const char* kUsage = R"(usage: cf-demo [options]

Fits y = sin(x) + noise, x uniform in [-pi, pi], with a 2-layer MLP
(Linear(1, hidden) -> tanh -> Linear(hidden, 1)), mean squared error and plain
SGD written by hand (add_ under NoGradGuard). Prints one JSON line every
--log-every steps and a final JSON summary; exits 1 if the loss did not fall.
)";

struct Config {
  int64_t steps = 5000;
  int64_t seed = 0;
  double lr = 0.03;
  int64_t hidden = 32;
  int64_t samples = 256;
  double noise = 0.1;
  int64_t log_every = 500;
  std::string device = "cpu";
};

// Returns false for --help.
bool parse(int argc, char** argv, Config& c) {
  cf::apps::Options o(kUsage);
  o.add_int("steps", &c.steps, 1, "training steps");
  o.add_int("seed", &c.seed, 0, "seed for data and initial weights");
  o.add_number("lr", &c.lr, "learning rate");
  o.add_int("hidden", &c.hidden, 1, "hidden units");
  o.add_int("samples", &c.samples, 1, "training points");
  o.add_number("noise", &c.noise, "std of the label noise");
  o.add_int("log_every", &c.log_every, 1, "steps between loss lines");
  o.add_string("device", &c.device, "cpu only (the demo is a hand-written SGD loop on host data)");
  if (!o.parse(argc, argv)) return false;
  if (c.lr <= 0) throw UsageError("lr must be positive");
  if (c.noise < 0) throw UsageError("--noise must be non-negative, got " + cf::str(c.noise));
  return true;
}

// The app once its command line is read: its exit status.
int run(const Config& cfg) {
  const double pi = 3.14159265358979323846;
  cf::Generator gen(uint64_t(cfg.seed));
  const int64_t N = cfg.samples, H = cfg.hidden;

  // Data: x uniform in [-pi, pi], y = sin(x) + noise.
  cf::Tensor x = cf::rand({N, 1}, cf::kFloat32, gen, -pi, pi);
  cf::Tensor y = cf::add(cf::sin(x), cf::randn({N, 1}, cf::kFloat32, gen, 0.0, cfg.noise));

  // Parameters (Xavier-like scales).
  cf::Tensor W1 = cf::randn({1, H}, cf::kFloat32, gen, 0.0, 1.0);
  cf::Tensor b1 = cf::Tensor::zeros({H});
  cf::Tensor W2 = cf::randn({H, 1}, cf::kFloat32, gen, 0.0, 1.0 / std::sqrt(double(H)));
  cf::Tensor b2 = cf::Tensor::zeros({1});
  std::vector<cf::Tensor*> params = {&W1, &b1, &W2, &b2};
  for (cf::Tensor* p : params) p->set_requires_grad(true);

  auto forward = [&](const cf::Tensor& in) {
    cf::Tensor h = cf::tanh(cf::add(cf::matmul(in, W1), b1));
    return cf::add(cf::matmul(h, W2), b2);
  };

  std::cout << json{{"event", "start"}, {"task", "noisy sine regression"},
                    {"model", "mlp 1-" + std::to_string(H) + "-1 tanh"},
                    {"samples", N}, {"steps", cfg.steps}, {"lr", cfg.lr},
                    {"seed", cfg.seed}, {"device", cfg.device}}
                   .dump()
            << std::endl;

  auto t0 = std::chrono::steady_clock::now();
  double first_loss = 0, last_loss = 0;
  for (int64_t step = 0; step < cfg.steps; ++step) {
    cf::Tensor loss = cf::mean(cf::square(cf::sub(forward(x), y)));
    loss.backward();
    last_loss = loss.item();
    if (step == 0) first_loss = last_loss;
    {
      cf::NoGradGuard no_grad;
      for (cf::Tensor* p : params) {
        cf::add_(*p, p->grad(), -cfg.lr);
        p->zero_grad();
      }
    }
    if (step % cfg.log_every == 0 || step == cfg.steps - 1) {
      double el = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::cout << json{{"event", "train"}, {"step", step}, {"loss", last_loss},
                        {"elapsed_s", el}}
                       .dump()
                << std::endl;
    }
  }
  double train_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  // Evaluate on a clean grid: how close is the fit to sin(x)?
  cf::Tensor grid = cf::reshape(cf::to(cf::Tensor::arange(201, cf::kInt64), cf::kFloat32), {201, 1});
  grid = cf::sub(cf::mul(grid, 2 * pi / 200.0), pi);
  double clean_mse;
  {
    cf::NoGradGuard no_grad;
    clean_mse = cf::mean(cf::square(cf::sub(forward(grid), cf::sin(grid)))).item();
  }
  bool learned = last_loss < 0.5 * first_loss;
  std::cout << json{{"event", "summary"}, {"steps", cfg.steps}, {"initial_loss", first_loss},
                    {"final_loss", last_loss}, {"loss_ratio", last_loss / first_loss},
                    {"clean_mse_vs_sin", clean_mse},
                    {"noise_floor_mse", cfg.noise * cfg.noise}, {"train_time_s", train_s},
                    {"ms_per_step", 1e3 * train_s / double(cfg.steps)},
                    {"peak_bytes", cf::memory_stats().peak_bytes}, {"learned", learned}}
                   .dump()
            << std::endl;
  if (!learned)  // the exit status says so; the reason goes where a failure's reason goes
    std::cerr << "cf-demo: the loss did not fall below half its first value in " << cfg.steps
              << " steps (final/initial " << last_loss / first_loss << ")\n";
  return learned ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  Config cfg;
  return cf::apps::app_main(
      "cf-demo",
      [&] {
        if (!parse(argc, argv, cfg)) return false;
        cf::Device dev = cf::apps::parse_device(cfg.device);
        if (!dev.is_cpu()) throw UsageError("the demo runs on the CPU only (it is a hand-written SGD loop on host data)");
        return true;
      },
      [&] { return run(cfg); });
}
