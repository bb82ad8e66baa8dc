#include <xshard/ops/spatial.hpp>
// Must not compile: a window over pending max terms (the halo adjoint is a sum).
using M = xshard::mesh<"dp", "sp">;
void f(const xshard::dtensor<float, M, "[-, -, sp, -] partial(max: dp)">& x) {
    xshard::ops::spatial_op op(x, xshard::windowed_dims{{2, {3, 1, 1, 1, 1}}});
}
