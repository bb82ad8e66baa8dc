#include <xshard/ops/matmul.hpp>
// Must not compile: the contraction dimension is split over dp on one side, mp on the other.
using M = xshard::mesh<"dp", "mp">;
auto f(const xshard::dtensor<double, M, "[-, dp]">& a,
       const xshard::dtensor<double, M, "[mp, -]">& b) {
    return xshard::ops::matmul(a, b);
}
