#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "nn/checkpoint.h"
#include "nn/optim/adam.h"
#include "nn/optim/sgd.h"
#include "nn/train/early_stopping.h"
#include "nn/train/loop.h"
#include "nn/train/metrics.h"
#include "nn/train/progress.h"
#include "test_files.h"
#include "test_util.h"

using namespace cf;
using namespace cf::test;

namespace {

const double kNaN = std::numeric_limits<double>::quiet_NaN();
const double kInf = std::numeric_limits<double>::infinity();

std::vector<std::string> lines_of(const std::string& s) {
  std::vector<std::string> out;
  std::istringstream is(s);
  for (std::string line; std::getline(is, line);) out.push_back(line);
  return out;
}

size_t count_char(const std::string& s, char c) { return size_t(std::count(s.begin(), s.end(), c)); }

// A bar writing to `out` with a fake clock reading `*now`.
nn::ProgressBarOptions fake_bar(std::ostringstream& out, double* now, bool tty, int64_t total) {
  nn::ProgressBarOptions o;
  o.out = &out;
  o.is_tty = tty;
  o.total = total;
  o.clock = [now] { return *now; };
  return o;
}

// y = 2x + 1 on 4 points, float64.
struct LineData {
  Tensor x = t64({-1.0, -0.5, 0.5, 1.0}, {4, 1});
  Tensor y = t64({-1.0, 0.0, 2.0, 3.0}, {4, 1});
};

std::shared_ptr<nn::Linear> line_model(uint64_t seed = 7) {
  Generator g(seed);
  auto m = std::make_shared<nn::Linear>(1, 1, true, g);
  m->to(kFloat64);
  return m;
}

std::vector<double> param_values(const nn::Module& m) {
  std::vector<double> out;
  for (const Tensor& p : m.parameters())
    for (double v : values(p)) out.push_back(v);
  return out;
}

}  // namespace

// ---------------------------------------------------------------- ProgressBar

TEST_CASE("train: ProgressBar renders count, elapsed, ETA, rate and fields") {
  std::ostringstream out;
  double now = 100.0;
  nn::ProgressBar bar(fake_bar(out, &now, true, 100));
  CHECK(bar.render() == "0/100 [00:00<?, ? it/s]");
  now = 103.08;  // 12 steps in 3.08 s: 3.896 it/s, 88 left -> 22.6 s
  bar.set_field("loss", 0.512);
  bar.update(12);
  CHECK(bar.render() == "12/100 [00:03<00:22, 3.9 it/s] loss=0.512");
  CHECK(out.str() == "\r12/100 [00:03<00:22, 3.9 it/s] loss=0.512");
  bar.set_field("loss", 0.25);  // replaced in place, order kept
  bar.set_field("lr", 1e-4);
  CHECK(bar.render() == "12/100 [00:03<00:22, 3.9 it/s] loss=0.25 lr=0.0001");

  // Slow loops show seconds per unit; long runs show hours.
  std::ostringstream out2;
  double t2 = 0;
  nn::ProgressBarOptions o2 = fake_bar(out2, &t2, true, 10);
  o2.desc = "eval";
  o2.unit = "batch";
  nn::ProgressBar slow(o2);
  t2 = 5.0;
  slow.update(2);
  CHECK(slow.render() == "eval: 2/10 [00:05<00:20, 2.50 s/batch]");
  t2 = 3725.0;
  slow.set_count(10);
  CHECK(slow.render() == "eval: 10/10 [1:02:05<00:00, 372.50 s/batch]");

  // Unknown total: no ETA. Fast loops: whole units.
  std::ostringstream out3;
  double t3 = 0;
  nn::ProgressBar open(fake_bar(out3, &t3, true, -1));
  t3 = 2.0;
  open.update(5);
  CHECK(open.render() == "5 [00:02, 2.5 it/s]");
  open.update(995);
  CHECK(open.render() == "1000 [00:02, 500 it/s]");

  CHECK(nn::ProgressBar::format_time(59.9) == "00:59");
  CHECK(nn::ProgressBar::format_time(600) == "10:00");
  CHECK(nn::ProgressBar::format_time(kNaN) == "?");
  CHECK(nn::ProgressBar::format_time(-1) == "?");
}

