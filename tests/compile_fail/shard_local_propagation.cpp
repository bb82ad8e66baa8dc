#include <xshard/shard/shard.hpp>
// Must not compile: shard_local's callable gets local arrays whose layouts its specs declare;
// there is nothing for sharding_propagation to derive.
using M = xshard::mesh<"dp", "mp">;
auto f(const M& m) {
    return xshard::shard_local(
        m, [](const auto& x) { return x; }, std::tuple(xshard::none), xshard::spec<"[dp, -]">,
        xshard::sharding_propagation{.level = 1});
}
