#include "autograd/gradcheck.h"

#include <cmath>
#include <cstring>

#include "autograd/grad_mode.h"
#include "autograd/ops/elementwise.h"
#include "autograd/ops/random.h"

namespace cf {

namespace {

struct Checker {
  const GradcheckFn& f;
  std::vector<Tensor> inputs;
  std::vector<size_t> diff;  // indices of inputs that require grad
  const GradcheckOptions& opt;
  GradcheckResult r;

  // Gradients (as host vectors) of the inputs for y.backward(grad_output).
  std::vector<std::vector<double>> analytic(const Tensor& grad_output) {
    for (size_t k : diff) inputs[k].zero_grad();
    Tensor y = f(inputs);
    y.backward(grad_output);
    std::vector<std::vector<double>> g;
    for (size_t k : diff) {
      Tensor gk = inputs[k].grad();
      g.push_back(gk.defined() ? gk.to_vector<double>()
                               : std::vector<double>(size_t(inputs[k].numel()), 0.0));
      inputs[k].zero_grad();
    }
    return g;
  }

  // f at perturbed copies of the inputs: x_k + s * dir_k (dir empty: unperturbed).
  std::vector<double> eval(const std::vector<std::vector<double>>& dir, double s) {
    NoGradGuard ng;
    std::vector<Tensor> xs = inputs;
    for (size_t j = 0; j < diff.size(); ++j) {
      size_t k = diff[j];
      std::vector<double> v = inputs[k].to_vector<double>();
      if (!dir.empty())
        for (size_t i = 0; i < v.size(); ++i) v[i] += s * dir[j][i];
      xs[k] = Tensor::from_vector(v, inputs[k].shape(), inputs[k].device());
    }
    return f(xs).to_vector<double>();
  }

  bool compare(double analytic_v, double numeric_v, const std::string& where) {
    double err = std::fabs(analytic_v - numeric_v);
    r.max_abs_error = std::max(r.max_abs_error, err);
    ++r.entries_checked;
    if (!(err <= opt.atol + opt.rtol * std::fabs(numeric_v))) {
      if (r.ok)
        r.message = str("[gradcheck] ", where, ": analytic ", analytic_v, " vs numeric ", numeric_v,
                        " (|diff| ", err, " > atol ", opt.atol, " + rtol ", opt.rtol, " * |numeric|)");
      r.ok = false;
    }
    return r.ok;
  }

