#pragma once
/// \file
/// A network as the strategy search sees it: a chain of operators on activations [tokens,
/// features] (linear, elementwise, row normalisation, attention core, embedding), the samples
/// per step and the tokens per sample. search/networks.hpp builds the chains of an MLP and of
/// a GPT-style decoder.

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace xshard {

/// The kinds of operator the search knows.
enum class op_kind { linear, elementwise, normalization, attention, embedding };

constexpr std::string_view to_string(op_kind k) {
    switch (k) {
    case op_kind::linear:
        return "linear";
    case op_kind::elementwise:
        return "elementwise";
    case op_kind::normalization:
        return "normalization";
    case op_kind::attention:
        return "attention";
    case op_kind::embedding:
        return "embedding";
    }
    return "?";
}

/// One operator of the chain: `in` and `out` features (a linear's weight is [in, out], an
/// embedding's [in = vocabulary, out]), a bias, attention's heads.
struct op_spec {
    std::string name;
    op_kind kind = op_kind::linear;
    std::size_t in = 0, out = 0;
    bool bias = true;
    std::size_t heads = 1;
};

/// A sequential network: the chain of operators, the samples per step (`batch`) and the
/// tokens per sample (`seq`, 1 for an MLP).
struct network_spec {
    std::string description;
    std::vector<op_spec> ops;
    std::size_t batch = 1;
    std::size_t seq = 1;
};

} // namespace xshard
