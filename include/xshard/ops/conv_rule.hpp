#pragma once
/// \file
/// The sharding rules of convolutional layers on NCHW activations: conv2d, the pooling
/// windows and 2-D batch normalisation. From the layouts of the input x [N, C, H, W] (and the
/// weight w [Cout, Cin / groups, kh, kw]) they give the layouts the operands take and the
/// output's:
///
/// - N split = data parallelism: each rank convolves its images; the weight's gradient is
///   each rank's term (summed by `synchronize_gradients`).
/// - output channels split (w [mp, -, -, -]) = model parallelism: y [N, mp, H', W'], no
///   message forward; the input's gradient is each rank's term.
/// - input channels split (x [N, mp, H, W], w [-, mp, -, -]) = partial sums: y is
///   partial(sum: mp), resolved by an all-reduce where a consumer needs it.
/// - height and/or width split = spatial parallelism: each rank holds a band of rows
///   (columns); the output keeps the split (y [N, -, sp, -]) and the layers gather the halo
///   rows their windows need through the planner's `halo` step (ops/spatial.hpp,
///   redistribute/halo.hpp) before the local kernel. The spatial axes must differ from the
///   weight's channel axes (`conv_problem::axis_conflict`); bands thinner than the halo are
///   an `xshard::error` of the halo plan, on every rank alike.
///
/// They speak core/rule.hpp's vocabulary, like the rules of ops/rules.hpp: constexpr
/// functions of layout values whose problem (`conv_problem`) is a compile error quoting its
/// sentence for layout types (`rule_holds_v`) and an `xshard::error`, the same on every rank,
/// for run-time layouts (`raise_rule_problem`).

#include <xshard/comm/error.hpp>
#include <xshard/core/layout.hpp>
#include <xshard/core/rule.hpp>

#include <cstdint>
#include <string>
#include <string_view>

namespace xshard {

/// Why a convolutional layer cannot run on the layouts it was given.
enum class conv_problem : std::uint8_t {
    none,
    not_nchw,         ///< the input is not rank 4 or the weight not rank 4
    kernel_split,     ///< the weight's kernel dimensions are split
    partial_input,    ///< the input is a pending sum
    channel_mismatch, ///< input channels split unlike the weight's input channels
    axis_conflict,    ///< one mesh axis on two dimensions of the output
    grouped_split,    ///< channels split in a grouped convolution
};

/// The outcome of a convolutional rule (a `rule_outcome`): the layouts the operands take and
/// the output's.
struct conv_rule_result {
    layout x;
    layout w;
    layout out;
    conv_problem problem = conv_problem::none;
};

/// Throws `xshard::error` "xshard: <operation>: <sentence>" for problem `p` (nothing for
/// `conv_problem::none`); in a constant expression the throw is a compile error quoting the
/// sentence.
constexpr void raise_rule_problem(conv_problem p, std::string_view operation) {
    const std::string where = detail::rule_where(operation);
    switch (p) {
    case conv_problem::none:
        return;
    case conv_problem::not_nchw:
        throw error(where + "the input must be [N, C, H, W] and the weight "
                            "[Cout, Cin / groups, kh, kw] (rank 4 both)");
    case conv_problem::kernel_split:
        throw error(where + "the weight's kernel dimensions cannot be split; split its output "
                            "or input channels");
    case conv_problem::partial_input:
        throw error(where + "the input is a partial tensor (pending sum); resolve it first");
    case conv_problem::channel_mismatch:
        throw error(where + "the input's channels and the weight's input channels are split "
                            "over different mesh axes; redistribute one of them");
    case conv_problem::axis_conflict:
        throw error(where + "the output would put one mesh axis on two dimensions (the batch, "
                            "height or width split like the weight's channels); use another "
                            "axis");
    case conv_problem::grouped_split:
        throw error(where + "a grouped convolution (groups > 1) needs its channels whole; "
                            "split the batch");
    }
}

/// The same as `raise_rule_problem(p, operation)`, by the name it also has.
constexpr void raise_conv_problem(conv_problem p, std::string_view operation) {
    raise_rule_problem(p, operation);
}

/// The same as `rule_holds_v<P>`, by the name it also has.
template <conv_problem P>
inline constexpr bool conv_rule_holds_v = rule_holds_v<P>;

namespace detail {

/// The checks every NCHW activation passes: rank 4, no pending sum.
constexpr conv_rule_result check_nchw(conv_rule_result r, const layout& x) {
    if (x.rank() != 4)
        return fail(r, conv_problem::not_nchw);
    if (x.is_partial())
        r = fail(r, conv_problem::partial_input);
    return r;
}

} // namespace detail

/// conv2d(x, w, groups): y [x.N, w.Cout, x.H, x.W] partial(sum: the input channels' axes). A
/// replicated input is sliced to the weight's input-channel split (free); an input-channel
/// split the weight lacks is a mismatch (the weight's layout is the layer's choice).
constexpr conv_rule_result conv2d_rule(const layout& x, const layout& w, std::size_t groups = 1) {
    conv_rule_result r{x, w, layout::replicated(4)};
    if (x.rank() != 4 || w.rank() != 4)
        return detail::fail(r, conv_problem::not_nchw);
    r = detail::check_nchw(r, x);
    if (w.is_split(2) || w.is_split(3) || w.is_partial())
        r = detail::fail(r, conv_problem::kernel_split);
    if (groups > 1 && (x.is_split(1) || w.is_split(0) || w.is_split(1)))
        r = detail::fail(r, conv_problem::grouped_split);
    if (x.is_split(1) && !(x.dims[1] == w.dims[1]))
        r = detail::fail(r, conv_problem::channel_mismatch);
    r.x.dims[1] = w.dims[1];
    r.x.partial.clear();
    for (const auto& a : w.dims[0])
        if (x.dims[0].contains(a) || w.dims[1].contains(a) || x.dims[2].contains(a) ||
            x.dims[3].contains(a))
            r = detail::fail(r, conv_problem::axis_conflict);
    for (const auto& a : w.dims[1])
        if (x.dims[0].contains(a) || x.dims[2].contains(a) || x.dims[3].contains(a))
            r = detail::fail(r, conv_problem::axis_conflict);
    r.out.dims[0] = x.dims[0];
    r.out.dims[1] = w.dims[0];
    r.out.dims[2] = x.dims[2];
    r.out.dims[3] = x.dims[3];
    r.out.partial = w.dims[1];
    r.out.op = reduction::sum;
    return r;
}

/// A pooling window (max, average) or 2-D batch normalisation: the output keeps the input's
/// layout (batch, channels, height and width split as they come: pooling over a spatial
/// split gathers its halos; batch normalisation all-reduces its statistics over the spatial
/// axes, and over the batch's axes too when synchronised).
constexpr conv_rule_result pool2d_rule(const layout& x) {
    conv_rule_result r{x, layout{}, x};
    return detail::check_nchw(r, x);
}

} // namespace xshard
