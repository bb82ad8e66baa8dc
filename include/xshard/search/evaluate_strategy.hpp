#pragma once
/// \file
/// The prediction for one chain of operator strategies under given parallel degrees: what a
/// step costs each pipeline stage's ranks and which stage is the slowest by the objective.
/// The stages are contiguous runs of operators, balanced by count; an activation crosses a
/// stage boundary laid out [dp, -]. The step time of a stage of a pipeline of pp stages and m
/// micro-batches (1F1B) is (m + pp - 1) x its micro-batch time (forward, backward, the
/// activations' redistributions, the stage-boundary transfers) plus its gradient
/// synchronisation; the step time is the slowest stage's. A stage's memory is its operators'
/// weights, gradients and optimizer state plus its activations times its peak in-flight
/// micro-batches (pipeline/analysis.hpp's simulation of the schedule).

#include <xshard/compiled.hpp>
#include <xshard/core/mesh_shape.hpp>
#include <xshard/core/objective.hpp>
#include <xshard/core/op_choice.hpp>
#include <xshard/core/parallel_degrees.hpp>
#include <xshard/pipeline/analysis.hpp>
#include <xshard/search/cost.hpp>
#include <xshard/search/machine_model.hpp>
#include <xshard/search/network_spec.hpp>
#include <xshard/search/redistribution_pricer.hpp>
#include <xshard/search/search_options.hpp>
#include <xshard/search/searched_strategy.hpp>

#include <algorithm>
#include <cstddef>
#include <map>
#include <optional>
#include <stdexcept>
#include <tuple>
#include <vector>

namespace xshard {

namespace detail {

/// The stage of each operator: contiguous runs balanced by count.
XSHARD_DECL std::vector<int> stage_split(std::size_t ops, int pp);

/// Prices the operators of one (dp, tp, pp, m, level) candidate, memoised per operator shape
/// and strategy.
class candidate_pricer {
public:
    candidate_pricer(const network_spec& net, const parallel_degrees& d, const machine_model& m,
                     redistribution_pricer& pricer);

    const std::vector<int>& stage_of() const { return stage_of_; }
    std::size_t samples() const { return samples_; }
    double slots() const { return slots_; }
    int in_flight(int stage) const {
        return stage < int(in_flight_.size()) ? std::max(1, in_flight_[std::size_t(stage)]) : 1;
    }

    const op_cost& cost(std::size_t i, const op_choice& c);

    /// The point-to-point seconds per micro-batch of the boundaries of the stage starting at
    /// operator `first` and ending before `last`.
    double boundary_seconds(std::size_t first, std::size_t last) const;
    double boundary_bytes(std::size_t first, std::size_t last) const;

private:
    const network_spec* net_;
    parallel_degrees d_;
    const machine_model* m_;
    redistribution_pricer* pricer_;
    std::vector<int> stage_of_;
    std::size_t samples_ = 1;
    std::vector<int> in_flight_;
    double slots_ = 1;
    std::vector<std::size_t> boundary_bytes_;
    std::map<std::tuple<int, std::size_t, std::size_t, bool, std::size_t, int, int, int>, op_cost>
        memo_;
};

/// The stage totals of one stage's strategies.
struct stage_totals {
    double per_micro_batch = 0, compute = 0, communication = 0, sync = 0, memory = 0;
    double comm_bytes = 0;
};

/// The prediction for `choices` under degrees `d`, priced by `cp` (see the file comment).
XSHARD_DECL searched_strategy evaluate_strategy(const network_spec& net, const parallel_degrees& d,
                                                const std::vector<op_choice>& choices,
                                                const search_options& o, candidate_pricer& cp);

} // namespace detail

/// The prediction for `choices` (one per operator) under degrees `d` (see the file comment);
/// `valid` false when the chain does not fit together (an operator's input is not the
/// previous output, a stage boundary not [dp, -], the output split over tp).
XSHARD_DECL searched_strategy evaluate_strategy(const network_spec& net, const parallel_degrees& d,
                                                const std::vector<op_choice>& choices,
                                                const search_options& o);

/// The objective key of a whole plan: the slowest (by the objective) stage's.
inline search_key plan_key(const searched_strategy& p, int) {
    return p.objective;
}

} // namespace xshard

#ifndef XSHARD_SEPARATE_COMPILATION
#include <xshard/search/evaluate_strategy.ipp>
#endif
