#include <cmath>

#include "nn/nn_test_util.h"

using namespace cf;
using namespace cf::test;

namespace {

// A two-level module for naming tests: params, a buffer and nested children.
class Block : public nn::Module {
 public:
  explicit Block(Generator& gen) {
    fc = register_module("fc", std::make_shared<nn::Linear>(3, 2, true, gen));
    scale = Tensor::full({2}, 0.5);
    register_parameter("scale", &scale);
    counter = Tensor::zeros({1}, kInt64);
    register_buffer("counter", &counter);
    cache = Tensor::zeros({4});
    register_buffer("cache", &cache, /*persistent=*/false);
  }
  Tensor forward(const Tensor& x) { return fc->forward(x) * scale; }
  std::shared_ptr<nn::Linear> fc;
  Tensor scale, counter, cache;
};

class Net : public nn::Module {
 public:
  explicit Net(uint64_t seed) {
    Generator gen(seed);
    auto list = register_module("blocks", std::make_shared<nn::ModuleList>());
    for (int i = 0; i < 2; ++i) blocks.push_back(list->push_back(std::make_shared<Block>(gen)));
    head = register_module("head", std::make_shared<nn::Linear>(2, 1, false, gen));
  }
  Tensor forward(const Tensor& x) { return head->forward(blocks[1]->forward(x) + blocks[0]->forward(x)); }
  std::vector<std::shared_ptr<Block>> blocks;
  std::shared_ptr<nn::Linear> head;
};

// Exposes the protected registration calls to test their checks.
class Open : public nn::Module {
 public:
  using nn::Module::register_buffer;
  using nn::Module::register_module;
  using nn::Module::register_parameter;
  Tensor a, b;
};

std::vector<std::string> names(const nn::StateDict& d) {
  std::vector<std::string> out;
  for (auto& e : d) out.push_back(e.first);
  return out;
}

}  // namespace

TEST_CASE("Module names parameters, buffers and children in registration order") {
  Net net(1);
  // A module's own parameters come before its children's (PyTorch's order).
  std::vector<std::string> params = {"blocks.0.scale", "blocks.0.fc.weight", "blocks.0.fc.bias",
                                     "blocks.1.scale", "blocks.1.fc.weight", "blocks.1.fc.bias", "head.weight"};
  CHECK(names(net.named_parameters()) == params);
  CHECK(names(net.named_buffers()) ==
        std::vector<std::string>{"blocks.0.counter", "blocks.0.cache", "blocks.1.counter", "blocks.1.cache"});
  // The state dict: each module's parameters then persistent buffers, then its children.
  CHECK(names(net.state_dict()) ==
        std::vector<std::string>{"blocks.0.scale", "blocks.0.counter", "blocks.0.fc.weight", "blocks.0.fc.bias",
                                 "blocks.1.scale", "blocks.1.counter", "blocks.1.fc.weight", "blocks.1.fc.bias",
                                 "head.weight"});
  CHECK(net.num_parameters() == 2 * (6 + 2 + 2) + 2);
  auto mods = net.named_modules();
  REQUIRE(mods.size() == 7);
  CHECK(mods[0].first == "");
  CHECK(mods[1].first == "blocks");
  CHECK(mods[3].first == "blocks.0.fc");
  for (auto& p : net.parameters()) CHECK(p.requires_grad());
}

TEST_CASE("Module rejects empty, dotted and duplicate names") {
  Open m;
  m.a = Tensor::zeros({2});
  CHECK_THROWS_MSG(m.register_parameter("", &m.a), ValueError, "[Module] parameter name must not be empty");
  CHECK_THROWS_MSG(m.register_parameter("w.x", &m.a), ValueError, "'w.x'", "must not contain '.'");
  m.register_parameter("w", &m.a);
  CHECK_THROWS_MSG(m.register_buffer("w", &m.b), ValueError, "buffer name 'w' is already taken");
  CHECK_THROWS_MSG(m.register_module("w", std::make_shared<nn::ReLU>()), ValueError, "submodule name 'w'");
  m.b = Tensor::zeros({2}, kInt64);
  CHECK_THROWS_MSG(m.register_parameter("ints", &m.b), DTypeError, "[Module] parameter 'ints' must be floating");
  CHECK_THROWS_MSG(m.register_module("null", std::shared_ptr<nn::Module>()), ValueError, "submodule 'null' is null");
}

