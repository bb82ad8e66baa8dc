// Fusion (train/fusion.hpp): the records of a container's parameters, and buckets that
// never mix keys, close at the byte limit and keep the order every rank computes alike.

#include <xshard/tensor/distribute.hpp>
#include <xshard/train/fusion.hpp>

#include "mpi_test.hpp"

#include <gtest/gtest.h>

#include <cstddef>
#include <map>
#include <string>
#include <vector>

namespace {

/// Records of the given byte sizes (elements of one byte).
std::vector<xshard::detail::param_ref> refs_of(const std::vector<std::size_t>& bytes) {
    std::vector<xshard::detail::param_ref> refs(bytes.size());
    for (std::size_t i = 0; i < bytes.size(); ++i) {
        refs[i].count = bytes[i];
        refs[i].element = 1;
    }
    return refs;
}

/// The members of each bucket.
std::vector<std::vector<std::size_t>> members(const std::vector<xshard::detail::bucket>& bs) {
    std::vector<std::vector<std::size_t>> out;
    for (const auto& b : bs)
        out.push_back(b.members);
    return out;
}

TEST(fusion, buckets_close_at_the_limit_and_never_mix_keys) {
    const auto refs = refs_of({4, 4, 4, 10, 1, 3});
    const std::vector<std::size_t> all{0, 1, 2, 3, 4, 5};
    auto one_key = [](std::size_t) {
        return 0;
    };
    using list = std::vector<std::vector<std::size_t>>;
    // Up to 8 bytes: {0, 1}, {2}, {3} alone although larger than the limit, {4, 5}.
    const auto b8 = xshard::detail::make_buckets<int>(refs, all, 8, one_key);
    EXPECT_EQ(members(b8), (list{{0, 1}, {2}, {3}, {4, 5}}));
    EXPECT_EQ(b8[0].bytes, 8u);
    EXPECT_EQ(b8[3].bytes, 4u);
    // 0: one parameter per bucket.
    EXPECT_EQ(members(xshard::detail::make_buckets<int>(refs, all, 0, one_key)),
              (list{{0}, {1}, {2}, {3}, {4}, {5}}));
    // Two keys (even and odd indices): buckets per key, keys in order, members in order.
    auto parity = [](std::size_t i) {
        return int(i % 2);
    };
    EXPECT_EQ(members(xshard::detail::make_buckets<int>(refs, all, 100, parity)),
              (list{{0, 2, 4}, {1, 3, 5}}));
    // Only the chosen records, in the chosen order.
    EXPECT_EQ(members(xshard::detail::make_buckets<int>(refs, {5, 0, 3}, 100, one_key)),
              (list{{5, 0, 3}}));
}

TEST(fusion, records_describe_each_parameter_and_pack_round_trips) {
    const auto w = xshard::testing::world();
    const xshard::mesh<"x"> m(w, {w.size()});
    using T = xshard::dtensor<double, xshard::mesh<"x">, xshard::dynamic_layout(1)>;
    std::map<std::string, T> params{
        {"a", xshard::full<double, xshard::dynamic_layout(1)>(m, {7}, 1.0, xshard::layout("[x]"))},
        {"b", xshard::full<double, xshard::dynamic_layout(1)>(m, {3}, 2.0, xshard::layout("[-]"))}};
    auto refs = xshard::detail::param_refs(params);
    ASSERT_EQ(refs.size(), 2u);
    EXPECT_EQ(refs[0].name, "a");
    EXPECT_EQ(refs[1].name, "b");
    EXPECT_EQ(refs[0].count, params.at("a").local().size());
    EXPECT_EQ(refs[1].count, 3u);
    EXPECT_EQ(refs[0].element, sizeof(double));
    EXPECT_FALSE(xshard::detail::first_problem(refs).has_value());
    // Every rank computes every rank's block size: the sizes add up to the tensor.
    std::size_t total = 0;
    for (int r = 0; r < m.size(); ++r)
        total += refs[0].block_bytes(r);
    EXPECT_EQ(total, 7 * sizeof(double));
    // The replicated parameter's redundant copies span the mesh; the split one's none.
    EXPECT_EQ(refs[1].group->size(), m.size());
    EXPECT_EQ(refs[0].group->size(), 1);
    // Pack then unpack through one buffer restores the values.
    xshard::detail::bucket b{{0, 1}, refs[0].bytes() + refs[1].bytes(), 0};
    std::vector<std::byte> buffer(b.bytes);
    xshard::detail::pack(refs, b, buffer.data());
    params.at("a").local().fill(0.0);
    params.at("b").local().fill(0.0);
    xshard::detail::unpack(refs, b, buffer.data());
    for (double x : params.at("a").local())
        EXPECT_EQ(x, 1.0);
    for (double x : params.at("b").local())
        EXPECT_EQ(x, 2.0);
}

} // namespace