TEST_CASE("train: ProgressBar on a terminal redraws at most every min_interval, pads, ends with newline") {
  std::ostringstream out;
  double now = 0;
  nn::ProgressBar bar(fake_bar(out, &now, true, 100));
  for (int i = 0; i < 99; ++i) {  // 1 s of steps, 10 ms apart
    now += 0.01;
    bar.update();
  }
  size_t draws = count_char(out.str(), '\r');
  CHECK(draws >= 9);
  CHECK(draws <= 11);
  now += 0.001;
  bar.update();  // reaching the total always draws
  CHECK(count_char(out.str(), '\r') == draws + 1);
  bar.finish();
  bar.finish();  // once only
  std::string s = out.str();
  CHECK(count_char(s, '\n') == 1);
  CHECK(s.back() == '\n');
  CHECK(s.find("100/100 [00:00<00:00, 101 it/s]\n") != std::string::npos);

  // A shorter line is padded over the longer one it replaces.
  std::ostringstream o2;
  double t = 0;
  nn::ProgressBarOptions po = fake_bar(o2, &t, true, -1);
  po.min_interval = 0;
  nn::ProgressBar b2(po);
  b2.set_field("loss", 123.456);
  b2.update();
  b2.set_field("loss", 1);
  b2.update();
  CHECK(o2.str() == "\r1 [00:00, ? it/s] loss=123.5\r2 [00:00, ? it/s] loss=1    ");

  // The initial count (a resumed run) shows but does not count towards the rate.
  std::ostringstream o3;
  double t3 = 0;
  nn::ProgressBarOptions po3 = fake_bar(o3, &t3, true, 100);
  po3.initial = 50;
  nn::ProgressBar b3(po3);
  t3 = 10;
  b3.update(10);
  CHECK(b3.render() == "60/100 [00:10<00:40, 1.0 it/s]");
}

TEST_CASE("train: ProgressBar is quiet when not a terminal") {
  std::ostringstream out;
  double now = 0;
  {
    nn::ProgressBar bar(fake_bar(out, &now, false, 50));
    CHECK_FALSE(bar.is_tty());
    for (int i = 0; i < 50; ++i) {
      now += 1;
      bar.set_field("loss", 1.0 / (i + 1));
      bar.update();
    }
    bar.finish();
  }  // and the destructor adds nothing
  CHECK(out.str().empty());

  // With summary_if_not_tty: exactly one line, at finish (here from the destructor).
  std::ostringstream out2;
  {
    nn::ProgressBarOptions o = fake_bar(out2, &now, false, 4);
    o.summary_if_not_tty = true;
    o.desc = "train";
    nn::ProgressBar bar(o);
    now += 2;
    bar.update(4);
    CHECK(out2.str().empty());
  }
  CHECK(out2.str() == "train: 4/4 [00:02<00:00, 2.0 it/s]\n");

  // Any stream other than std::cerr / std::cout is not a terminal by default.
  std::ostringstream out3;
  nn::ProgressBarOptions o3;
  o3.out = &out3;
  nn::ProgressBar def(o3);
  CHECK_FALSE(def.is_tty());
  def.update(3);
  def.finish();
  CHECK(out3.str().empty());
}

TEST_CASE("train: ProgressBar rejects bad arguments") {
  nn::ProgressBarOptions o;
  o.total = -2;
  CHECK_THROWS_MSG(nn::ProgressBar{o}, ValueError, "[ProgressBar]", "total", "-2");
  o.total = 5;
  o.initial = 6;
  CHECK_THROWS_MSG(nn::ProgressBar{o}, ValueError, "[ProgressBar] initial 6 exceeds total 5");
  o.initial = 0;
  o.min_interval = kNaN;
  CHECK_THROWS_MSG(nn::ProgressBar{o}, ValueError, "[ProgressBar] min_interval");
  std::ostringstream out;
  o.min_interval = 0.1;
  o.out = &out;
  nn::ProgressBar bar(o);
  CHECK_THROWS_MSG(bar.update(-1), ValueError, "[ProgressBar.update] n must be >= 0, got -1");
}

// ---------------------------------------------------------------- MetricsWriter

TEST_CASE("train: MetricsWriter writes JSON lines in order, non-finite as null") {
  std::ostringstream out;
  nn::MetricsWriter w(out);
  w.log(10, "train", {{"loss", 0.5}, {"lr", 1e-3}});
  w.log(10, "val", {{"loss", kNaN}, {"acc", kInf}, {"neg", -kInf}});
  nlohmann::ordered_json rec;
  rec["step"] = 11;
  rec["nested"] = {{"a", kNaN}, {"b", 2.5}};
  rec["list"] = {1.0, kNaN};
  w.write(rec);
  CHECK(w.lines_written() == 3);

  std::vector<std::string> lines = lines_of(out.str());
  REQUIRE(lines.size() == 3);
  CHECK(lines[0] == R"({"step":10,"split":"train","loss":0.5,"lr":0.001})");
  CHECK(lines[1] == R"({"step":10,"split":"val","loss":null,"acc":null,"neg":null})");
  auto j0 = nlohmann::json::parse(lines[0]);
  CHECK(j0["step"].get<int64_t>() == 10);
  CHECK(j0["split"] == "train");
  CHECK(j0["loss"].get<double>() == 0.5);
  auto j1 = nlohmann::json::parse(lines[1]);
  CHECK(j1["loss"].is_null());
  CHECK(j1["acc"].is_null());
  auto j2 = nlohmann::json::parse(lines[2]);
  CHECK(j2["nested"]["a"].is_null());
  CHECK(j2["nested"]["b"].get<double>() == 2.5);
  CHECK(j2["list"][1].is_null());

  CHECK_THROWS_MSG(w.log(1, "train", {{"step", 1.0}}), ValueError, "[MetricsWriter.log]", "'step' is reserved");
  CHECK_THROWS_MSG(w.log(1, "train", {{"a", 1.0}, {"a", 2.0}}), ValueError, "'a' given twice");
  CHECK_THROWS_MSG(w.write(nlohmann::ordered_json::array()), ValueError, "[MetricsWriter.write]", "array");
  CHECK(w.lines_written() == 3);
}