TEST_CASE("state_dict / load_state_dict round trip is exact") {
  Net a(1), b(2);
  Tensor x = rand({4, 3}, kFloat32, default_generator());
  CHECK(values(a.forward(x)) != values(b.forward(x)));
  {
    NoGradGuard ng;
    Tensor c = a.blocks[0]->counter;
    fill_(c, 7);
  }
  b.load_state_dict(a.state_dict());
  CHECK(values(a.forward(x)) == values(b.forward(x)));
  CHECK(b.blocks[0]->counter.item<int64_t>() == 7);
  // Loading keeps the identity of the parameter tensors (optimizers hold them).
  Tensor w = b.head->weight;
  b.load_state_dict(Net(3).state_dict());
  CHECK(w.is_same(b.head->weight));
  CHECK(w.requires_grad());
  // A dict of the module's own tensors under other keys (two blocks swapped): each value is read before any
  // copy writes it (block 1 got block 0's new values, its own old ones, and no error)
  const auto block0 = values(b.blocks[0]->fc->weight), block1 = values(b.blocks[1]->fc->weight);
  nn::StateDict swapped;
  for (auto& [k, t] : b.state_dict()) {
    std::string key = k;
    if (key.rfind("blocks.0.", 0) == 0) key.replace(7, 1, "1");
    else if (key.rfind("blocks.1.", 0) == 0) key.replace(7, 1, "0");
    swapped.emplace_back(key, t);
  }
  b.load_state_dict(swapped);
  CHECK(values(b.blocks[0]->fc->weight) == block1);
  CHECK(values(b.blocks[1]->fc->weight) == block0);
  CHECK(w.is_same(b.head->weight));
}

TEST_CASE("load_state_dict lists missing, unexpected and mis-shaped entries, and changes nothing on error") {
  Net a(1);
  nn::StateDict d = Net(2).state_dict();  // valid entries with other values
  const auto before = a.state_dict();
  auto unchanged = [&] {
    auto now = a.state_dict();
    for (size_t i = 0; i < now.size(); ++i) CHECK_MESSAGE(values(now[i].second) == values(before[i].second), now[i].first);
  };
  nn::StateDict bad;
  for (auto& e : d) {
    if (e.first == "blocks.1.scale") continue;                             // missing
    if (e.first == "head.weight") bad.emplace_back(e.first, Tensor::zeros({2, 1}));  // wrong shape
    else bad.emplace_back(e.first, e.second);
  }
  bad.emplace_back("blocks.2.fc.weight", Tensor::zeros({2, 3}));  // unexpected
  CHECK_THROWS_MSG(a.load_state_dict(bad), ValueError, "[load_state_dict]", "missing keys: blocks.1.scale",
                   "unexpected keys: blocks.2.fc.weight", "head.weight (expected (1,2), got (2,1))");
  unchanged();
  // Non-strict: missing and unexpected are fine, shapes are still checked.
  nn::StateDict partial = {{"head.weight", Tensor::ones({1, 2})}, {"extra", Tensor::ones({1})}};
  a.load_state_dict(partial, /*strict=*/false);
  CHECK(values(a.head->weight) == std::vector<double>{1, 1});
  CHECK_THROWS_MSG(a.load_state_dict({{"head.weight", Tensor::ones({3})}}, false), ValueError, "shape or dtype mismatch");
  // a bool or int64 entry for floating weights is refused (it loaded as weights of 0 and 1); float64 converts
  CHECK_THROWS_MSG(a.load_state_dict({{"head.weight", Tensor::ones({1, 2}, kBool)}}, false), ValueError,
                   "head.weight (expected float32, got bool)");
  CHECK_THROWS_MSG(a.load_state_dict({{"head.weight", Tensor::ones({1, 2}, kInt64)}}, false), ValueError,
                   "head.weight (expected float32, got int64)");
  a.load_state_dict({{"head.weight", Tensor::full({1, 2}, 0.5, kFloat64)}}, false);
  CHECK(values(a.head->weight) == std::vector<double>{0.5, 0.5});
  nn::StateDict dup = d;
  dup.push_back(d[0]);
  const auto before_dup = values(a.blocks[0]->scale);
  CHECK_THROWS_MSG(a.load_state_dict(dup), ValueError, "duplicate keys: blocks.0.scale");
  CHECK(values(a.blocks[0]->scale) == before_dup);
  // A module tensor the copy cannot write (an expand() view put in by set_data) is refused with the
  // rest, before any copy: blocks.0's entries, copied first, stay as they were (they were loaded, then
  // copy_ refused under its own name)
  a.blocks[1]->fc->bias.set_data(expand(Tensor::zeros({1}), {2}));
  const auto weight_before = values(a.blocks[0]->fc->weight);
  CHECK_THROWS_MSG(a.load_state_dict(d), ValueError, "[load_state_dict]", "blocks.1.fc.bias", "share memory");
  CHECK(values(a.blocks[0]->fc->weight) == weight_before);
}

