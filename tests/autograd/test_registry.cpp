#include "test_util.h"

using namespace cf;
using namespace cf::test;

TEST_SUITE("autograd") {

TEST_CASE("every differentiable op in the registry has a gradcheck case") {
  std::vector<std::string> missing;
  for (const OpInfo& op : op_registry())
    if (op.differentiable && !gradcheck_cases().count(op.name)) missing.push_back(op.name);
  std::string list;
  for (auto& m : missing) list += m + " ";
  CHECK_MESSAGE(missing.empty(), "ops without a gradcheck case: ", list);
  // And no case names an op the registry does not know.
  for (const std::string& c : gradcheck_cases()) CHECK_MESSAGE(find_op(c), c, " is not registered");
}

TEST_CASE("registry names are unique") {
  std::set<std::string> seen;
  for (const OpInfo& op : op_registry()) CHECK_MESSAGE(seen.insert(op.name).second, op.name);
}

}