TEST_CASE("train: MetricsWriter files append or truncate, flush each line, name the file on error") {
  cf::test::TempDir tmp;
  std::string path = tmp.file("metrics.jsonl");
  {
    nn::MetricsWriter w(path, nn::MetricsWriter::Mode::Truncate);
    w.log(1, "train", {{"loss", 1.0}});
    // Flushed already: a reader sees the whole line while the writer is open.
    std::ifstream in(path);
    std::string line;
    REQUIRE(std::getline(in, line));
    CHECK(line == R"({"step":1,"split":"train","loss":1.0})");
  }
  {
    nn::MetricsWriter w(path);  // append
    w.log(2, "train", {{"loss", 0.5}});
  }
  {
    std::ifstream in(path);
    std::stringstream ss;
    ss << in.rdbuf();
    std::vector<std::string> lines = lines_of(ss.str());
    REQUIRE(lines.size() == 2);
    CHECK(nlohmann::json::parse(lines[1])["step"] == 2);
  }
  {
    nn::MetricsWriter w(path, nn::MetricsWriter::Mode::Truncate);
    w.log(3, "val", {{"loss", 0.25}});
    CHECK(w.path() == path);
  }
  {
    std::ifstream in(path);
    std::stringstream ss;
    ss << in.rdbuf();
    CHECK(lines_of(ss.str()).size() == 1);
  }
  std::string bad = tmp.file("no_such_dir/metrics.jsonl");
  CHECK_THROWS_MSG(nn::MetricsWriter{bad}, IOError, "[MetricsWriter] cannot open", bad.c_str());
}

// ---------------------------------------------------------------- EarlyStopping

TEST_CASE("train: EarlyStopping in min mode with patience and min_delta - NaN never improves") {
  nn::EarlyStopping es({"min", 2, 0.1});
  CHECK_FALSE(es.has_best());
  CHECK(es.update(1.0, 10));       // first value: best
  CHECK_FALSE(es.should_stop());
  CHECK_FALSE(es.update(0.95, 20));  // better, but by less than min_delta
  CHECK(es.num_bad() == 1);
  CHECK(es.update(0.8, 30));       // best, resets the count
  CHECK(es.num_bad() == 0);
  CHECK_FALSE(es.update(0.85, 40));
  CHECK_FALSE(es.should_stop());
  CHECK_FALSE(es.update(kNaN, 50));
  CHECK(es.should_stop());
  CHECK(es.best() == 0.8);
  CHECK(es.best_step() == 30);
  CHECK(es.num_evals() == 5);

  // NaN first is not a best either; the step defaults to the evaluation index.
  nn::EarlyStopping es2({"min", 3, 0.0});
  CHECK_FALSE(es2.update(kNaN));
  CHECK_FALSE(es2.has_best());
  CHECK(es2.update(5.0));
  CHECK(es2.best_step() == 2);
  CHECK_FALSE(es2.update(5.0));  // equal is not better
}

TEST_CASE("train: EarlyStopping in max mode - patience 0 stops at the first non-improvement") {
  nn::EarlyStopping es({"max", 0, 0.0});
  CHECK(es.maximize());
  CHECK(es.update(0.5, 1));
  CHECK_FALSE(es.should_stop());
  CHECK(es.update(0.7, 2));
  CHECK_FALSE(es.should_stop());
  CHECK_FALSE(es.update(0.6, 3));
  CHECK(es.should_stop());
  CHECK(es.best() == 0.7);

  nn::EarlyStopping es2({"max", 1, 0.05});
  CHECK(es2.update(0.5));
  CHECK_FALSE(es2.update(0.54));  // within min_delta
  CHECK(es2.should_stop());
  CHECK(es2.is_improvement(0.56));
}

