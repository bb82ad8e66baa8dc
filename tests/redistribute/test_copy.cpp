// Boxes inside local shards (redistribute/copy.hpp) against element-by-element copies, and
// the alpha-beta cost model (redistribute/cost_model.hpp) against its documented formula.

#include <xshard/redistribute/copy.hpp>
#include <xshard/redistribute/cost_model.hpp>

#include <gtest/gtest.h>

#include <array>
#include <cstddef>
#include <random>
#include <vector>

namespace {

using shape3 = std::array<std::size_t, 3>;

/// The flat index of global element `g` in an array of `shape` at global `origin`.
std::size_t flat(const shape3& shape, const shape3& origin, const shape3& g) {
    return ((g[0] - origin[0]) * shape[1] + (g[1] - origin[1])) * shape[2] + (g[2] - origin[2]);
}

/// A random box inside the array of `shape` at `origin`.
xshard::box<3> random_box(std::mt19937& rng, const shape3& shape, const shape3& origin) {
    xshard::box<3> b;
    for (std::size_t d = 0; d < 3; ++d) {
        const std::size_t lo = std::uniform_int_distribution<std::size_t>(0, shape[d])(rng);
        const std::size_t hi = std::uniform_int_distribution<std::size_t>(lo, shape[d])(rng);
        b.offset[d] = origin[d] + lo;
        b.extent[d] = hi - lo;
    }
    return b;
}

TEST(copy, regions_land_where_element_by_element_copies_put_them) {
    std::mt19937 rng(11);
    std::uniform_int_distribution<std::size_t> extent(1, 5), shift(0, 3);
    for (int trial = 0; trial < 2000; ++trial) {
        shape3 from_shape, to_shape, from_origin, to_origin;
        for (std::size_t d = 0; d < 3; ++d) {
            from_shape[d] = extent(rng);
            from_origin[d] = shift(rng);
        }
        // The region lies in both arrays: the destination covers it plus random margins.
        const auto region = random_box(rng, from_shape, from_origin);
        for (std::size_t d = 0; d < 3; ++d) {
            const std::size_t before = std::min(region.offset[d], shift(rng));
            to_origin[d] = region.offset[d] - before;
            to_shape[d] = before + region.extent[d] + shift(rng);
        }
        std::vector<int> from(from_shape[0] * from_shape[1] * from_shape[2]);
        for (std::size_t i = 0; i < from.size(); ++i)
            from[i] = int(i) + 1;
        std::vector<int> to(to_shape[0] * to_shape[1] * to_shape[2], 0), expected = to;
        for (std::size_t i = 0; i < region.extent[0]; ++i)
            for (std::size_t j = 0; j < region.extent[1]; ++j)
                for (std::size_t k = 0; k < region.extent[2]; ++k) {
                    const shape3 g{region.offset[0] + i, region.offset[1] + j,
                                   region.offset[2] + k};
                    expected[flat(to_shape, to_origin, g)] = from[flat(from_shape, from_origin, g)];
                }
        xshard::detail::copy_region(from.data(), from_shape, from_origin, to.data(), to_shape,
                                    to_origin, region);
        ASSERT_EQ(to, expected) << "trial " << trial;
        if (!region.empty()) {
            EXPECT_EQ(xshard::detail::offset_in(from_shape, from_origin, region),
                      flat(from_shape, from_origin, region.offset));
        }
    }
}

TEST(copy, contiguity_means_consecutive_offsets) {
    std::mt19937 rng(12);
    std::uniform_int_distribution<std::size_t> extent(1, 4);
    for (int trial = 0; trial < 2000; ++trial) {
        const shape3 shape{extent(rng), extent(rng), extent(rng)}, origin{0, 0, 0};
        const auto region = random_box(rng, shape, origin);
        if (region.empty())
            continue;
        // Every element of the region, in order: consecutive flat indices or not.
        bool consecutive = true;
        std::size_t next = flat(shape, origin, region.offset);
        for (std::size_t i = 0; i < region.extent[0]; ++i)
            for (std::size_t j = 0; j < region.extent[1]; ++j)
                for (std::size_t k = 0; k < region.extent[2]; ++k) {
                    const shape3 g{region.offset[0] + i, region.offset[1] + j,
                                   region.offset[2] + k};
                    consecutive = consecutive && flat(shape, origin, g) == next++;
                }
        EXPECT_EQ(xshard::detail::is_contiguous_in(shape, region), consecutive)
            << "trial " << trial;
    }
}

TEST(copy, streaming_copies_every_byte_at_every_alignment_and_nothing_else) {
    // Destinations and sources at every offset within a cache line (the head up to the
    // line boundary is copied apart), lengths around the line and a long run; the bytes on
    // both sides of the destination stay untouched.
    constexpr std::size_t guard = 128;
    std::vector<unsigned char> from(4096 + 2 * guard);
    for (std::size_t i = 0; i < from.size(); ++i)
        from[i] = static_cast<unsigned char>(i * 7 + 3);
    for (const std::size_t n :
         {std::size_t(0), std::size_t(1), std::size_t(63), std::size_t(64), std::size_t(65),
          std::size_t(127), std::size_t(200), std::size_t(4000)})
        for (std::size_t to_shift = 0; to_shift < 64; ++to_shift)
            for (const std::size_t from_shift : {std::size_t(0), std::size_t(8), to_shift}) {
                alignas(64) std::array<unsigned char, 4096 + 2 * guard> to;
                to.fill(0xA5);
                xshard::detail::stream_copy(to.data() + guard + to_shift, from.data() + from_shift,
                                            n);
                xshard::detail::stream_fence();
                for (std::size_t i = 0; i < to.size(); ++i) {
                    const bool inside = i >= guard + to_shift && i < guard + to_shift + n;
                    const unsigned char want =
                        inside ? from[from_shift + (i - guard - to_shift)] : 0xA5;
                    ASSERT_EQ(to[i], want) << "n " << n << " destination offset " << to_shift
                                           << " source offset " << from_shift << " byte " << i;
                }
            }
}

TEST(cost_model, a_step_costs_alpha_per_message_beta_per_byte_and_copy_per_copied_byte) {
    xshard::cost_model m;
    m.all_gather = {1.0, 0.5};
    m.all_reduce = {2.0, 0.25};
    m.exchange = {3.0, 0.125};
    m.copy = 0.0625;
    EXPECT_EQ(m.seconds(xshard::step_kind::all_gather, 3, 8, 16), 3 * 1.0 + 8 * 0.5 + 16 * 0.0625);
    EXPECT_EQ(m.seconds(xshard::step_kind::all_reduce, 2, 8, 0), 2 * 2.0 + 8 * 0.25);
    // Kinds without a collective of their own are priced as an exchange.
    EXPECT_EQ(m.seconds(xshard::step_kind::exchange, 1, 8, 0), 3.0 + 8 * 0.125);
    EXPECT_EQ(m.seconds(xshard::step_kind::slice, 0, 0, 16), 16 * 0.0625);
    static_assert(xshard::cost_model{}.seconds(xshard::step_kind::all_to_all, 0, 0, 0) == 0);
}

} // namespace