TEST_CASE("train/eval propagates - to(dtype) converts - to(device) refuses a missing device clearly") {
  Net a(1);
  CHECK(a.is_training());
  a.eval();
  CHECK(!a.blocks[1]->fc->is_training());
  a.train();
  CHECK(a.head->is_training());
  std::vector<double> w = values(a.head->weight);
  a.to(kFloat64);
  CHECK(a.head->weight.dtype() == kFloat64);
  CHECK(a.head->weight.requires_grad());
  CHECK(a.blocks[0]->counter.dtype() == kInt64);  // int buffers keep their dtype
  CHECK(a.blocks[0]->cache.dtype() == kFloat64);
  for (size_t i = 0; i < w.size(); ++i) CHECK(values(a.head->weight)[i] == w[i]);
  CHECK_THROWS_MSG(a.to(kInt64), DTypeError, "[Module::to] parameters can only be floating", "int64");
  a.head->weight.set_requires_grad(false);  // frozen
  a.to(kFloat32);
  CHECK(!a.head->weight.requires_grad());
  CHECK(a.blocks[0]->scale.requires_grad());
  a.to(Device::cpu());
  CHECK_THROWS_MSG(a.to(Device::cuda(63)), DeviceError, "[Module::to]", "cuda:63", "not available");
  CHECK(a.head->weight.device().is_cpu());  // a refused move changes nothing
}

namespace {
// One Adam step of `net` on a fixed batch in its current dtype.
void adam_step(Net& net, nn::Optimizer& opt) {
  Tensor x = to(Tensor::from_vector(std::vector<double>{0.5, -1, 2, 1.5, 0.25, -0.75}, {2, 3}),
                net.head->weight.dtype());
  opt.zero_grad();
  sum(net.forward(x) * net.forward(x)).backward();
  opt.step();
}
}  // namespace

TEST_CASE("to(dtype) keeps each parameter's identity - an optimizer built before steps the converted ones") {
  // Before, to() made new tensors: the optimizer kept stepping the old float32 ones and the
  // model trained nothing, silently.
  Net a(1), b(1);
  nn::Adam opt_a(a.named_parameters()), opt_b(b.named_parameters());
  adam_step(a, opt_a);
  adam_step(b, opt_b);
  Tensor w = a.head->weight;
  a.to(kFloat64);
  CHECK(w.is_same(a.head->weight));
  CHECK(w.dtype() == kFloat64);
  CHECK(opt_a.param_groups()[0].params.back().second.dtype() == kFloat64);
  // The twin: convert, rebuild the optimizer and hand it the first one's state in float64.
  nn::StateDict state = opt_b.state_dict();
  b.to(kFloat64);
  nn::Adam opt_b64(b.named_parameters());
  for (auto& [k, t] : state)
    if (t.dtype() == kFloat32) t = to(t, kFloat64);
  opt_b64.load_state_dict(state);
  for (int i = 0; i < 2; ++i) {
    adam_step(a, opt_a);
    adam_step(b, opt_b64);
  }
  nn::StateDict pa = a.named_parameters(), pb = b.named_parameters();
  for (size_t i = 0; i < pa.size(); ++i) CHECK(values(pa[i].second) == values(pb[i].second));
  nn::StateDict sa = opt_a.state_dict(), sb = opt_b64.state_dict();
  REQUIRE(sa.size() == sb.size());
  for (size_t i = 0; i < sa.size(); ++i) {
    CHECK(sa[i].first == sb[i].first);
    CHECK(sa[i].second.dtype() == sb[i].second.dtype());
    CHECK(values(sa[i].second) == values(sb[i].second));
  }
}

