// libFuzzer target: the line-based text readers on the same bytes:
// read_labelled_texts (label TAB text, escapes) and read_mnist_csv (785 integer
// columns), both through io::for_each_line (CRLF, a last line without '\n').
#include "fuzz_util.h"
#include "nn/data/labelled_text.h"
#include "nn/data/mnist_csv.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  cf::fuzz::MemFile f(data, size);
  cf::fuzz::expect_cf_errors_only([&] {
    size_t n = 0;
    for (const cf::data::LabelledText& t : cf::data::read_labelled_texts(f.path())) n += t.label.size() + t.text.size();
    if (n == 1) std::puts("");
  });
  cf::fuzz::expect_cf_errors_only([&] {
    cf::data::MnistCsv d = cf::data::read_mnist_csv(f.path());
    if (d.labels.numel() == 1) std::puts("");
  });
  return 0;
}
