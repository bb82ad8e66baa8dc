#pragma once
/// \file
/// The strategy of one operator of a sequential network on a stage's mesh (dp, tp), as the
/// strategy search chooses it (search/cost.hpp prices it) and an operator strategy file
/// stores it (io/operator_strategy_file.hpp). Between operators an activation [tokens,
/// features] is in one of three layouts (`activation_split`):
///
///     rows      [dp, -]        rows over dp, features whole (replicated over tp)
///     features  [dp, tp]       rows over dp, features over tp
///     all_rows  [(dp, tp), -]  rows over every rank of the stage
///
/// An operator's strategy (`op_choice`) names the layout it takes, its weight's layout
/// (`weight_split`) and the layout its output is redistributed to (MindSpore's in_strategy /
/// out_strategy).

#include <xshard/compiled.hpp>
#include <xshard/core/layout.hpp>

#include <array>
#include <cstdint>
#include <optional>
#include <string_view>

namespace xshard {

/// The layout of an activation between operators (see the file comment).
enum class activation_split : std::uint8_t { rows, features, all_rows };
inline constexpr std::array<activation_split, 3> activation_splits = {
    activation_split::rows, activation_split::features, activation_split::all_rows};

constexpr std::string_view to_string(activation_split a) {
    switch (a) {
    case activation_split::rows:
        return "[dp, -]";
    case activation_split::features:
        return "[dp, tp]";
    case activation_split::all_rows:
        return "[(dp, tp), -]";
    }
    return "?";
}

/// The activation split written as `text` (as `to_string`), if it is one.
XSHARD_DECL std::optional<activation_split> parse_activation_split(std::string_view text);

/// How an operator splits its weight: not at all, by output features (MindSpore's
/// ((dp, 1), (1, tp)), Megatron's column parallel), by input features (((dp, tp), (tp, 1)),
/// row parallel).
enum class weight_split : std::uint8_t { replicated, output, input };

constexpr std::string_view to_string(weight_split w) {
    switch (w) {
    case weight_split::replicated:
        return "replicated";
    case weight_split::output:
        return "output";
    case weight_split::input:
        return "input";
    }
    return "?";
}

/// The weight split written as `text` (as `to_string`), if it is one.
XSHARD_DECL std::optional<weight_split> parse_weight_split(std::string_view text);

/// An operator's strategy: the split it takes, how its weight is split, and the split its
/// output is redistributed to.
struct op_choice {
    activation_split in = activation_split::rows;
    weight_split weight = weight_split::replicated;
    activation_split out = activation_split::rows;
    friend constexpr bool operator==(const op_choice&, const op_choice&) = default;
};

/// The layout of a split on a stage's (dp, tp) mesh.
inline layout activation_layout(activation_split a) {
    return layout::parse(to_string(a));
}

/// The weight's layout [in, out] under `w` (an embedding's too), and its bias' [out].
XSHARD_DECL layout weight_layout(weight_split w);
inline layout bias_layout(weight_split w) {
    return layout::parse(w == weight_split::output ? "[tp]" : "[-]");
}

} // namespace xshard

#ifndef XSHARD_SEPARATE_COMPILATION
#include <xshard/core/op_choice.ipp>
#endif