TEST_CASE("to(bfloat16) after the optimizer was built gives it float32 masters - gradients convert with their tensor") {
  Net a(2);
  nn::AdamW opt(a.named_parameters());
  Tensor x = Tensor::from_vector(std::vector<float>{0.5f, -1, 2}, {1, 3});
  sum(a.forward(x)).backward();
  std::vector<double> g = values(a.head->weight.grad());
  a.to(kFloat64);
  REQUIRE(a.head->weight.grad().defined());
  CHECK(a.head->weight.grad().dtype() == kFloat64);
  CHECK(values(a.head->weight.grad()) == g);
  a.to(kBFloat16);
  REQUIRE(opt.master("head.weight").defined());
  CHECK(opt.master("head.weight").dtype() == kFloat32);
  std::vector<double> before = values(a.head->weight);
  opt.zero_grad();
  sum(a.forward(to(x, kBFloat16))).backward();
  opt.step();
  CHECK(values(a.head->weight) != before);
  CHECK(values(to(opt.master("head.weight"), kBFloat16)) == values(a.head->weight));
  for (auto& [k, t] : opt.state_dict())
    if (k.rfind("exp_avg", 0) == 0 || k.rfind("master.", 0) == 0) CHECK(t.dtype() == kFloat32);
  a.to(kFloat32);  // wider again: the masters go, the slots stay float32
  CHECK(!opt.master("head.weight").defined());
  opt.step();
}

TEST_CASE("a submodule cycle is refused when it would be made (walks of it overflowed the stack)") {
  auto seq = std::make_shared<nn::Sequential>();
  seq->push_back(std::make_shared<nn::Identity>());
  CHECK_THROWS_MSG(seq->push_back(seq), ValueError, "[Module] adding submodule '1' would make a cycle");
  auto outer = std::make_shared<nn::Sequential>();
  outer->push_back(seq);
  CHECK_THROWS_MSG(seq->push_back(outer), ValueError, "would make a cycle");
  auto list = std::make_shared<nn::ModuleList>();
  CHECK_THROWS_MSG(list->push_back(list), ValueError, "would make a cycle");
  CHECK(list->size() == 0);
  auto shared = std::make_shared<nn::Identity>();  // a shared, acyclic reuse stays allowed
  seq->push_back(shared);
  outer->push_back(shared);
  CHECK(outer->named_modules().size() == 5);  // "", 0, 0.0, 0.1, 1
  outer->eval();  // walks end
  CHECK(!shared->is_training());
}

TEST_CASE("to() keeps grad hooks, and a 16-bit parameter given other data keeps it through the optimizer") {
  Net a(3);
  int calls = 0;
  const int64_t id = autograd::add_grad_accumulated_hook(a.head->weight, [&](const Tensor&) { ++calls; });
  a.to(kFloat64);
  sum(a.forward(Tensor::ones({1, 3}, kFloat64))).backward();
  CHECK(calls == 1);  // (to() made new tensors: the hook was lost with the old one)
  autograd::remove_grad_hook(id);
  // set_data gives the parameter another storage, whose version counter may read the same
  // number as the one the master was made at: the master must still see the new values
  a.to(kBFloat16);
  nn::SGD opt(a.named_parameters(), nn::SGDOptions{0.1});
  a.head->weight.set_data(Tensor::full(a.head->weight.shape(), 5.0, kBFloat16));
  opt.zero_grad();
  sum(a.forward(Tensor::ones({1, 3}, kBFloat16))).backward();
  const std::vector<double> g = values(a.head->weight.grad());
  opt.step();
  const std::vector<double> w = values(a.head->weight);
  for (size_t i = 0; i < w.size(); ++i) CHECK(w[i] == doctest::Approx(5.0 - 0.1 * g[i]).epsilon(1e-2));
}

TEST_CASE("set_data: the tensor shows another's data under its identity - bad input") {
  Tensor w = Tensor::zeros({2, 2});
  w.set_requires_grad(true);
  Tensor alias = w;
  w.set_grad(Tensor::ones({2, 2}));
  w.set_data(Tensor::full({3}, 2.0, kFloat64));
  CHECK(alias.shape() == Shape{3});
  CHECK(alias.dtype() == kFloat64);
  CHECK(alias.requires_grad());
  CHECK(!alias.grad().defined());  // it no longer fits
  CHECK(values(sum(alias * alias)) == std::vector<double>{12});
  CHECK_THROWS_MSG(w.set_data(Tensor()), ValueError, "[set_data]", "undefined");
  CHECK_THROWS_MSG(w.set_data(Tensor::zeros({3}, kInt64)), DTypeError, "[set_data]", "requires grad", "int64");
}

