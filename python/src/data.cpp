// K-Means (cf.kmeans) and cf.data: datasets, the data loader, tokenizers and the
// file readers (IDX / Fashion-MNIST, fortunes, .npy, raw float32).
#include <nanobind/stl/function.h>
#include <nanobind/stl/tuple.h>

#include <unordered_map>

#include "common.h"

namespace cfpy {

using cf::Tensor;
namespace cnn = cf::nn;
namespace cd = cf::data;

namespace {

cnn::KMeansInit parse_init(const std::string& s) {
  if (s == "k-means++" || s == "kmeans++") return cnn::KMeansInit::kmeans_plus_plus;
  if (s == "random") return cnn::KMeansInit::random;
  throw cf::ValueError("[kmeans] init must be 'k-means++' or 'random', got '" + s + "'");
}
cnn::KMeansMetric parse_metric(const std::string& s) {
  if (s == "l2") return cnn::KMeansMetric::l2;
  if (s == "cosine") return cnn::KMeansMetric::cosine;
  throw cf::ValueError("[kmeans] metric must be 'l2' or 'cosine', got '" + s + "'");
}
cnn::KMeansAlgorithm parse_algorithm(const std::string& s) {
  if (s == "lloyd") return cnn::KMeansAlgorithm::lloyd;
  if (s == "elkan") return cnn::KMeansAlgorithm::elkan;
  throw cf::ValueError("[kmeans] algorithm must be 'lloyd' or 'elkan', got '" + s + "'");
}

cnn::KMeansOptions kmeans_options(int64_t k, int64_t max_iter, double tol, const std::string& init,
                                  const std::string& metric, uint64_t seed, int64_t block_rows,
                                  const std::string& algorithm) {
  cnn::KMeansOptions o;
  o.k = k;
  o.max_iter = max_iter;
  o.tol = tol;
  o.init = parse_init(init);
  o.metric = parse_metric(metric);
  o.seed = seed;
  o.block_rows = block_rows;
  o.algorithm = parse_algorithm(algorithm);
  return o;
}

// The next batch of the loader's current epoch (StopIteration at its end; the next pass runs the next epoch).
bool next_batch_into(cd::DataLoader& l, cd::Batch& b) {
  nb::gil_scoped_release g;
  return l.next(b);
}
cd::Batch next_batch(cd::DataLoader& l) {
  cd::Batch b;
  if (!next_batch_into(l, b)) throw nb::stop_iteration();
  return b;
}

// A Python object with __len__ and __getitem__ (a PyTorch-style map dataset) as a cf dataset, so that
// cf.data.DataLoader batches it with its own shuffle, collate and padding. An item is an (input, target)
// tuple, a 1-tuple, or the input alone; each part a cf.Tensor (taken as is) or anything cf.tensor takes (a
// NumPy array, nested lists, a number: an int label becomes a 0-d int64 tensor). Every call takes the GIL:
// the loader calls in with it released (next_batch_into). No prefetch thread: it would wait on the GIL
// that the thread joining it (the loader's destructor, set_state) may hold.
class PyDataset : public cd::Dataset {
 public:
  explicit PyDataset(nb::object obj) : obj_(std::move(obj)) {}
  ~PyDataset() override {
    // nb::is_alive, not Py_IsInitialized: that turns false early in Py_FinalizeEx, while module globals (a
    // loader kept in one) are still being cleared, and leaking the dataset there kept __main__'s globals
    // from being finalised (an open log file lost its buffered lines, from a review).
    if (!nb::is_alive()) {  // the interpreter is gone: its objects with it
      (void)obj_.release();
      return;
    }
    nb::gil_scoped_acquire g;
    obj_.reset();
  }
  // The garbage collector's view of the loader that holds this dataset (bind_data's slots below): a dataset
  // that refers back to its loader (ds.loader = DataLoader(ds)) is a cycle only the collector can free.
  int traverse(visitproc visit, void* arg) const {
    Py_VISIT(obj_.ptr());
    return 0;
  }
  void clear() { obj_.reset(); }
  int64_t size() const override {
    nb::gil_scoped_acquire g;
    CF_CHECK(obj_.is_valid(), ValueError, "[DataLoader] its Python dataset was cleared by the garbage collector");
    const Py_ssize_t n = PyObject_Length(obj_.ptr());
    if (n < 0) throw nb::python_error();
    return int64_t(n);
  }
  cd::Example get(int64_t i) const override {
    nb::gil_scoped_acquire g;
    CF_CHECK(obj_.is_valid(), ValueError, "[DataLoader] its Python dataset was cleared by the garbage collector");
    nb::object item = obj_[nb::int_(i)];
    cd::Example e;
    if (nb::isinstance<nb::tuple>(item)) {
      const size_t n = nb::len(item);
      CF_CHECK(n == 1 || n == 2, ValueError, "[DataLoader] the dataset's item ", i, " is a tuple of ", n,
               " values; a dataset gives (input, target), (input,) or the input alone");
      e.input = part(item[0], i, "input");
      if (n == 2 && !item[1].is_none()) e.target = part(item[1], i, "target");
    } else {
      e.input = part(item, i, "input");
    }
    return e;
  }

