#include <xshard/tensor/dtensor.hpp>
// Must not compile: a rank-2 layout for a rank-3 shard.
auto f(const xshard::mesh<"dp", "mp">& m, const xt::xtensor<double, 3>& local) {
    return xshard::from_local<"[dp, mp]">(m, std::array<std::size_t, 3>{2, 2, 2}, local);
}
