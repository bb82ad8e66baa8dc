#include <xshard/tensor/expression.hpp>
// Must not compile: adding tensors of different layouts needs a redistribution.
using M = xshard::mesh<"dp", "mp">;
auto f(const xshard::dtensor<double, M, "[dp, mp]">& a,
       const xshard::dtensor<double, M, "[mp, dp]">& b) {
    return a + b;
}
