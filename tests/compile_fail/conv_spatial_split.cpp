// A convolution whose input splits the image's height: spatial parallelism needs a halo
// exchange, which the convolution rule does not serve; the rule says so at compile time.
#include <xshard/ops/conv_rule.hpp>

static_assert(
    xshard::conv_rule_holds_v<xshard::conv2d_rule("[dp, -, mp, -]", "[-, -, -, -]").problem>);

int main() {}
