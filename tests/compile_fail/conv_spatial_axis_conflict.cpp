// A convolution whose input splits the image's height over the axis that also splits the
// weight's output channels: the output would carry one mesh axis on two dimensions. Spatial
// parallelism itself is served (halo exchange); this layout is not, and the rule says so at
// compile time.
#include <xshard/ops/conv_rule.hpp>

static_assert(
    xshard::conv_rule_holds_v<xshard::conv2d_rule("[dp, -, mp, -]", "[mp, -, -, -]").problem>);

int main() {}
