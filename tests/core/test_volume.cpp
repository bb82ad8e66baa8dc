// Checked size arithmetic (core/volume.hpp), fixed-capacity vectors (core/static_vector.hpp)
// and axis names and sets (core/axis.hpp), at compile time where they are constexpr and at
// run time where they throw.

#include <xshard/comm/error.hpp>
#include <xshard/core/axis.hpp>
#include <xshard/core/static_vector.hpp>
#include <xshard/core/volume.hpp>

#include <gtest/gtest.h>

#include <array>
#include <cstddef>
#include <limits>
#include <string>
#include <vector>

namespace {

constexpr std::size_t max = std::numeric_limits<std::size_t>::max();

static_assert(xshard::volume({}) == 1);
static_assert(xshard::volume({3, 4, 5}) == 60);
static_assert(xshard::volume({max, 0}) == 0); // a zero extent: empty, not an overflow
static_assert(xshard::volume(std::array<int, 2>{6, 7}) == 42);
static_assert(xshard::checked_mul(max, 1) == max);
static_assert(xshard::checked_add(max - 1, 1) == max);

static_assert(xshard::is_valid_axis_name("dp") && xshard::is_valid_axis_name("axis_2"));
static_assert(!xshard::is_valid_axis_name("") && !xshard::is_valid_axis_name("2dp") &&
              !xshard::is_valid_axis_name("d-p") &&
              !xshard::is_valid_axis_name("sixteen_letters_"));
static_assert(xshard::axis_name("mp") == xshard::axis_name("mp") &&
              !(xshard::axis_name("mp") == xshard::axis_name("m")));
static_assert(xshard::axis_name("tp").view() == "tp");

constexpr auto s = xshard::axis_set::of(0).with(2);
static_assert(s.contains(0) && !s.contains(1) && s.contains(2) && s.size() == 2);
static_assert(s.without(0) == xshard::axis_set::of(2));
static_assert((s | xshard::axis_set::of(1)) == xshard::axis_set::first(3));
static_assert((s & xshard::axis_set::first(2)) == xshard::axis_set::of(0));
static_assert((xshard::axis_set::first(3) - s) == xshard::axis_set::of(1));
static_assert(xshard::axis_set{}.empty() && xshard::axis_set{}.size() == 0);

constexpr xshard::static_vector<int, 4> make() {
    xshard::static_vector<int, 4> v{1, 2};
    v.push_back(3);
    v.pop_back();
    v.push_back(5);
    return v;
}
static_assert(make().size() == 3 && make()[2] == 5 && make().back() == 5 && make().contains(2));
static_assert(!make().contains(3)); // popped
static_assert(decltype(make())::capacity() == 4);
// Equality looks at the used elements only: a popped value left behind does not count.
static_assert(make() == xshard::static_vector<int, 4>{1, 2, 5});
static_assert(!(make() == xshard::static_vector<int, 4>{1, 2}));

/// A structural type: usable as a template argument.
template <xshard::static_vector<int, 4> V>
constexpr std::size_t size_of = V.size();
static_assert(size_of<make()> == 3);

TEST(volume, overflow_throws_an_error_naming_the_quantity) {
    EXPECT_EQ(xshard::volume(std::vector<std::size_t>{2, 3, 7}), 42u);
    try {
        (void)xshard::volume({std::size_t(1) << 33, std::size_t(1) << 33});
        FAIL() << "no overflow reported";
    } catch (const xshard::error& e) {
        EXPECT_EQ(std::string(e.what()), "xshard: the number of elements overflows: 8589934592 x "
                                         "8589934592");
    }
    EXPECT_THROW((void)xshard::checked_add(max, 1, "the file size"), xshard::error);
    try {
        (void)xshard::checked_mul(max / 2 + 1, 2, "the header size");
        FAIL();
    } catch (const xshard::error& e) {
        EXPECT_NE(std::string(e.what()).find("the header size overflows"), std::string::npos)
            << e.what();
    }
}

TEST(static_vector, iterates_over_the_used_elements) {
    auto v = make();
    int sum = 0;
    for (int x : v)
        sum += x;
    EXPECT_EQ(sum, 8);
    v.clear();
    EXPECT_TRUE(v.empty());
    EXPECT_EQ(v.begin(), v.end());
}

} // namespace
