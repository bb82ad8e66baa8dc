#include <xshard/tensor/expression.hpp>
// Must not compile: the product of two pending sums is not the product of the sums.
using M = xshard::mesh<"dp", "mp">;
using P = xshard::dtensor<double, M, "[-, mp] partial(sum: dp)">;
auto f(const P& a, const P& b) {
    return a * b;
}