TEST_CASE("train: EarlyStopping state round-trips and resumes identically") {
  nn::EarlyStoppingOptions o{"min", 3, 0.0};
  std::vector<double> seq{3.0, 2.0, 2.5, kNaN, 1.5, 1.6, 1.7, 1.8, 1.9};
  nn::EarlyStopping full(o);
  for (size_t i = 0; i < seq.size(); ++i) full.update(seq[i], int64_t(i));

  nn::EarlyStopping first(o);
  for (size_t i = 0; i < 4; ++i) first.update(seq[i], int64_t(i));
  nn::StateDict sd = first.state_dict();
  REQUIRE(sd.size() == 4);
  CHECK(sd[0].first == "best");
  CHECK(sd[1].second.dtype() == kInt64);
  nn::EarlyStopping resumed(o);
  resumed.load_state_dict(sd);
  CHECK(resumed.state() == first.state());
  for (size_t i = 4; i < seq.size(); ++i) resumed.update(seq[i], int64_t(i));
  CHECK(resumed.state() == full.state());
  CHECK(resumed.should_stop() == full.should_stop());
  CHECK(full.should_stop());
  CHECK(full.best_step() == 4);

  // A fresh instance (no best yet) round-trips its NaN best.
  nn::EarlyStopping fresh(o);
  nn::EarlyStopping fresh2(o);
  fresh2.update(1.0);
  fresh2.load_state_dict(fresh.state_dict());
  CHECK_FALSE(fresh2.has_best());
  CHECK(fresh2.num_evals() == 0);

  nn::StateDict broken = sd;
  broken.erase(broken.begin() + 2);
  broken.emplace_back("extra", Tensor::scalar(1.0, kInt64));
  CHECK_THROWS_MSG(resumed.load_state_dict(broken), ValueError, "[EarlyStopping.load_state_dict]",
                   "unexpected entry 'extra'", "missing entry 'num_bad'");
  nn::StateDict wrong = sd;
  wrong[3].second = Tensor::zeros({2}, kInt64);
  CHECK_THROWS_MSG(resumed.load_state_dict(wrong), ValueError, "'num_evals' must be a 0-d");
  CHECK(resumed.state() == full.state());  // unchanged by the failed loads
}

TEST_CASE("train: EarlyStopping without a best goes into a checkpoint, and train_loop resumes its best") {
  // (from a bug hunt) "best" was NaN until the first finite evaluation, which the checkpoint writer refuses
  // as a diverged run: no checkpoint could hold the state before then
  nn::EarlyStopping fresh(nn::EarlyStoppingOptions{"min", 3, 0.0});
  fresh.update(kNaN, 1);
  TempDir dir;
  nn::TrainingCheckpoint ck;
  ck.model = {{"w", Tensor::zeros({1})}};
  for (auto& [name, t] : fresh.state_dict()) ck.optimizer.emplace_back("early_stopping." + name, t);
  nn::save_checkpoint(dir.file("es.ckpt"), ck);
  nn::StateDict back;
  for (auto& [name, t] : nn::load_checkpoint(dir.file("es.ckpt")).optimizer)
    back.emplace_back(name.substr(std::string("early_stopping.").size()), t);
  nn::EarlyStopping resumed(nn::EarlyStoppingOptions{"min", 3, 0.0});
  resumed.load_state_dict(back);
  CHECK(resumed.state() == fresh.state());
  CHECK_FALSE(resumed.has_best());
  nn::StateDict old_style = back;  // a state saved before holds NaN: still read
  old_style[0].second = Tensor::scalar(kNaN, kFloat64);
  resumed.load_state_dict(old_style);
  CHECK(resumed.state() == fresh.state());

  // train_loop without an EarlyStopping: a resumed run took its first evaluation as the best, however bad
  // (metrics 1, 5, 6, 7: the best stays 1 at step 1, with or without a resume at step 2)
  const std::vector<double> metrics{1, 5, 6, 7};
  auto w = Tensor::from_vector(std::vector<float>{1.f}, {1}).set_requires_grad(true);
  nn::SGD opt({{"w", w}}, {0.0});
  auto run = [&](int64_t start, int64_t end, double best, int64_t best_step, std::vector<bool>& is_best) {
    nn::TrainLoopOptions o;
    o.start_step = start;
    o.max_steps = end;
    o.eval_every = 1;
    o.progress = false;
    o.best_metric = best;
    o.best_step = best_step;
    nn::TrainLoopHooks h;
    h.evaluate = [&, step = start]() mutable { return metrics[size_t(step++)]; };
    h.on_step_end = [&](const nn::TrainStepInfo& i) { is_best.push_back(i.is_best); };
    return nn::train_loop(opt, [&](int64_t, int64_t) { return sum(w * w); }, o, h);
  };
  std::vector<bool> once, first, second;
  const nn::TrainLoopResult r = run(0, 4, kNaN, -1, once);
  CHECK(r.best_metric == 1);
  CHECK(r.best_step == 1);
  const nn::TrainLoopResult r1 = run(0, 2, kNaN, -1, first);
  const nn::TrainLoopResult r2 = run(2, 4, r1.best_metric, r1.best_step, second);
  CHECK(r2.best_metric == 1);
  CHECK(r2.best_step == 1);
  first.insert(first.end(), second.begin(), second.end());
  CHECK(first == once);
  nn::TrainLoopOptions bad;
  bad.max_steps = 4;
  bad.start_step = 2;
  bad.best_metric = 1.0;
  bad.best_step = 3;
  CHECK_THROWS_MSG(nn::train_loop(opt, [&](int64_t, int64_t) { return sum(w * w); }, bad), ValueError,
                   "[train_loop] best_step 3 does not fit best_metric 1", "start_step 2");
}

