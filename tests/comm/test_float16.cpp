// The 16-bit floating-point types (comm/float16.hpp): conversions round to nearest even.

#include <xshard/comm/float16.hpp>

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>

namespace {

TEST(float16, conversions_round_to_nearest_even) {
    EXPECT_EQ(float(xshard::float16(1.0f)), 1.0f);
    EXPECT_EQ(float(xshard::float16(65504.0f)), 65504.0f);
    EXPECT_TRUE(std::isinf(float(xshard::float16(70000.0f))));
    EXPECT_EQ(float(xshard::float16(1.0f + 1.0f / 2048)), 1.0f);                     // tie -> even
    EXPECT_EQ(float(xshard::float16(1.0f + 3.0f / 2048)), 1.0f + 2.0f / 1024);       // tie -> even
    EXPECT_EQ(float(xshard::float16(std::ldexp(1.0f, -24))), std::ldexp(1.0f, -24)); // subnormal
    EXPECT_EQ(float(xshard::bfloat16(1.0f + 1.0f / 256)), 1.0f);                     // tie -> even
    EXPECT_EQ(float(xshard::bfloat16(3.0f)), 3.0f);
    for (std::uint16_t b = 0; b < 0x7c00; ++b) // every finite half round-trips
        ASSERT_EQ(xshard::float16(float(xshard::float16::from_bits(b))).bits, b);
}

} // namespace
