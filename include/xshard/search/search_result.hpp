#pragma once
/// \file
/// The outcome of the strategy search (search/recursive_programming.hpp) and its text: the
/// chosen strategy, the runner-up and why it lost, the fastest strategy the memory cap ruled
/// out, and how many candidates were priced. `describe` prints each operator's strategy and
/// stage with the predicted step time, memory and communication per rank.

#include <xshard/compiled.hpp>
#include <xshard/core/op_choice.hpp>
#include <xshard/core/parallel_degrees.hpp>
#include <xshard/search/network_spec.hpp>
#include <xshard/search/searched_strategy.hpp>

#include <cmath>
#include <cstddef>
#include <cstdio>
#include <optional>
#include <string>
#include <utility>

namespace xshard {

/// The search's outcome: the chosen plan, the runner-up and why it lost, the fastest plan
/// the memory cap ruled out (if faster), and how many candidates were priced.
struct search_result {
    std::optional<searched_strategy> best;
    std::optional<searched_strategy> runner_up;
    std::string runner_up_lost;
    std::optional<searched_strategy> over_cap;
    std::size_t candidates = 0;
    int level = 2;
    double memory_cap = 0;
    std::string network;
};

namespace detail {

XSHARD_DECL std::string ms(double s);

XSHARD_DECL std::string gib(double b);

XSHARD_DECL std::string degrees_text(const parallel_degrees& d);

/// Why `loser` ranks after `winner`: the objective's difference and the component that grew
/// most.
XSHARD_DECL std::string why_lost(const searched_strategy& winner, const searched_strategy& loser,
                                 int level);

} // namespace detail

/// The result as text: the chosen degrees, each operator's strategy and stage, the predicted
/// step time, memory and communication per rank, the runner-up and why it lost.
XSHARD_DECL std::string describe(const search_result& r, const network_spec& net);

} // namespace xshard

#ifndef XSHARD_SEPARATE_COMPILATION
#include <xshard/search/search_result.ipp>
#endif