TEST_CASE("train: MetricsWriter writes a name that is not UTF-8 with U+FFFD, whole lines") {
  // (nlohmann's dump threw a type_error naming nothing, after the run's training was done)
  std::ostringstream out;
  nn::MetricsWriter w(out);
  w.log(1, "tr\xff", {{"lo\xc3", 1.5}});
  CHECK(out.str() == "{\"step\":1,\"split\":\"tr\xef\xbf\xbd\",\"lo\xef\xbf\xbd\":1.5}\n");
}

TEST_CASE("train: EarlyStopping rejects bad options") {
  CHECK_THROWS_MSG(nn::EarlyStopping({"mid", 1, 0.0}), ValueError, "[EarlyStopping] mode must be",
                   "\"mid\"");
  CHECK_THROWS_MSG(nn::EarlyStopping({"min", -1, 0.0}), ValueError, "[EarlyStopping] patience must be >= 0, got -1");
  CHECK_THROWS_MSG(nn::EarlyStopping({"max", 1, -0.5}), ValueError, "[EarlyStopping] min_delta", "-0.5");
  CHECK_THROWS_MSG(nn::EarlyStopping({"max", 1, kNaN}), ValueError, "[EarlyStopping] min_delta");
}

// ---------------------------------------------------------------- train_loop

TEST_CASE("train: train_loop fits y = 2x + 1 with SGD, logs metrics, switches eval mode") {
  LineData d;
  auto model = line_model();
  nn::SGD opt(model->named_parameters(), {0.2});
  auto mse = [&] { return nn::mse_loss(model->forward(d.x), d.y); };
  const double initial = mse().item();

  std::ostringstream metrics_out, bar_out;
  nn::MetricsWriter metrics(metrics_out);
  double now = 0;
  nn::ProgressBarOptions po = fake_bar(bar_out, &now, true, 60);
  po.min_interval = 0;
  nn::ProgressBar bar(po);
  int evals = 0;
  nn::TrainLoopHooks hooks;
  hooks.model = model.get();
  hooks.metrics = &metrics;
  hooks.progress = &bar;
  std::vector<int64_t> seen_steps, updated_steps;
  int64_t optimizer_steps_at_eval = -1;
  hooks.evaluate = [&] {
    CHECK_FALSE(model->is_training());
    CHECK_FALSE(grad_enabled());
    ++evals;
    // the step being evaluated has had its after_update
    CHECK(updated_steps.size() == seen_steps.size() + 1);
    optimizer_steps_at_eval = updated_steps.back();
    return mse().item();
  };
  // after_update: after the step's optimizer step, in train mode, before its evaluation and on_step_end
  // (a memory bank re-clustered after the evaluation gave val lines one re-clustering behind the model).
  hooks.after_update = [&](int64_t step) {
    CHECK(model->is_training());
    CHECK(opt.step_count() == step);
    CHECK(int64_t(seen_steps.size()) == step - 1);
    updated_steps.push_back(step);
  };
  hooks.on_step_end = [&](const nn::TrainStepInfo& info) {
    seen_steps.push_back(info.step);
    CHECK(updated_steps.back() == info.step);
    CHECK(info.evaluated == (info.step % 20 == 0));
    if (info.evaluated) CHECK(optimizer_steps_at_eval == info.step);
    CHECK(info.lr == 0.2);
  };
  nn::TrainLoopOptions o;
  o.max_steps = 60;
  o.eval_every = 20;
  o.log_every = 10;
  nn::TrainLoopResult r = nn::train_loop(
      opt,
      [&](int64_t, int64_t) {
        CHECK(model->is_training());
        now += 0.01;
        return mse();
      },
      o, hooks);

  CHECK(r.steps_run == 60);
  CHECK(r.last_step == 60);
  CHECK(opt.step_count() == 60);
  CHECK(r.evaluations == 3);
  CHECK(evals == 3);
  CHECK(r.last_loss < initial * 1e-3);
  CHECK(r.best_metric == r.last_metric);  // falling all the way
  CHECK(r.best_step == 60);
  CHECK_FALSE(r.stopped_early);
  CHECK(model->is_training());
  check_close(model->weight, {2.0}, 1e-2);
  check_close(model->bias, {1.0}, 1e-2);
  CHECK(seen_steps.size() == 60);
  CHECK(updated_steps.size() == 60);

  std::vector<std::string> lines = lines_of(metrics_out.str());
  REQUIRE(lines.size() == 6 + 3);
  auto first = nlohmann::json::parse(lines[0]);
  CHECK(first["step"] == 10);
  CHECK(first["split"] == "train");
  CHECK(first["lr"].get<double>() == 0.2);
  CHECK(first["loss"].get<double>() < initial);
  CHECK(first["loss_steps"] == 10);  // the steps the mean is over (fewer after a resume)
  int vals = 0;
  for (const auto& l : lines) vals += nlohmann::json::parse(l)["split"] == "val";
  CHECK(vals == 3);
  CHECK(bar.finished());
  CHECK(bar_out.str().find("60/60 [") != std::string::npos);
  CHECK(bar.render().find(" loss=") != std::string::npos);
  CHECK(bar.render().find(" val_loss=") != std::string::npos);
}