TEST_CASE("ModuleList names stay dense after a failed push - shared parameters are listed once") {
  nn::ModuleList list;
  list.push_back(std::make_shared<nn::ReLU>());
  CHECK_THROWS_MSG(list.push_back(std::shared_ptr<nn::Module>()), ValueError, "submodule '1' is null");
  list.push_back(std::make_shared<nn::Linear>(2, 2));
  CHECK(list.size() == 2);
  CHECK(list.named_parameters()[0].first == "1.weight");
  // The same layer twice (weight tying): one entry, so an optimizer steps it once.
  Open tied;
  auto lin = std::make_shared<nn::Linear>(2, 2);
  tied.register_module("a", lin);
  tied.register_module("b", lin);
  CHECK(names(tied.named_parameters()) == std::vector<std::string>{"a.weight", "a.bias"});
  CHECK(tied.num_parameters() == 6);
  CHECK(names(tied.state_dict()).size() == 4);  // both names stay loadable
  auto twice = tied.parameters();
  tied.set_parameters({Tensor::ones({2, 2}), Tensor::ones({2})});
  CHECK(values(lin->weight) == std::vector<double>{1, 1, 1, 1});
}

TEST_CASE("a shared submodule stays shared through to(dtype) and to(device) - set_buffers binds every slot and checks") {
  Generator gen(3);
  auto block = std::make_shared<Block>(gen);
  Open twice;
  twice.register_module("a", block);
  twice.register_module("b", block);
  CHECK(names(twice.named_buffers()) == std::vector<std::string>{"a.counter", "a.cache"});  // listed once
  CHECK(twice.persistent_buffer_names() == std::vector<std::string>{"a.counter"});
  twice.to(kFloat64);
  CHECK(block->fc->weight.dtype() == kFloat64);
  CHECK(twice.named_parameters().size() == 3);
  // two slots holding one tensor stay one tensor (before, each slot got its own copy)
  Open tied;
  tied.a = Tensor::zeros({3});
  tied.b = tied.a;
  tied.register_buffer("a", &tied.a);
  tied.register_buffer("b", &tied.b);
  CHECK(tied.named_buffers().size() == 1);
  tied.to(kFloat64);
  CHECK(tied.a.dtype() == kFloat64);
  CHECK(tied.a.impl_ptr() == tied.b.impl_ptr());
  tied.set_buffers({Tensor::ones({3}, kFloat64)});
  CHECK(tied.a.impl_ptr() == tied.b.impl_ptr());
  // a tensor under a non-persistent and a persistent name is in the state dict: persistent
  Open mixed;
  mixed.a = Tensor::zeros({2});
  mixed.b = mixed.a;
  mixed.register_buffer("a", &mixed.a, /*persistent=*/false);
  mixed.register_buffer("b", &mixed.b);
  CHECK(mixed.persistent_buffer_names() == std::vector<std::string>{"a"});
  CHECK(names(mixed.state_dict()) == std::vector<std::string>{"b"});
  // set_buffers: given tensors used as they are, in named_buffers() order
  Tensor counter = Tensor::full({1}, 7.0, kInt64), cache = Tensor::ones({4}, kFloat64);
  twice.set_buffers({counter, cache});
  CHECK(block->counter.impl_ptr() == counter.impl_ptr());
  CHECK(block->cache.impl_ptr() == cache.impl_ptr());
  CHECK_THROWS_MSG(twice.set_buffers({counter}), ValueError, "[set_buffers] module has 2 buffers, got 1 tensors");
  CHECK_THROWS_MSG(twice.set_buffers({counter, Tensor::ones({4})}), ValueError, "[set_buffers] 'a.cache' is",
                   "float64", "float32");
  CHECK_THROWS_MSG(twice.set_buffers({Tensor(), cache}), ValueError, "'a.counter'", "got undefined");
}

TEST_CASE("gradients flow to every parameter - zero_grad clears them - set_parameters checks") {
  Net a(1);
  Tensor x = rand({4, 3}, kFloat32, default_generator());
  sum(a.forward(x)).backward();
  for (auto& e : a.named_parameters()) CHECK_MESSAGE(e.second.grad().defined(), e.first);
  a.zero_grad();
  for (auto& p : a.parameters()) CHECK(!p.grad().defined());
  CHECK_THROWS_MSG(a.set_parameters({}), ValueError, "[set_parameters] module has 7 parameters, got 0");
  std::vector<Tensor> ps = a.parameters();
  ps[6] = Tensor::zeros({2, 1});
  CHECK_THROWS_MSG(a.set_parameters(ps), ValueError, "'head.weight'");
}

