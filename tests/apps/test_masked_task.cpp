// cf-approx --task masked's stream and windows (apps/approx/masked_task.h): texts joined with a <sep>
// between them, and a <sep> drawn for hiding stays visible and unscored (it is no character).
#include "apps/approx/masked_task.h"
#include "test_util.h"

using namespace cf;
using namespace cf::test;

TEST_SUITE("apps") {

TEST_CASE("cf-approx masked task: texts joined with <sep>, which is never hidden or scored") {
  apps::TopicSplit split;
  split.ids = {{10, 11, 12}, {13}, {14, 15}};
  const int64_t sep = data::Tokenizer::kSep;
  const std::vector<int64_t> stream = apps::join_texts(split);
  CHECK(stream == std::vector<int64_t>{10, 11, 12, sep, 13, sep, 14, 15});
  const std::vector<bool> hide(8, true);  // every position drawn
  const apps::MaskedBatch b = apps::masked_windows(stream, {0}, 8, hide, 99, Device::cpu());
  CHECK(b.ids.to_vector<int64_t>() == std::vector<int64_t>{99, 99, 99, sep, 99, sep, 99, 99});
  CHECK(b.targets.to_vector<int64_t>() == std::vector<int64_t>{10, 11, 12, -100, 13, -100, 14, 15});
  CHECK(b.hidden == 6);
}

TEST_CASE("topic data: text_prefix keeps the first max_len code points") {
  CHECK(apps::text_prefix("héllo wörld", 4) == "héll");
  CHECK(apps::text_prefix("ab", 5) == "ab");
  CHECK(apps::text_prefix("😀x", 1) == "😀");
}

}  // TEST_SUITE