TEST_CASE("train: train_loop grad_accum=2 matches the same data in one batch") {
  LineData d;
  for (double clip : {0.0, 0.5}) {
    INFO("clip_norm ", clip);
    auto a = line_model(3);
    auto b = line_model(3);
    nn::SGD opt_a(a->named_parameters(), {0.1, 0.9});
    nn::SGD opt_b(b->named_parameters(), {0.1, 0.9});
    nn::TrainLoopOptions o;
    o.max_steps = 6;
    o.progress = false;
    o.clip_norm = clip;
    o.grad_accum = 2;
    std::vector<double> losses_a, losses_b;
    nn::TrainLoopHooks ha, hb;
    ha.on_step_end = [&](const nn::TrainStepInfo& i) { losses_a.push_back(i.loss); };
    hb.on_step_end = [&](const nn::TrainStepInfo& i) { losses_b.push_back(i.loss); };
    nn::train_loop(
        opt_a,
        [&](int64_t, int64_t micro) {
          return nn::mse_loss(a->forward(narrow(d.x, 0, 2 * micro, 2)), narrow(d.y, 0, 2 * micro, 2));
        },
        o, ha);
    o.grad_accum = 1;
    nn::train_loop(opt_b, [&](int64_t, int64_t) { return nn::mse_loss(b->forward(d.x), d.y); }, o, hb);
    std::vector<double> pa = param_values(*a), pb = param_values(*b);
    REQUIRE(pa.size() == pb.size());
    for (size_t i = 0; i < pa.size(); ++i) CHECK(std::fabs(pa[i] - pb[i]) <= 1e-12);
    REQUIRE(losses_a.size() == losses_b.size());
    for (size_t i = 0; i < losses_a.size(); ++i) CHECK(std::fabs(losses_a[i] - losses_b[i]) <= 1e-12);
  }
}

TEST_CASE("train: train_loop stops early and a resumed run continues identically") {
  // Early stopping: the metric improves for 3 evaluations, then gets worse.
  {
    LineData d;
    auto model = line_model();
    nn::SGD opt(model->named_parameters(), {0.05});
    nn::EarlyStopping es({"min", 2, 0.0});
    std::vector<double> metric{5, 4, 3, 3.5, 3.6, 3.7, 3.8, 3.9, 4.0, 4.1};
    int64_t evals = 0;
    nn::TrainLoopHooks h;
    h.evaluate = [&] { return metric[size_t(evals++)]; };
    h.early_stopping = &es;
    nn::TrainLoopOptions o;
    o.max_steps = 10;
    o.eval_every = 1;
    o.progress = false;
    nn::TrainLoopResult r =
        nn::train_loop(opt, [&](int64_t, int64_t) { return nn::mse_loss(model->forward(d.x), d.y); }, o, h);
    CHECK(r.stopped_early);
    CHECK(r.steps_run == 5);
    CHECK(r.last_step == 5);
    CHECK(r.evaluations == 5);
    CHECK(r.best_metric == 3.0);
    CHECK(r.best_step == 3);
    CHECK(es.best_step() == 3);
    // A resume from the checkpoint of that last step (its EarlyStopping already stopped) takes no further
    // step, as the uninterrupted run took none (it took up to the next evaluation before).
    nn::EarlyStopping resumed({"min", 2, 0.0});
    resumed.load_state_dict(es.state_dict());
    h.early_stopping = &resumed;
    o.start_step = 5;
    const std::vector<double> w_before = values(model->parameters()[0]);
    nn::TrainLoopResult again =
        nn::train_loop(opt, [&](int64_t, int64_t) { return nn::mse_loss(model->forward(d.x), d.y); }, o, h);
    CHECK(again.stopped_early);
    CHECK(again.steps_run == 0);
    CHECK(again.last_step == 5);
    CHECK(values(model->parameters()[0]) == w_before);
  }

  // Resume: 4 steps, state saved, fresh objects restored, 4 more == 8 in one go
  // (Adam state, schedule via the optimizer's step count, early stopping counters).
  LineData d;
  auto run = [&](nn::Module& m, nn::Optimizer& opt, nn::EarlyStopping& es, int64_t start, int64_t end,
                 std::vector<double>& lrs) {
    nn::WarmupCosineLR sched(0.1, 2, 8, 0.01);
    nn::TrainLoopHooks h;
    h.schedule = &sched;
    h.early_stopping = &es;
    h.model = &m;
    h.evaluate = [&] { return nn::mse_loss(static_cast<nn::Linear&>(m).forward(d.x), d.y).item(); };
    h.on_step_end = [&](const nn::TrainStepInfo& i) { lrs.push_back(i.lr); };
    nn::TrainLoopOptions o;
    o.start_step = start;
    o.max_steps = end;
    o.eval_every = 2;
    o.clip_norm = 1.0;
    o.progress = false;
    return nn::train_loop(
        opt,
        [&](int64_t step, int64_t) {
          // Data depends on the step: the first half or all of it.
          Tensor x = step % 2 ? narrow(d.x, 0, 0, 2) : d.x;
          Tensor y = step % 2 ? narrow(d.y, 0, 0, 2) : d.y;
          return nn::mse_loss(static_cast<nn::Linear&>(m).forward(x), y);
        },
        o, h);
  };
  nn::EarlyStoppingOptions eo{"min", 100, 0.0};
  auto full = line_model(11);
  nn::Adam opt_full(full->named_parameters(), {0.1});
  nn::EarlyStopping es_full(eo);
  std::vector<double> lrs_full;
  nn::TrainLoopResult rf = run(*full, opt_full, es_full, 0, 8, lrs_full);
  CHECK(rf.steps_run == 8);

  auto part = line_model(11);
  nn::Adam opt_part(part->named_parameters(), {0.1});
  nn::EarlyStopping es_part(eo);
  std::vector<double> lrs_resumed;
  run(*part, opt_part, es_part, 0, 4, lrs_resumed);
  auto resumed = line_model(99);
  nn::Adam opt_resumed(resumed->named_parameters(), {0.1});
  nn::EarlyStopping es_resumed(eo);
  resumed->load_state_dict(part->state_dict());
  opt_resumed.load_state_dict(opt_part.state_dict());
  es_resumed.load_state_dict(es_part.state_dict());
  nn::TrainLoopResult rr = run(*resumed, opt_resumed, es_resumed, 4, 8, lrs_resumed);
  CHECK(rr.steps_run == 4);
  CHECK(rr.last_step == 8);
  CHECK(param_values(*resumed) == param_values(*full));  // bit-identical
  CHECK(lrs_resumed == lrs_full);
  CHECK(es_resumed.state() == es_full.state());
  CHECK(rr.best_metric == rf.best_metric);
  CHECK(rr.best_step == rf.best_step);
  CHECK(rr.last_loss == rf.last_loss);
}

