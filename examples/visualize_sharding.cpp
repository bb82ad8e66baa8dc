// Which rank holds which block: a few layouts of a matrix on a dp x mp mesh, uneven
// shapes included, drawn as text grids. Every drawing is checked against the tensor
// itself: distributing and gathering it back gives the original matrix.
//
//   mpirun -n 4 build/examples/visualize_sharding
#include <xshard/core.hpp>
#include <xshard/tensor.hpp>

#include <xtensor/xbuilder.hpp>
#include <xtensor/xmanipulation.hpp>

#include <cstdio>

using mesh_2d = xshard::mesh<"dp", "mp">;

template <xshard::layout L>
bool show(const mesh_2d& mesh, const xt::xtensor<double, 2>& matrix) {
    const auto t = xshard::distribute<L>(mesh, matrix);
    const bool same = xshard::gather_all(t) == matrix;
    if (mesh.rank() == 0)
        std::printf("%s%s\n", xshard::draw_sharding(t).c_str(),
                    same ? "round trip ok" : "ROUND TRIP WRONG");
    return same;
}

/// The example itself; main reports its errors.
int run() {
    const int world = xshard::communicator::world().size();
    const mesh_2d mesh({xshard::auto_size, world % 2 == 0 ? 2 : 1});

    const xt::xtensor<double, 2> even = xt::reshape_view(xt::arange<double>(64), {8, 8});
    const xt::xtensor<double, 2> uneven = xt::reshape_view(xt::arange<double>(35), {7, 5});

    bool ok = show<"[dp, mp]">(mesh, even);
    ok &= show<"[dp, mp]">(mesh, uneven);               // 7 rows over dp: 4 + 3
    ok &= show<"[(dp,mp), -]">(mesh, uneven);           // rows over all ranks
    ok &= show<"[-, (mp,dp)]">(mesh, uneven);           // columns, mp major
    ok &= show<"[mp, -]">(mesh, uneven);                // replicated over dp
    ok &= show<"[-, mp] partial(sum: dp)">(mesh, even); // pending sum over dp
    return ok ? 0 : 1;
}

int main(int argc, char** argv) {
    xshard::environment env(argc, argv);
    return xshard::report_errors([&] { return run(); });
}
