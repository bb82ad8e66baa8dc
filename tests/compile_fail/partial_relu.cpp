#include <xshard/ops/elementwise.hpp>
// Must not compile: relu of a pending sum is not the relu of the sum.
using M = xshard::mesh<"dp", "mp">;
auto f(const xshard::dtensor<double, M, "[-, mp] partial(sum: dp)">& t) {
    return xshard::ops::relu(t);
}
