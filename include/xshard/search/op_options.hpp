#pragma once
/// \file
/// The strategies an operator of the search's chain admits (search/network_spec.hpp,
/// core/op_choice.hpp): per input split, the weight splits it can run with and the layout its
/// output has before its redistribution. The cost model prices only these (search/cost.hpp).

#include <xshard/compiled.hpp>
#include <xshard/core/layout.hpp>
#include <xshard/core/op_choice.hpp>
#include <xshard/search/network_spec.hpp>

#include <cstddef>
#include <utility>
#include <vector>

namespace xshard {

/// The (weight split, output layout before redistribution) pairs operator `op` can run with on
/// input split `in`, on a (dp, tp) mesh with `samples` samples per micro-batch. Empty when `in`
/// does not suit the operator (a normalisation needs whole rows; attention whole heads and
/// whole sequences).
XSHARD_DECL std::vector<std::pair<weight_split, layout>>
op_options(const op_spec& op, activation_split in, int dp, int tp, std::size_t samples);

} // namespace xshard

#ifndef XSHARD_SEPARATE_COMPILATION
#include <xshard/search/op_options.ipp>
#endif
