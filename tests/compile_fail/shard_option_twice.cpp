#include <xshard/shard/shard.hpp>
// Must not compile: an option given twice (which level would hold?).
using M = xshard::mesh<"dp", "mp">;
auto f(const M& m) {
    return xshard::shard(
        m, [](const auto& x) { return x; }, std::tuple(xshard::none), xshard::none,
        xshard::sharding_propagation{.level = 1}, xshard::sharding_propagation{.level = 2});
}