TEST_CASE("train: train_loop rejects bad options and bad losses, naming the step") {
  LineData d;
  auto model = line_model();
  nn::SGD opt(model->named_parameters(), {0.1});
  auto good = [&](int64_t, int64_t) { return nn::mse_loss(model->forward(d.x), d.y); };
  nn::TrainLoopOptions o;
  o.progress = false;
  o.max_steps = -1;
  CHECK_THROWS_MSG(nn::train_loop(opt, good, o), ValueError, "[train_loop] max_steps must be >= 0, got -1");
  o.max_steps = 5;
  o.grad_accum = 0;
  CHECK_THROWS_MSG(nn::train_loop(opt, good, o), ValueError, "[train_loop] grad_accum must be >= 1, got 0");
  o.grad_accum = 1;
  o.start_step = 6;
  CHECK_THROWS_MSG(nn::train_loop(opt, good, o), ValueError, "[train_loop] start_step 6 is beyond max_steps 5");
  o.start_step = 0;
  o.clip_norm = -1;
  CHECK_THROWS_MSG(nn::train_loop(opt, good, o), ValueError, "[train_loop] clip_norm");
  o.clip_norm = 0;
  o.eval_every = -2;
  CHECK_THROWS_MSG(nn::train_loop(opt, good, o), ValueError, "[train_loop] eval_every", "-2");
  o.eval_every = 0;
  o.metric_mode = "best";
  CHECK_THROWS_MSG(nn::train_loop(opt, good, o), ValueError, "[train_loop] metric_mode", "\"best\"");
  o.metric_mode = "min";
  CHECK_THROWS_MSG(nn::train_loop(opt, nn::TrainStepFn(), o), ValueError, "[train_loop] train_step_loss is empty");
  CHECK(opt.step_count() == 0);

  // A NaN loss at step 3 (micro-batch 1): two steps ran, then a clear error.
  o.grad_accum = 2;
  auto nan_at_3 = [&](int64_t step, int64_t micro) {
    Tensor l = nn::mse_loss(model->forward(d.x), d.y);
    return step == 3 && micro == 1 ? l * kNaN : l;
  };
  CHECK_THROWS_MSG(nn::train_loop(opt, nan_at_3, o), ValueError,
                   "[train_loop] step 3, micro-batch 1: non-finite loss nan");
  CHECK(opt.step_count() == 2);
  o.grad_accum = 1;
  o.start_step = 2;
  CHECK_THROWS_MSG(nn::train_loop(opt, [&](int64_t, int64_t) { return nn::mse_loss(model->forward(d.x), d.y).detach(); }, o),
                   ValueError, "[train_loop] step 3, micro-batch 0", "does not require grad");
  CHECK_THROWS_MSG(nn::train_loop(opt, [&](int64_t, int64_t) { return model->forward(d.x); }, o), ValueError,
                   "[train_loop] step 3", "one-element floating tensor");
  // An exception from evaluate leaves the model in train mode.
  nn::TrainLoopHooks h;
  h.model = model.get();
  h.evaluate = []() -> double { throw IOError("[eval] boom"); };
  CHECK_THROWS_MSG(nn::train_loop(opt, good, o, h), IOError, "[eval] boom");
  CHECK(model->is_training());
}