TEST_CASE("float64 gradcheck of a composite module through check_module_grad") {
  Net a(4);
  a.to(kFloat64);
  check_module_grad(a, [&](const std::vector<Tensor>& xs) { return a.forward(xs[0]); }, {leaf64({3, 3}, 5)});
}

TEST_CASE("initialisers are seeded and follow their formulas") {
  Tensor a = Tensor::empty({64, 32}), b = Tensor::empty({64, 32});
  Generator g1(9), g2(9);
  nn::init::xavier_uniform_(a, 1.0, g1);
  nn::init::xavier_uniform_(b, 1.0, g2);
  CHECK(values(a) == values(b));
  double bound = std::sqrt(6.0 / (32 + 64));
  double mx = 0;
  for (double v : values(a)) mx = std::max(mx, std::abs(v));
  CHECK(mx <= bound);
  CHECK(mx > 0.9 * bound);
  Tensor k = Tensor::empty({256, 128});
  nn::init::kaiming_normal_(k, 0.0, g1);
  double s2 = 0;
  for (double v : values(k)) s2 += v * v;
  double std_dev = std::sqrt(s2 / double(k.numel()));
  CHECK(std_dev == doctest::Approx(std::sqrt(2.0 / 128)).epsilon(0.03));
  Tensor c = Tensor::empty({4, 3, 5});
  CHECK(nn::init::fans(c).in == 15);
  CHECK(nn::init::fans(c).out == 20);
  nn::init::zeros_(c);
  CHECK(values(sum(abs(c)))[0] == 0);
  Tensor i = Tensor::zeros({2}, kInt64);
  CHECK_THROWS_MSG(nn::init::normal_(i, 0, 1), DTypeError, "[init::normal_] needs a float tensor");
  Tensor s = Tensor::empty({});
  CHECK_THROWS_MSG(nn::init::xavier_normal_(s), ShapeError, "[init]", "()");
  // U(a, a) fills a, as PyTorch's uniform_ (rand refused its empty interval under its own name)
  Tensor u = Tensor::empty({3});
  nn::init::uniform_(u, 1.5, 1.5, g1);
  CHECK(values(u) == std::vector<double>{1.5, 1.5, 1.5});
  CHECK_THROWS_MSG(nn::init::uniform_(u, 2, 1, g1), ValueError, "[init::uniform_] needs finite low <= high",
                   "low 2 high 1");
  CHECK_THROWS_MSG(nn::init::uniform_(u, 0, INFINITY, g1), ValueError, "[init::uniform_]", "high inf");
  CHECK_THROWS_MSG(nn::init::normal_(u, NAN, 1, g1), ValueError, "[init::normal_]", "mean nan");
  // a tensor with no element: nothing to initialise, and no random number drawn (its zero fan gave an
  // infinite bound, refused by randn/rand under their own names)
  const uint64_t before = g1.offset();
  for (Shape shape : {Shape{0, 3}, Shape{3, 0}, Shape{0}}) {
    Tensor e = Tensor::empty(shape);
    nn::init::xavier_uniform_(e, 1.0, g1);
    nn::init::xavier_normal_(e, 1.0, g1);
    nn::init::kaiming_uniform_(e, 0.0, g1);
    nn::init::kaiming_normal_(e, 0.0, g1);
    nn::init::uniform_(e, -1, 1, g1);
    nn::init::normal_(e, 0, 1, g1);
    CHECK(e.numel() == 0);
  }
  CHECK(g1.offset() == before);
  // an expand() view cannot take one value per element: refused before the generator moves (it drew
  // 18 numbers, then copy_ refused the view)
  Tensor shared = expand(Tensor::zeros({1}), {6, 3});
  CHECK_THROWS_MSG(nn::init::uniform_(shared, -1, 1, g1), ValueError, "[init::uniform_]", "share memory");
  CHECK_THROWS_MSG(nn::init::normal_(shared, 0, 1, g1), ValueError, "[init::normal_]", "share memory");
  CHECK_THROWS_MSG(nn::init::kaiming_uniform_(shared, 0, g1), ValueError, "[init::kaiming_uniform_]", "share memory");
  CHECK(g1.offset() == before);
  nn::init::constant_(shared, 2.0);  // one value for all: fill_ writes it
  CHECK(values(shared) == std::vector<double>(18, 2.0));
}