  std::vector<std::vector<double>> unit(size_t j, size_t i) {
    std::vector<std::vector<double>> d;
    for (size_t k : diff) d.emplace_back(size_t(inputs[k].numel()), 0.0);
    d[j][i] = 1.0;
    return d;
  }
};

double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

}  // namespace

GradcheckResult gradcheck(const GradcheckFn& f, const std::vector<Tensor>& inputs,
                          const GradcheckOptions& opt) {
  Checker c{f, inputs, {}, opt, {}};
  for (size_t k = 0; k < inputs.size(); ++k) {
    const Tensor& t = inputs[k];
    if (!t.defined() || !t.requires_grad()) continue;
    CF_CHECK(t.dtype() == kFloat64, DTypeError, "[gradcheck] input ", k, " is ", t.describe(),
             "; gradients are checked in float64");
    CF_CHECK(t.is_leaf(), ValueError, "[gradcheck] input ", k, " is not a leaf tensor");
    c.diff.push_back(k);
  }
  CF_CHECK(!c.diff.empty(), ValueError, "[gradcheck] no input requires grad");
  // The checks run backward into the inputs' .grad: what the caller had there is put back after
  // (also after an exception), as torch.autograd.gradcheck leaves .grad alone. Leaves that f
  // reaches by itself (a module's parameters) are not inputs: they keep what backward put there.
  struct GradsRestored {
    std::vector<Tensor> inputs, grads;
    ~GradsRestored() {
      for (size_t i = 0; i < inputs.size(); ++i) inputs[i].set_grad(grads[i]);
    }
  } restored;
  for (size_t k : c.diff) {
    restored.inputs.push_back(inputs[k]);
    restored.grads.push_back(inputs[k].grad());
  }

  Tensor y0 = f(c.inputs);
  CF_CHECK(y0.defined() && y0.dtype() == kFloat64, DTypeError,
           "[gradcheck] f must return a float64 tensor, got ", y0.describe());
  CF_CHECK(y0.requires_grad(), AutogradError,
           "[gradcheck] f's output does not depend on any input that requires grad");
  Generator gen(opt.seed);
  // Finite differences run on the inputs' device: perturbed inputs are copied
  // there and the weights w live on f's output device.
  Tensor w = randn(y0.shape(), kFloat64, gen).to(y0.device());
  std::vector<double> wv = w.to_vector<double>();
  auto loss = [&](const std::vector<double>& y) { return dot(wv, y); };

  std::vector<std::vector<double>> g = c.analytic(w);

  if (opt.check_repeat) {
    std::vector<std::vector<double>> g2 = c.analytic(w);
    for (size_t j = 0; j < g.size() && c.r.ok; ++j)
      if (std::memcmp(g[j].data(), g2[j].data(), g[j].size() * sizeof(double)) != 0) {
        c.r.ok = false;
        c.r.message = str("[gradcheck] backward run twice gave different gradients for input ", c.diff[j]);
      }
  }
  if (opt.check_zero_grad && c.r.ok) {
    std::vector<std::vector<double>> gz = c.analytic(zeros_like(w));
    for (size_t j = 0; j < gz.size() && c.r.ok; ++j)
      for (size_t i = 0; i < gz[j].size(); ++i)
        if (gz[j][i] != 0.0) {
          c.r.ok = false;
          c.r.message = str("[gradcheck] a zero grad_output gave gradient ", gz[j][i], " for input ",
                            c.diff[j], " at flat index ", i);
          break;
        }
  }
  if (!c.r.ok) return c.r;

  int64_t in_total = 0;
  for (size_t k : c.diff) in_total += inputs[k].numel();
  const int64_t out_n = y0.numel();
  const double h = opt.eps;

  if (in_total * out_n <= opt.full_jacobian_max_entries) {
    c.r.mode = "full-jacobian";
    // Analytic rows: backward of each one-hot output.
    std::vector<std::vector<std::vector<double>>> rows;
    for (int64_t o = 0; o < out_n; ++o) {
      std::vector<double> e(size_t(out_n), 0.0);
      e[size_t(o)] = 1.0;
      rows.push_back(c.analytic(Tensor::from_vector(e, y0.shape(), y0.device())));
    }
    // Numeric columns: central difference per input element.
    for (size_t j = 0; j < c.diff.size(); ++j)
      for (size_t i = 0; i < size_t(inputs[c.diff[j]].numel()); ++i) {
        auto d = c.unit(j, i);
        std::vector<double> yp = c.eval(d, h), ym = c.eval(d, -h);
        for (int64_t o = 0; o < out_n; ++o) {
          double num = (yp[size_t(o)] - ym[size_t(o)]) / (2 * h);
          if (!c.compare(rows[size_t(o)][j][i], num,
                         str("d output[", o, "] / d input ", c.diff[j], "[", i, "]")))
            return c.r;
        }
      }
    return c.r;
  }

  c.r.mode = "weighted-gradient+projections";
  if (in_total <= opt.elementwise_max_inputs) {
    for (size_t j = 0; j < c.diff.size(); ++j)
      for (size_t i = 0; i < g[j].size(); ++i) {
        auto d = c.unit(j, i);
        double num = (loss(c.eval(d, h)) - loss(c.eval(d, -h))) / (2 * h);
        if (!c.compare(g[j][i], num, str("dL/d input ", c.diff[j], "[", i, "]"))) return c.r;
      }
  }
  for (int p = 0; p < opt.num_projections; ++p) {
    std::vector<std::vector<double>> u;
    double analytic_v = 0;
    for (size_t j = 0; j < c.diff.size(); ++j) {
      u.push_back(randn(inputs[c.diff[j]].shape(), kFloat64, gen).to_vector<double>());
      analytic_v += dot(g[j], u.back());
    }
    double num = (loss(c.eval(u, h)) - loss(c.eval(u, -h))) / (2 * h);
    if (!c.compare(analytic_v, num, str("projection ", p, " (v^T J u)"))) return c.r;
  }
  return c.r;
}

}  // namespace cf