TEST_CASE("train: train_loop's load_batch writes each micro-batch before train_step_loss reads it") {
  // The same data through load_batch (copy_ into inputs kept across steps, as a CUDA graph needs) and
  // through train_step_loss picking it itself: the same parameters, bit for bit.
  LineData d;
  auto pick = [&](int64_t step, int64_t micro) {  // the micro-batch: 2 of the 4 points, rotating
    const int64_t first = (2 * step + micro) % 3;
    return std::make_pair(narrow(d.x, 0, first, 2), narrow(d.y, 0, first, 2));
  };
  nn::TrainLoopOptions o;
  o.max_steps = 6;
  o.grad_accum = 2;
  o.clip_norm = 0.5;
  o.progress = false;
  auto a = line_model(), b = line_model();
  nn::SGD opt_a(a->named_parameters(), {0.1}), opt_b(b->named_parameters(), {0.1});
  nn::train_loop(
      opt_a,
      [&](int64_t step, int64_t micro) {
        auto xy = pick(step, micro);
        return nn::mse_loss(a->forward(xy.first), xy.second);
      },
      o);
  Tensor x = Tensor::zeros({2, 1}, kFloat64), y = Tensor::zeros({2, 1}, kFloat64);
  std::vector<std::pair<int64_t, int64_t>> loaded, read;
  nn::TrainLoopHooks h;
  h.load_batch = [&](int64_t step, int64_t micro) {
    CHECK(loaded.size() == read.size());  // each load right before its read
    auto xy = pick(step, micro);
    copy_(x, xy.first);
    copy_(y, xy.second);
    loaded.emplace_back(step, micro);
  };
  nn::train_loop(
      opt_b,
      [&](int64_t step, int64_t micro) {
        read.emplace_back(step, micro);
        CHECK(loaded.back() == read.back());
        return nn::mse_loss(b->forward(x), y);
      },
      o, h);
  CHECK(loaded.size() == 12);
  CHECK(read == loaded);
  CHECK(param_values(*a) == param_values(*b));
  CHECK(param_values(*a) != param_values(*line_model()));
}

TEST_CASE("train: train_loop with cuda_graph refuses what a graph cannot hold, naming it") {
  LineData d;
  auto model = line_model();
  nn::SGD opt(model->named_parameters(), {0.1});
  auto good = [&](int64_t, int64_t) { return nn::mse_loss(model->forward(d.x), d.y); };
  nn::TrainLoopOptions o;
  o.max_steps = 3;
  o.progress = false;
  o.cuda_graph = true;
  nn::TrainLoopHooks h;
  CHECK_THROWS_MSG(nn::train_loop(opt, good, o, h), ValueError, "[train_loop] cuda_graph needs hooks.load_batch",
                   "one fixed batch");
  h.load_batch = [](int64_t, int64_t) {};
  CHECK_THROWS_MSG(nn::train_loop(opt, good, o, h), ValueError,
                   "[train_loop] cuda_graph needs the parameters on a CUDA device, got cpu");
  nn::GradScaler scaler;
  h.scaler = &scaler;
  CHECK_THROWS_MSG(nn::train_loop(opt, good, o, h), ValueError, "[train_loop] cuda_graph takes no GradScaler");
  CHECK(opt.step_count() == 0);
}

TEST_CASE("train_loop with a GradScaler: scaled backward, unscaled clipping, an overflowing step skipped") {
  Tensor w = Tensor::from_vector(std::vector<float>{1.0f, -2.0f}, {2});
  w.set_requires_grad(true);
  nn::SGD opt({{"w", w}}, nn::SGDOptions{0.1});
  nn::GradScalerOptions so;
  so.init_scale = 1024.0;
  nn::GradScaler scaler(so);
  nn::TrainLoopHooks hooks;
  hooks.scaler = &scaler;
  nn::TrainLoopOptions o;
  o.max_steps = 3;
  o.clip_norm = 100.0;  // clipping sees unscaled gradients: 2w, well below 100
  o.progress = false;
  // Step 2's gradient, 1e36 per element, overflows float32 once scaled by 1024:
  // the step is skipped without a clipping error and the scale backs off.
  nn::train_loop(opt, [&](int64_t step, int64_t) { return step == 2 ? sum(w) * 1e36 : sum(w * w); }, o, hooks);
  CHECK(scaler.get_scale() == 512.0);
  CHECK(opt.step_count() == 2);
  // Two SGD steps on sum(w^2): w <- w - 0.1 * 2w = 0.8 w, twice.
  check_close(w.detach(), std::vector<double>{0.64, -1.28}, 1e-6);
}