 private:
  static Tensor part(nb::handle h, int64_t i, const char* what) {
    if (nb::isinstance<Tensor>(h)) return nb::cast<Tensor>(h).detach();
    // An empty list or tuple (an empty text's token ids) is an empty int64 sequence, a row of padding:
    // as a tensor it would be float32 (as torch.tensor([]) is), which the loader stacks instead of padding.
    if ((PyList_Check(h.ptr()) || PyTuple_Check(h.ptr())) && nb::len(h) == 0)
      return Tensor::empty({0}, cf::kInt64, cf::Device::cpu());
    try {
      return tensor_from_python(h, std::nullopt, cf::Device::cpu());
    } catch (const cf::Error& err) {
      throw cf::ValueError(cf::str("[DataLoader] the dataset's item ", i, ": its ", what, " (",
                                   nb::type_name(h.type()).c_str(), ") is no tensor: ", err.what()));
    }
  }
  nb::object obj_;
};

// tp_traverse / tp_clear of cf.data.DataLoader: the Python dataset a loader holds (none for cf's own datasets).
PyDataset* python_dataset_of(PyObject* self) {
  if (!nb::inst_ready(self)) return nullptr;
  const cd::DataLoader* l = nb::inst_ptr<cd::DataLoader>(self);
  return const_cast<PyDataset*>(dynamic_cast<const PyDataset*>(&l->dataset()));
}
int loader_traverse(PyObject* self, visitproc visit, void* arg) {
  Py_VISIT(Py_TYPE(self));  // (a heap type's instances visit their type)
  if (PyDataset* d = python_dataset_of(self)) return d->traverse(visit, arg);
  return 0;
}
int loader_clear(PyObject* self) {
  if (PyDataset* d = python_dataset_of(self)) d->clear();
  return 0;
}
PyType_Slot loader_slots[] = {{Py_tp_traverse, (void*)loader_traverse}, {Py_tp_clear, (void*)loader_clear}, {0, nullptr}};

std::shared_ptr<cd::Dataset> dataset_of(nb::handle h, int64_t prefetch) {
  // A Python class deriving from cf.data.Dataset (torch.utils.data.Dataset's habit) holds no C++ dataset:
  // its own __len__ and __getitem__ make it a Python dataset like any other.
  if (nb::isinstance<cd::Dataset>(h) && nb::inst_ready(h)) return nb::cast<std::shared_ptr<cd::Dataset>>(h);
  if (!nb::hasattr(h, "__len__") || !nb::hasattr(h, "__getitem__") || nb::isinstance<Tensor>(h))
    throw nb::type_error(cf::str("[DataLoader] dataset must be a cf.data.Dataset or an object with __len__ and "
                                 "__getitem__ (a map-style dataset), got ", nb::type_name(h.type()).c_str())
                             .c_str());
  CF_CHECK(prefetch == 0, ValueError, "[DataLoader] prefetch ", prefetch,
           " needs a cf.data dataset: a Python dataset's __getitem__ runs under the GIL, so it takes prefetch=0");
  return std::make_shared<PyDataset>(nb::borrow(h));
}

// One Python pass (iter()) over a loader. A newer iter() of the same loader ends the older pass: nested loops
// over one loader ran forever (each inner loop's StopIteration began the next epoch under the outer loop), and
// now the outer loop's next step says why it stops. The generations are counted per loader (under the GIL;
// a few bytes per loader ever iterated).
struct LoaderPass {
  nb::object loader;
  uint64_t generation;
  bool done = false;  // once StopIteration, always (the iterator protocol): the next epoch is a new pass
};
// tp_traverse / tp_clear of _LoaderPass: the loader it holds (a dataset holding iter(loader) made a cycle
// that Python's collector could not see through the pass, so none of it was ever freed).
int pass_traverse(PyObject* self, visitproc visit, void* arg) {
  Py_VISIT(Py_TYPE(self));
  if (!nb::inst_ready(self)) return 0;
  Py_VISIT(nb::inst_ptr<LoaderPass>(self)->loader.ptr());
  return 0;
}
int pass_clear(PyObject* self) {
  if (nb::inst_ready(self)) {
    LoaderPass* p = nb::inst_ptr<LoaderPass>(self);
    p->loader = nb::object();
    p->done = true;  // (a cleared pass is over)
  }
  return 0;
}
PyType_Slot pass_slots[] = {{Py_tp_traverse, (void*)pass_traverse}, {Py_tp_clear, (void*)pass_clear}, {0, nullptr}};

std::unordered_map<const cd::DataLoader*, uint64_t>& pass_generations() {
  static std::unordered_map<const cd::DataLoader*, uint64_t> generations;
  return generations;
}

}  // namespace

void bind_data(nb::module_& m, nb::module_& data) {
  // ---------------------------------------------------------------- K-Means
  nb::class_<cnn::KMeansResult>(m, "KMeansResult",
                                "centroids (k, d), assignments (N,) int64, inertia; unpacks as (centroids, assignments, "
                                "inertia).")
      .def_ro("centroids", &cnn::KMeansResult::centroids)
      .def_ro("assignments", &cnn::KMeansResult::assignments)
      .def_ro("inertia", &cnn::KMeansResult::inertia, "Sum of squared distances (cosine: of 1 - cos) to the centroids.")
      .def_ro("iterations", &cnn::KMeansResult::iterations)
      .def_ro("converged", &cnn::KMeansResult::converged)
      .def_ro("inertia_history", &cnn::KMeansResult::inertia_history)
      .def_ro("reseeded_clusters", &cnn::KMeansResult::reseeded_clusters)
      .def("__len__", [](const cnn::KMeansResult&) { return 3; })
      .def("__iter__", [](const cnn::KMeansResult& r) {
        return nb::iter(nb::make_tuple(r.centroids, r.assignments, r.inertia));
      })
      .def("__getitem__", [](const cnn::KMeansResult& r, int i) -> nb::object {
        switch (i < 0 ? i + 3 : i) {
          case 0: return nb::cast(r.centroids);
          case 1: return nb::cast(r.assignments);
          case 2: return nb::float_(r.inertia);
        }
        throw cf::IndexError("[KMeansResult] index out of range (0: centroids, 1: assignments, 2: inertia)");
      })
      .def("__repr__", [](const cnn::KMeansResult& r) {
        return "KMeansResult(k=" + std::to_string(r.centroids.defined() ? r.centroids.size(0) : 0) +
               ", inertia=" + std::to_string(r.inertia) + ", iterations=" + std::to_string(r.iterations) +
               ", converged=" + (r.converged ? "True" : "False") + ")";
      });
  m.def("kmeans",
        [](const Tensor& x, int64_t k, int64_t max_iter, double tol, const std::string& init, const std::string& metric,
           uint64_t seed, int64_t block_rows, const std::string& algorithm, std::optional<Tensor> initial_centroids,
           std::optional<std::function<void(int64_t, double)>> on_iteration) {
          cnn::KMeansOptions o = kmeans_options(k, max_iter, tol, init, metric, seed, block_rows, algorithm);
          if (on_iteration) {
            // Called from the kernel loop, which runs without the GIL.
            auto f = *on_iteration;
            o.on_iteration = [f](int64_t it, double inertia) {
              nb::gil_scoped_acquire g;
              f(it, inertia);
            };
          }
          nb::gil_scoped_release g;
          return initial_centroids ? cnn::kmeans(x, *initial_centroids, o) : cnn::kmeans(x, o);
        },
        nb::arg("x"), nb::arg("k"), nb::arg("max_iter") = 100, nb::arg("tol") = 1e-4, nb::arg("init") = "k-means++",
        nb::arg("metric") = "l2", nb::arg("seed") = 0, nb::arg("block_rows") = 8192, nb::arg("algorithm") = "lloyd",
        nb::arg("initial_centroids") = nb::none(), nb::arg("on_iteration") = nb::none(),
        "K-Means of x (N, d) float32/64 on the CPU or a CUDA device: Lloyd's algorithm (or Elkan's, same result) with "
        "k-means++ or random initialisation, L2 or cosine metric, empty clusters re-seeded, deterministic for a seed. "
        "Returns a KMeansResult: c, a, inertia = cf.kmeans(x, k). on_iteration(iteration, inertia) is called after "
        "each iteration.");
  m.def("kmeans_assign",
        [](const Tensor& x, const Tensor& c, const std::string& metric) {
          cnn::KMeansMetric mt = parse_metric(metric);
          nb::gil_scoped_release g;
          return cnn::kmeans_assign(x, c, mt);
        },
        nb::arg("x"), nb::arg("centroids"), nb::arg("metric") = "l2",
        "Nearest centroid of each row, (N,) int64 (ties to the lower index).");
  m.def("kmeans_init",
        [](const Tensor& x, int64_t k, const std::string& init, const std::string& metric, uint64_t seed) {
          cnn::KMeansOptions o = kmeans_options(k, 100, 1e-4, init, metric, seed, 8192, "lloyd");
          nb::gil_scoped_release g;
          return cnn::kmeans_init(x, o);
        },
        nb::arg("x"), nb::arg("k"), nb::arg("init") = "k-means++", nb::arg("metric") = "l2", nb::arg("seed") = 0,
        "The initial centroids kmeans starts from (greedy k-means++ as scikit-learn, or k distinct random rows).");
  m.def("adjusted_rand_index", &cnn::adjusted_rand_index, nb::arg("labels_a"), nb::arg("labels_b"), release_gil(),
        "Adjusted Rand index of two labelings (N,) int64: 1 for identical partitions.");

  // ---------------------------------------------------------------- readers
  data.def("read_idx", [](const FsPath& path, cf::DType dtype) { return cd::read_idx(path.string(), dtype); }, nb::arg("path"), nb::arg("dtype") = cf::kFloat32, release_gil(),
           "The tensor of an IDX file (MNIST format), plain or gzip; errors name the file.");
  data.attr("FASHION_MNIST_DIR") = cd::kFashionMnistDir;
  nb::class_<cd::FashionMnist>(data, "FashionMnist", "Fashion-MNIST: images float32 (N, 28, 28), labels int64.")
      .def_ro("train_images", &cd::FashionMnist::train_images)
      .def_ro("train_labels", &cd::FashionMnist::train_labels)
      .def_ro("test_images", &cd::FashionMnist::test_images)
      .def_ro("test_labels", &cd::FashionMnist::test_labels);
  data.def("load_fashion_mnist", [](const FsPath& dir, bool scale) { return cd::load_fashion_mnist(dir.string(), scale); },
           nb::arg("dir") = std::string(cd::kFashionMnistDir),
           nb::arg("scale") = true, release_gil(),
           "The four Fashion-MNIST files from dir (Debian package dataset-fashion-mnist); images / 255 when scale.");
  data.def("fashion_mnist_available", [](const FsPath& dir) { return cd::fashion_mnist_available(dir.string()); },
           nb::arg("dir") = std::string(cd::kFashionMnistDir),
           "Whether all four Fashion-MNIST files are in dir.");
  data.def("fashion_mnist_class_name", &cd::fashion_mnist_class_name, nb::arg("label"), "The class name of a label 0..9.");
  data.attr("FORTUNES_DIR") = cd::kFortunesDir;
  // The files' text as str; bytes that are not UTF-8 become U+FFFD one per byte, by the char tokenizer's own
  // repair, so Python sees the characters the C++ apps train on (Python's "replace" made one U+FFFD of a
  // truncated sequence; a strict decode raised a bare UnicodeDecodeError naming no file).
  auto text = [](const std::string& s) {
    const std::string repaired = cd::utf8_repair(s);
    return nb::steal<nb::str>(PyUnicode_DecodeUTF8(repaired.data(), Py_ssize_t(repaired.size()), "strict"));
  };
  data.def("read_fortune_file",
           [text](const FsPath& path) {
             std::vector<std::string> f;
             {
               nb::gil_scoped_release g;
               f = cd::read_fortune_file(path.string());
             }
             nb::list out;
             for (auto& e : f) out.append(text(e));
             return out;
           },
           nb::arg("path"), "Entries of one fortune file (separated by lines holding '%'); bad UTF-8 bytes read "
           "as U+FFFD.");
  data.def("read_fortunes",
           [text](const FsPath& dir, bool off) {
             std::vector<cd::Fortune> f;
             {
               nb::gil_scoped_release g;
               f = cd::read_fortunes(dir.string(), off);
             }
             nb::list out;
             for (auto& e : f) out.append(nb::make_tuple(text(e.category), text(e.text)));
             return out;
           },
           nb::arg("dir") = std::string(cd::kFortunesDir), nb::arg("include_offensive") = false,
           "[(category, text), ...] of every fortune file in dir (Debian package fortunes).");
  data.def("read_npy", [](const FsPath& path) { return cd::read_npy(path.string()); }, nb::arg("path"), release_gil(), "A NumPy .npy file as a tensor.");
  data.def("save_npy", [](const FsPath& path, const Tensor& t) { cd::save_npy(path.string(), t); }, nb::arg("path"), nb::arg("t"), release_gil(), "Write a .npy file atomically.");
  data.def("read_raw_float32", [](const FsPath& path, const cf::Shape& shape) { return cd::read_raw_float32(path.string(), shape); },
           nb::arg("path"), nb::arg("shape"), release_gil(),
           "A file of raw little-endian float32 values as shape.");

  // ---------------------------------------------------------------- tokenizers
  // Texts reach the tokenizer as UTF-8. A lone surrogate (surrogateescape'd bytes from file names
  // or argv) has no UTF-8 form: it becomes one U+FFFD, the tokenizer's rule for invalid bytes.
  // nanobind's own conversion refused such a str with an "incompatible function arguments" list.
  auto utf8_of = [](nb::handle s, const char* what) {
    if (!PyUnicode_Check(s.ptr()))
      throw nb::type_error((std::string("[Tokenizer] ") + what + " must be str, got " +
                            nb::type_name(s.type()).c_str()).c_str());
    Py_ssize_t size = 0;
    if (const char* utf8 = PyUnicode_AsUTF8AndSize(s.ptr(), &size)) return std::string(utf8, size_t(size));
    PyErr_Clear();  // a lone surrogate: code point by code point
    std::string out;
    const Py_ssize_t n = PyUnicode_GetLength(s.ptr());
    for (Py_ssize_t i = 0; i < n; ++i) {
      uint32_t c = PyUnicode_ReadChar(s.ptr(), i);
      if (c >= 0xD800 && c <= 0xDFFF) c = 0xFFFD;
      if (c < 0x80) {
        out += char(c);
      } else if (c < 0x800) {
        out += char(0xC0 | (c >> 6));
        out += char(0x80 | (c & 0x3F));
      } else if (c < 0x10000) {
        out += char(0xE0 | (c >> 12));
        out += char(0x80 | ((c >> 6) & 0x3F));
        out += char(0x80 | (c & 0x3F));
      } else {
        out += char(0xF0 | (c >> 18));
        out += char(0x80 | ((c >> 12) & 0x3F));
        out += char(0x80 | ((c >> 6) & 0x3F));
        out += char(0x80 | (c & 0x3F));
      }
    }
    return out;
  };
  auto corpus_of = [utf8_of](nb::iterable texts, bool words) {
    // A bare str is an iterable of characters: build_word made a vocabulary of its letters without a word
    // said (build_char counts the same characters either way, so it takes one text as given)
    CF_CHECK(!words || (!nb::isinstance<nb::str>(texts) && !nb::isinstance<nb::bytes>(texts)), DTypeError,
             "[Tokenizer] the corpus is a list of texts, got one ", nb::isinstance<nb::str>(texts) ? "str" : "bytes",
             " (wrap it: [text])");
    std::vector<std::string> out;
    for (nb::handle t : texts) out.push_back(utf8_of(t, "every corpus entry"));
    return out;
  };
  nb::enum_<cd::TokenizerKind>(data, "TokenizerKind").value("char", cd::TokenizerKind::Char).value("word", cd::TokenizerKind::Word);
  nb::class_<cd::Tokenizer>(data, "Tokenizer",
                            "Character or word tokenizer; ids 0-5 are <pad> <unk> <bos> <eos> <cls> <sep>.")
      .def_static("build_char",
                  [corpus_of](nb::iterable corpus, bool lowercase, int64_t min_count, int64_t max_size) {
                    return cd::Tokenizer::build_char(corpus_of(corpus, false), {lowercase, min_count, max_size});
                  },
                  nb::arg("corpus"), nb::arg("lowercase") = false, nb::arg("min_count") = 1, nb::arg("max_size") = 0)
      .def_static("build_word",
                  [corpus_of](nb::iterable corpus, bool lowercase, int64_t min_count, int64_t max_size) {
                    return cd::Tokenizer::build_word(corpus_of(corpus, true), {lowercase, min_count, max_size});
                  },
                  nb::arg("corpus"), nb::arg("lowercase") = false, nb::arg("min_count") = 1, nb::arg("max_size") = 0)
      .def_static("load", [](const FsPath& path) { return cd::Tokenizer::load(path.string()); }, nb::arg("path"))
      .def("save", [](const cd::Tokenizer& t, const FsPath& path) { t.save(path.string()); }, nb::arg("path"))
      .def_prop_ro("kind", &cd::Tokenizer::kind)
      .def_prop_ro("vocab_size", &cd::Tokenizer::vocab_size)
      .def_prop_ro("tokens", &cd::Tokenizer::tokens)
      .def("token", &cd::Tokenizer::token, nb::arg("id"))
      .def("id", [utf8_of](const cd::Tokenizer& t, nb::handle token) { return t.id(utf8_of(token, "token")); },
           nb::arg("token"))
      .def("split", [utf8_of](const cd::Tokenizer& t, nb::handle text) { return t.split(utf8_of(text, "text")); },
           nb::arg("text"))
      .def("encode",
           [utf8_of](const cd::Tokenizer& t, nb::handle text, bool add_bos, bool add_eos) {
             return t.encode(utf8_of(text, "text"), add_bos, add_eos);
           },
           nb::arg("text"), nb::arg("add_bos") = false, nb::arg("add_eos") = false)
      .def("decode", &cd::Tokenizer::decode, nb::arg("ids"), nb::arg("skip_special") = true)
      .def_ro_static("PAD", &cd::Tokenizer::kPad)
      .def_ro_static("UNK", &cd::Tokenizer::kUnk)
      .def_ro_static("BOS", &cd::Tokenizer::kBos)
      .def_ro_static("EOS", &cd::Tokenizer::kEos)
      .def_ro_static("CLS", &cd::Tokenizer::kCls)
      .def_ro_static("SEP", &cd::Tokenizer::kSep);

  // ---------------------------------------------------------------- datasets and loader
  nb::class_<cd::Dataset>(data, "Dataset", "Indexable examples (input, target).")
      // A Python subclass is a Python dataset (dataset_of), as torch.utils.data.Dataset's are: its __init__
      // (or super().__init__()) constructs no C++ dataset. (Not a constructor to nanobind: self is a handle,
      // so the instance stays without a C++ value, which dataset_of tells by nb::inst_ready.)
      .def("__init__", [](nb::handle) {},
           "A Python subclass needs only __len__ and __getitem__ (cf's own datasets are built by their classes).")
      .def("__len__", &cd::Dataset::size)
      .def("__getitem__", [](const cd::Dataset& d, int64_t i) {
        const int64_t n = d.size();  // a negative index counts from the end, as in Python
        CF_CHECK(i >= -n && i < n, IndexError, "[Dataset] index ", i, " out of range for ", n, " examples");
        cd::Example e = d.get(i < 0 ? i + n : i);
        // (input, target), target None for a dataset without targets (as Batch.target)
        return std::make_pair(e.input, e.target.defined() ? std::optional<Tensor>(e.target) : std::nullopt);
      });
  nb::class_<cd::TensorDataset, cd::Dataset>(data, "TensorDataset", "Rows of inputs (and targets) along axis 0.")
      .def("__init__", [](cd::TensorDataset* self, Tensor inputs, std::optional<Tensor> targets) {
             new (self) cd::TensorDataset(inputs, opt(targets));
           }, nb::arg("inputs"), nb::arg("targets").none() = nb::none());
  nb::class_<cd::SequenceDataset, cd::Dataset>(data, "SequenceDataset",
                                               "Token id sequences of varying length, with labels or target sequences.")
      .def(nb::init<std::vector<std::vector<int64_t>>>(), nb::arg("inputs"))
      .def(nb::init<std::vector<std::vector<int64_t>>, std::vector<int64_t>>(), nb::arg("inputs"), nb::arg("labels"))
      .def(nb::init<std::vector<std::vector<int64_t>>, std::vector<std::vector<int64_t>>>(), nb::arg("inputs"),
           nb::arg("target_sequences"))
      .def_static("language_model", &cd::SequenceDataset::language_model, nb::arg("sequences"));
  nb::class_<cd::Batch>(data, "Batch", "input (B, ...), target, key_padding_mask (B, N) True = padding, size, indices.")
      .def_ro("input", &cd::Batch::input)
      .def_prop_ro("target", [](const cd::Batch& b) -> std::optional<Tensor> {
        if (!b.target.defined()) return std::nullopt;
        return b.target;
      })
      .def_prop_ro("key_padding_mask", [](const cd::Batch& b) -> std::optional<Tensor> {
        if (!b.key_padding_mask.defined()) return std::nullopt;
        return b.key_padding_mask;
      })
      .def_ro("size", &cd::Batch::size)
      .def_ro("indices", &cd::Batch::indices)
      // `for x, y in loader`, as with PyTorch's (input, target) batches
      .def("__iter__",
           [](nb::handle self) {
             nb::object target = self.attr("target");
             return nb::iter(nb::make_tuple(self.attr("input"), target));
           },
           nb::sig("def __iter__(self) -> collections.abc.Iterator[cf._cf.Tensor | None]"),
           "x, y = batch: (input, target), target None when the dataset has none; key_padding_mask, size and "
           "indices stay attributes.");
  nb::class_<cd::DataLoader>(data, "DataLoader",
                             "Batches of a dataset: Philox-seeded shuffle per epoch, padding collate with key padding "
                             "masks, drop_last, resumable state, optional prefetch thread.",
                             nb::type_slots(loader_slots))
      .def("__init__",
           [](cd::DataLoader* self, nb::handle dataset, int64_t batch_size, bool shuffle, std::optional<uint64_t> seed,
              bool drop_last, int64_t pad_id, int64_t target_pad, int64_t pad_to_multiple, int64_t prefetch,
              int64_t num_replicas, int64_t rank) {
             // No seed: one drawn from the default generator, so cf.manual_seed sets the shuffle as it sets
             // every other draw (PyTorch's loader follows torch.manual_seed; a fixed 0 gave every seed of an
             // experiment the same batch order).
             // A distributed loader's ranks must build the same order: each rank's default generator may be
             // elsewhere (a script seeding base + rank for its dropout), so it takes no drawn seed.
             CF_CHECK(seed || num_replicas <= 1 || !shuffle, ValueError, "[DataLoader] a distributed loader "
                      "(num_replicas ", num_replicas, ") that shuffles needs seed=, the same on every rank (a seed "
                      "drawn from each rank's default generator could differ: examples skipped or repeated)");
             if (!seed) {
               cf::Generator& g = cf::default_generator();
               const uint64_t counter = g.reserve(1);
               const cf::PhiloxOut r = cf::philox4x32_10(g.seed(), counter);
               seed = (uint64_t(r.v[0]) << 32) | r.v[1];
             }
             cd::DataLoaderOptions o{batch_size, shuffle, *seed,   drop_last,    pad_id, target_pad,
                                     pad_to_multiple, prefetch, num_replicas, rank};
             std::shared_ptr<cd::Dataset> ds = dataset_of(dataset, prefetch);
             new (self) cd::DataLoader(std::move(ds), o);
           },
           nb::arg("dataset"), nb::arg("batch_size") = 1, nb::arg("shuffle") = false, nb::arg("seed") = nb::none(),
           nb::arg("drop_last") = false, nb::arg("pad_id") = 0, nb::arg("target_pad") = -100,
           nb::arg("pad_to_multiple") = 1, nb::arg("prefetch") = 0, nb::arg("num_replicas") = 1, nb::arg("rank") = 0,
           nb::sig("def __init__(self, dataset: cf._cf.data.Dataset | collections.abc.Sequence[object], "
                   "batch_size: int = 1, shuffle: bool = False, seed: int | None = None, drop_last: bool = False, "
                   "pad_id: int = 0, target_pad: int = -100, pad_to_multiple: int = 1, prefetch: int = 0, "
                   "num_replicas: int = 1, rank: int = 0) -> None"),
           "dataset: a cf.data dataset, or any object with __len__ and __getitem__ whose items are (input, "
           "target), (input,) or the input (cf.Tensor, NumPy array, lists or a number; prefetch 0 then). seed: "
           "the shuffle's; None draws one from the default generator (cf.manual_seed sets it). "
           "Distributed (cf.nn.DistributedDataParallel): num_replicas=cf.dist.world_size(), rank=cf.dist.rank(): "
           "each rank takes its share of every global batch of batch_size x num_replicas examples.")
      .def("__len__", &cd::DataLoader::size)
      .def_prop_ro("seed", [](const cd::DataLoader& l) { return l.options().seed; },
                   "The shuffle's seed (the one drawn when none was given): pass it again to rebuild this order.")
      .def("set_epoch", &cd::DataLoader::set_epoch, nb::arg("epoch"))
      .def_prop_ro("state", [](const cd::DataLoader& l) { return std::make_pair(l.state().epoch, l.state().batch); },
                   "(epoch, next batch), for checkpoints.")
      .def("set_state", [](cd::DataLoader& l, int64_t epoch, int64_t batch) { l.set_state({epoch, batch}); },
           nb::arg("epoch"), nb::arg("batch"))
      .def("batch", &cd::DataLoader::batch, nb::arg("epoch"), nb::arg("index"), release_gil(),
           "Batch `index` of `epoch`, built directly (no state change).")
      .def("__iter__", [](nb::handle self) {
        return LoaderPass{nb::borrow(self), ++pass_generations()[nb::inst_ptr<cd::DataLoader>(self)]};
      }, "A pass over the rest of the current epoch (the loader's state: a resumed loader continues where it "
         "stood). A newer iter() of the same loader ends the older pass, whose next step raises.")
      .def("__next__", &next_batch,
           "The next batch of the current epoch; at its end StopIteration, and the next iteration runs the next epoch.");
  nb::class_<LoaderPass>(data, "_LoaderPass", "One iter() of a DataLoader: the rest of the current epoch.",
                         nb::type_slots(pass_slots))
      .def("__iter__", [](nb::handle self) { return self; })
      .def("__next__", [](LoaderPass& p) {
        if (p.done) throw nb::stop_iteration();
        cd::DataLoader& l = nb::cast<cd::DataLoader&>(p.loader);
        CF_CHECK(pass_generations()[&l] == p.generation, ValueError,
                 "[DataLoader] this loop's pass was ended by a newer iter() of the same loader (a loop nested "
                 "over one loader: the inner loop went on to the next epoch): one pass at a time; "
                 "loader.batch(epoch, index) reads any batch without moving the loader");
        cd::Batch b;
        if (!next_batch_into(l, b)) {
          p.done = true;
          throw nb::stop_iteration();
        }
        return b;
      });
}

}  // namespace cfpy
