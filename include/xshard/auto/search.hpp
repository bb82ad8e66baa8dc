#pragma once
/// \file
/// MindSpore's `recursive_programming` parallel mode: the strategy search. Over every
/// factorisation of the world into data, tensor and pipeline parallel degrees (dp x tp x pp),
/// the micro-batch counts of a pipeline and the hsdp levels, it chooses each operator's
/// strategy (auto/cost.hpp) to optimise the objective under a per-rank memory cap, in one
/// process, for any world size:
///
///     auto r = xshard::search_strategy(xshard::mlp_network({784, 512, 512, 10}, 64),
///                                      {.ranks = 16384, .memory_per_rank = 2.0 * (1 << 30)});
///     std::cout << xshard::describe(r);
///
/// Objectives (seed 004's `level`): 2 the fastest step; 1 the least memory; 0 the best
/// computation/communication ratio, i.e. the least communication (compute is the same work
/// whatever the split, bar repeated computation, which the tie-break on time rules out).
///
/// Per candidate degrees the stages are contiguous runs of operators, balanced by count; an
/// activation crosses a stage boundary laid out [dp, -]. Within a stage the strategy is a
/// dynamic programme over the operators whose state is the activation's split: exact for the
/// objective (each stage's time and memory are sums over its operators, and the stages are
/// independent given their boundaries), first minimising the objective alone and, when that
/// breaks the memory cap, keeping per state the Pareto front of (objective, memory). Small
/// chains can be searched exhaustively instead (`search_options::exhaustive`), which the tests
/// use to check the programme. The step time of a stage s of a pipeline of pp stages and m
/// micro-batches (1F1B) is (m + pp - 1) x its micro-batch time (forward, backward, the
/// activations' redistributions, the stage-boundary transfers) plus its gradient
/// synchronisation; the step time is the slowest stage's. A stage's memory is its operators'
/// weights, gradients and optimizer state plus its activations times its peak in-flight
/// micro-batches (pipeline/analysis.hpp's simulation of the schedule).

#include <xshard/auto/cost.hpp>
#include <xshard/core/objective.hpp>
#include <xshard/pipeline/analysis.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace xshard {

/// What to search for (see the file comment).
struct search_options {
    int ranks = 1;
    /// Bytes a rank may hold (weights, gradients, optimizer state, activations).
    double memory_per_rank = std::numeric_limits<double>::infinity();
    /// The objective: 2 fastest, 1 least memory, 0 least communication.
    int level = 2;
    machine_model machine{};
    /// Enumerate every strategy of every operator instead of the dynamic programme.
    bool exhaustive = false;
    /// Strategies given for some operators (sharding_propagation): the search keeps them.
    std::vector<std::optional<op_choice>> fixed{};
    /// Search only these degrees (e.g. the mesh a run has).
    std::optional<parallel_degrees> degrees{};
    /// The most pipeline stages to consider (0: any).
    int max_pipeline_stages = 0;
    /// hsdp levels to consider (0: none, 1, 2).
    std::vector<int> hsdp_levels{0, 1, 2};
    /// The splits the network's output may have (what the loss takes).
    std::vector<activation_split> output_splits{activation_split::rows, activation_split::all_rows};

    bool output_allowed(activation_split a) const {
        return std::find(output_splits.begin(), output_splits.end(), a) != output_splits.end();
    }
};

/// An objective value (core/objective.hpp): (time, memory) at level 2, (memory, time) at
/// level 1, (communication, time) at level 0, compared lexicographically.
using search_key = objective_key;

/// A candidate's full prediction: degrees, per-operator strategies, and what a step costs the
/// slowest stage's ranks.
struct strategy_plan {
    parallel_degrees degrees{};
    std::vector<op_choice> choices;
    std::vector<int> stage_of; ///< per operator
    double step_seconds = 0;
    double compute_seconds = 0;       ///< the slowest stage's, per step
    double communication_seconds = 0; ///< its activations' redistributions, per step
    double synchronization_seconds = 0;
    double pipeline_seconds = 0; ///< stage-boundary transfers and the bubble
    double memory_bytes = 0;     ///< the largest stage's per rank
    double comm_bytes = 0;       ///< bytes a rank of the slowest stage sends per step
    bool fits = true;            ///< within the memory cap
    bool valid = true;
    search_key objective{}; ///< the slowest stage's by the objective

    /// The index of the first operator of stages 1, 2, ... (pipeline_options::stage_starts).
    std::vector<std::size_t> stage_starts() const {
        std::vector<std::size_t> starts;
        for (std::size_t i = 1; i < stage_of.size(); ++i)
            if (stage_of[i] != stage_of[i - 1])
                starts.push_back(i);
        return starts;
    }
};

/// The search's outcome: the chosen plan, the runner-up and why it lost, the fastest plan
/// the memory cap ruled out (if faster), and how many candidates were priced.
struct search_result {
    std::optional<strategy_plan> best;
    std::optional<strategy_plan> runner_up;
    std::string runner_up_lost;
    std::optional<strategy_plan> over_cap;
    std::size_t candidates = 0;
    int level = 2;
    double memory_cap = 0;
    std::string network;
};

namespace detail {

/// The stage of each operator: contiguous runs balanced by count.
inline std::vector<int> stage_split(std::size_t ops, int pp) {
    std::vector<int> s(ops);
    for (std::size_t i = 0; i < ops; ++i)
        s[i] = int(i * std::size_t(pp) / ops);
    return s;
}

/// Prices the operators of one (dp, tp, pp, m, level) candidate, memoised per operator shape
/// and strategy.
class candidate_pricer {
public:
    candidate_pricer(const network_spec& net, const parallel_degrees& d, const machine_model& m,
                     redistribution_pricer& pricer)
        : net_(&net)
        , d_(d)
        , m_(&m)
        , pricer_(&pricer)
        , stage_of_(stage_split(net.ops.size(), d.pp)) {
        samples_ = net.batch / std::size_t(d.micro_batches);
        if (d.pp > 1) {
            const auto rep = pipeline::analyze(pipeline::schedule_config{
                pipeline::schedule_kind::one_f_one_b, d.pp, d.micro_batches, 1});
            in_flight_ = rep.peak_in_flight;
        } else {
            in_flight_ = {1};
        }
        slots_ = double(d.micro_batches + d.pp - 1);
        // A stage boundary: the [dp, -] block sent forward and its gradient back, per
        // micro-batch, point to point.
        const auto rows = largest_block(samples_ * net.seq, std::size_t(d.dp));
        boundary_bytes_.resize(net.ops.size() + 1, 0);
        for (std::size_t i = 1; i < net.ops.size(); ++i)
            if (stage_of_[i] != stage_of_[i - 1])
                boundary_bytes_[i] = rows * net.ops[i - 1].out * m.element;
    }

    const std::vector<int>& stage_of() const { return stage_of_; }
    std::size_t samples() const { return samples_; }
    double slots() const { return slots_; }
    int in_flight(int stage) const {
        return stage < int(in_flight_.size()) ? std::max(1, in_flight_[std::size_t(stage)]) : 1;
    }

    const op_cost& cost(std::size_t i, const op_choice& c) {
        const auto& op = net_->ops[i];
        const auto k = std::make_tuple(int(op.kind), op.in, op.out, op.bias, op.heads, int(c.in),
                                       int(c.weight), int(c.out));
        auto it = memo_.find(k);
        if (it == memo_.end())
            it = memo_.emplace(k, cost_of(op, c, samples_, net_->seq, d_.hsdp_level, *m_, *pricer_))
                     .first;
        return it->second;
    }

    /// The point-to-point seconds per micro-batch of the boundaries of the stage starting at
    /// operator `first` and ending before `last`.
    double boundary_seconds(std::size_t first, std::size_t last) const {
        double s = 0;
        const auto& link = m_->links.exchange;
        for (std::size_t b : {first, last})
            if (b > 0 && b < boundary_bytes_.size() - 1 && boundary_bytes_[b] > 0)
                s += link.alpha + link.beta * double(boundary_bytes_[b]);
        return s;
    }
    double boundary_bytes(std::size_t first, std::size_t last) const {
        double s = 0;
        for (std::size_t b : {first, last})
            if (b > 0 && b < boundary_bytes_.size() - 1)
                s += double(boundary_bytes_[b]);
        return s;
    }

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

} // namespace detail

namespace detail {

inline strategy_plan evaluate_strategy(const network_spec& net, const parallel_degrees& d,
                                       const std::vector<op_choice>& choices,
                                       const search_options& o, candidate_pricer& cp) {
    strategy_plan p;
    p.degrees = d;
    p.choices = choices;
    p.stage_of = cp.stage_of();
    const std::size_t n = net.ops.size();
    if (choices.size() != n)
        throw std::invalid_argument("xshard: evaluate_strategy: one choice per operator");
    std::vector<detail::stage_totals> st(std::size_t(d.pp));
    for (std::size_t i = 0; i < n; ++i) {
        const auto& c = choices[i];
        const bool first = i == 0 || p.stage_of[i] != p.stage_of[i - 1];
        const bool last = i + 1 == n || p.stage_of[i] != p.stage_of[i + 1];
        if ((i == 0 || first) && c.in != activation_split::rows)
            p.valid = false;
        if (i > 0 && !first && c.in != choices[i - 1].out)
            p.valid = false;
        if (last && i + 1 < n && c.out != activation_split::rows)
            p.valid = false;
        if (i + 1 == n && !o.output_allowed(c.out))
            p.valid = false;
        const auto& k = cp.cost(i, c);
        if (!k.valid)
            p.valid = false;
        auto& s = st[std::size_t(p.stage_of[i])];
        s.per_micro_batch += k.compute + k.communication;
        s.compute += k.compute;
        s.communication += k.communication;
        s.sync += k.synchronization;
        s.memory += double(k.weight_memory) +
                    double(cp.in_flight(p.stage_of[i])) * double(k.activation_memory);
        s.comm_bytes += double(d.micro_batches) * double(k.comm_bytes) + double(k.sync_bytes);
    }
    std::optional<search_key> worst;
    for (int s = 0; s < d.pp; ++s) {
        std::size_t first = n, last = 0;
        for (std::size_t i = 0; i < n; ++i)
            if (p.stage_of[i] == s) {
                first = std::min(first, i);
                last = i + 1;
            }
        const auto& t = st[std::size_t(s)];
        const double boundary = cp.boundary_seconds(first, last);
        const double step = cp.slots() * (t.per_micro_batch + boundary) + t.sync;
        const double comm = cp.slots() * (t.communication + boundary) + t.sync;
        const auto k = objective_of(o.level, step, comm, t.memory);
        p.memory_bytes = std::max(p.memory_bytes, t.memory);
        if (!worst || *worst < k) {
            worst = k;
            p.objective = k;
            p.step_seconds = step;
            p.compute_seconds = double(d.micro_batches) * t.compute;
            p.communication_seconds = double(d.micro_batches) * t.communication;
            p.synchronization_seconds = t.sync;
            p.pipeline_seconds = step - p.compute_seconds - p.communication_seconds - t.sync;
            p.comm_bytes =
                t.comm_bytes + double(d.micro_batches) * 2 * cp.boundary_bytes(first, last);
        }
    }
    p.fits = p.memory_bytes <= o.memory_per_rank;
    return p;
}

} // namespace detail

/// The prediction for `choices` (one per operator) under degrees `d` (see the file comment);
/// `valid` false when the chain does not fit together (an operator's input is not the
/// previous output, a stage boundary not [dp, -], the output split over tp).
inline strategy_plan evaluate_strategy(const network_spec& net, const parallel_degrees& d,
                                       const std::vector<op_choice>& choices,
                                       const search_options& o) {
    const mesh_shape mesh({axis_name("dp"), axis_name("tp")}, {d.dp, d.tp});
    redistribution_pricer pricer(mesh, o.machine.links, o.machine.element);
    detail::candidate_pricer cp(net, d, o.machine, pricer);
    return detail::evaluate_strategy(net, d, choices, o, cp);
}

/// The objective key of a whole plan: the slowest (by the objective) stage's.
inline search_key plan_key(const strategy_plan& p, int) {
    return p.objective;
}

namespace detail {

/// An entry of a state's front: the stage's sums so far and where it came from.
struct dp_entry {
    double step = 0, comm = 0, memory = 0; // step and comm: per-step seconds so far
    int prev_state = -1, prev_index = -1;
    op_choice choice{};
};

/// The best strategies of operators [first, last) of one stage by dynamic programming (see
/// the file comment); empty when none is valid. `pareto`: keep (objective, memory) fronts.
inline std::optional<std::vector<op_choice>>
stage_programme(const network_spec& net, candidate_pricer& cp, std::size_t first, std::size_t last,
                int level, bool pareto, double cap, const search_options& o) {
    const auto& fixed = o.fixed;
    const int stage = cp.stage_of()[first];
    const double slots = cp.slots(), in_flight = cp.in_flight(stage);
    const double boundary = slots * cp.boundary_seconds(first, last);
    using front = std::vector<dp_entry>;
    std::vector<std::array<front, 3>> fronts(last - first + 1);
    fronts[0][std::size_t(activation_split::rows)].push_back({boundary, boundary, 0, -1, -1, {}});
    const auto better = [&](const dp_entry& a, const dp_entry& b) {
        return objective_of(level, a.step, a.comm, a.memory) <
               objective_of(level, b.step, b.comm, b.memory);
    };
    const auto dominates = [&](const dp_entry& a, const dp_entry& b) {
        return objective_of(level, a.step, a.comm, a.memory) <=
                   objective_of(level, b.step, b.comm, b.memory) &&
               a.memory <= b.memory;
    };
    for (std::size_t i = first; i < last; ++i) {
        auto& next = fronts[i - first + 1];
        const bool stage_end = i + 1 == last;
        for (auto in : activation_splits) {
            const auto& here = fronts[i - first][std::size_t(in)];
            if (here.empty())
                continue;
            for (auto w : {weight_split::replicated, weight_split::output, weight_split::input}) {
                for (auto out : activation_splits) {
                    const op_choice c{in, w, out};
                    if (i < fixed.size() && fixed[i] && !(*fixed[i] == c))
                        continue;
                    if (stage_end && i + 1 < net.ops.size() && out != activation_split::rows)
                        continue;
                    if (i + 1 == net.ops.size() && !o.output_allowed(out))
                        continue;
                    const auto& k = cp.cost(i, c);
                    if (!k.valid)
                        continue;
                    const double step = slots * (k.compute + k.communication) + k.synchronization;
                    const double comm = slots * k.communication + k.synchronization;
                    const double mem =
                        double(k.weight_memory) + in_flight * double(k.activation_memory);
                    auto& dst = next[std::size_t(out)];
                    for (std::size_t j = 0; j < here.size(); ++j) {
                        dp_entry e{here[j].step + step,
                                   here[j].comm + comm,
                                   here[j].memory + mem,
                                   int(in),
                                   int(j),
                                   c};
                        if (!pareto) {
                            if (dst.empty())
                                dst.push_back(e);
                            else if (better(e, dst[0]))
                                dst[0] = e;
                            continue;
                        }
                        if (e.memory > cap)
                            continue;
                        bool dominated = false;
                        for (const auto& f : dst)
                            dominated = dominated || dominates(f, e);
                        if (dominated)
                            continue;
                        std::erase_if(dst, [&](const dp_entry& f) { return dominates(e, f); });
                        dst.push_back(e);
                    }
                }
            }
        }
    }
    // The best end state (entries in the cap when pareto).
    int best_state = -1, best_index = -1;
    const auto& end = fronts.back();
    for (int s = 0; s < 3; ++s)
        for (std::size_t j = 0; j < end[std::size_t(s)].size(); ++j)
            if (best_state < 0 || better(end[std::size_t(s)][j],
                                         end[std::size_t(best_state)][std::size_t(best_index)])) {
                best_state = s;
                best_index = int(j);
            }
    if (best_state < 0)
        return std::nullopt;
    std::vector<op_choice> r(last - first);
    for (std::size_t i = last; i-- > first;) {
        const auto& e = fronts[i - first + 1][std::size_t(best_state)][std::size_t(best_index)];
        r[i - first] = e.choice;
        best_state = e.prev_state;
        best_index = e.prev_index;
    }
    return r;
}

/// Every valid strategy of the whole chain, evaluated; the best by the objective among those
/// within the cap (or, if none is, the least memory).
inline std::optional<strategy_plan> exhaustive_search(const network_spec& net,
                                                      const parallel_degrees& d,
                                                      const search_options& o,
                                                      redistribution_pricer& pricer) {
    candidate_pricer cp(net, d, o.machine, pricer);
    const auto& stage = cp.stage_of();
    const std::size_t n = net.ops.size();
    std::vector<op_choice> all;
    for (auto in : activation_splits)
        for (auto w : {weight_split::replicated, weight_split::output, weight_split::input})
            for (auto out : activation_splits)
                all.push_back({in, w, out});
    std::vector<std::size_t> index(n, 0);
    std::optional<strategy_plan> best;
    std::vector<op_choice> c(n);
    std::function<void(std::size_t)> go = [&](std::size_t i) {
        if (i == n) {
            auto p = evaluate_strategy(net, d, c, o, cp);
            if (!p.valid || !p.fits)
                return;
            if (!best || plan_key(p, o.level) < plan_key(*best, o.level))
                best = std::move(p);
            return;
        }
        for (const auto& x : all) {
            if (i < o.fixed.size() && o.fixed[i] && !(*o.fixed[i] == x))
                continue;
            const bool boundary = i == 0 || stage[i] != stage[i - 1];
            if (boundary ? x.in != activation_split::rows : x.in != c[i - 1].out)
                continue;
            if (!cp.cost(i, x).valid)
                continue;
            c[i] = x;
            go(i + 1);
        }
    };
    go(0);
    return best;
}

} // namespace detail

/// The degrees the search considers for `net` on `ranks` ranks (see the file comment): every
/// dp x tp x pp = ranks with dp dividing the samples of a micro-batch and at most one stage
/// per operator, with m in {pp, 2 pp, 4 pp} micro-batches for a pipeline.
inline std::vector<parallel_degrees> candidate_degrees(const network_spec& net, int ranks,
                                                       const std::vector<int>& levels) {
    std::vector<parallel_degrees> r;
    for (int pp = 1; pp <= ranks; ++pp) {
        if (ranks % pp != 0 || std::size_t(pp) > net.ops.size())
            continue;
        for (int dp = 1; dp <= ranks / pp; ++dp) {
            if ((ranks / pp) % dp != 0)
                continue;
            const int tp = ranks / pp / dp;
            std::vector<int> ms =
                pp == 1 ? std::vector<int>{1} : std::vector<int>{pp, 2 * pp, 4 * pp};
            for (int m : ms) {
                if (net.batch % (std::size_t(m) * std::size_t(dp)) != 0)
                    continue;
                for (int level : levels)
                    r.push_back({dp, tp, pp, m, level});
            }
        }
    }
    return r;
}

/// The best strategies of every operator under degrees `d` (the dynamic programme, or the
/// enumeration with `o.exhaustive`), evaluated; nullopt when no strategy is valid or fits.
inline std::optional<strategy_plan>
search_degrees(const network_spec& net, const parallel_degrees& d, const search_options& o,
               redistribution_pricer& pricer, bool within_cap = true) {
    if (o.exhaustive)
        return detail::exhaustive_search(net, d, o, pricer);
    detail::candidate_pricer cp(net, d, o.machine, pricer);
    const std::size_t n = net.ops.size();
    std::vector<op_choice> choices;
    const auto& stage = cp.stage_of();
    for (std::size_t first = 0; first < n;) {
        std::size_t last = first;
        while (last < n && stage[last] == stage[first])
            ++last;
        auto part =
            detail::stage_programme(net, cp, first, last, o.level, false, o.memory_per_rank, o);
        if (!part)
            return std::nullopt;
        // The unconstrained best breaks the cap: the Pareto fronts find the best within it.
        auto probe = choices;
        probe.insert(probe.end(), part->begin(), part->end());
        double mem = 0;
        for (std::size_t i = first; i < last; ++i) {
            const auto& k = cp.cost(i, probe[i]);
            mem += double(k.weight_memory) +
                   double(cp.in_flight(stage[first])) * double(k.activation_memory);
        }
        if (within_cap && mem > o.memory_per_rank) {
            auto within =
                detail::stage_programme(net, cp, first, last, o.level, true, o.memory_per_rank, o);
            if (within)
                part = within;
        }
        choices.insert(choices.end(), part->begin(), part->end());
        first = last;
    }
    auto p = evaluate_strategy(net, d, choices, o);
    if (!p.valid)
        return std::nullopt;
    return p;
}

namespace detail {

inline std::string ms(double s) {
    char t[32];
    std::snprintf(t, sizeof t, "%.3f ms", s * 1e3);
    return t;
}

inline std::string gib(double b) {
    char t[32];
    if (b >= double(1ULL << 30))
        std::snprintf(t, sizeof t, "%.2f GiB", b / double(1ULL << 30));
    else
        std::snprintf(t, sizeof t, "%.2f MiB", b / double(1ULL << 20));
    return t;
}

inline std::string degrees_text(const parallel_degrees& d) {
    return "dp=" + std::to_string(d.dp) + " tp=" + std::to_string(d.tp) +
           " pp=" + std::to_string(d.pp) + " micro_batches=" + std::to_string(d.micro_batches) +
           " hsdp=" + (d.hsdp_level ? "level" + std::to_string(d.hsdp_level) : "off");
}

/// Why `loser` ranks after `winner`: the objective's difference and the component that grew
/// most.
inline std::string why_lost(const strategy_plan& winner, const strategy_plan& loser, int level) {
    if (level == 1 && loser.memory_bytes > winner.memory_bytes)
        return "needs " + gib(loser.memory_bytes - winner.memory_bytes) + " more per rank";
    if (level == 0) {
        const double a = winner.communication_seconds + winner.synchronization_seconds;
        const double b = loser.communication_seconds + loser.synchronization_seconds;
        if (b > a)
            return "communicates " + ms(b - a) + " more per step";
    }
    const double dt = loser.step_seconds - winner.step_seconds;
    if (dt <= 0)
        return "equal predicted step time; ranked after by memory (" + gib(loser.memory_bytes) +
               " vs " + gib(winner.memory_bytes) + ")";
    const std::pair<const char*, double> parts[] = {
        {"compute", loser.compute_seconds - winner.compute_seconds},
        {"activation redistribution", loser.communication_seconds - winner.communication_seconds},
        {"gradient synchronisation and update",
         loser.synchronization_seconds - winner.synchronization_seconds},
        {"pipeline bubble and transfers", loser.pipeline_seconds - winner.pipeline_seconds}};
    const auto* worst = &parts[0];
    for (const auto& p : parts)
        if (p.second > worst->second)
            worst = &p;
    return ms(dt) + " slower per step, mostly " + worst->first + " (+" + ms(worst->second) + ")";
}

} // namespace detail

/// MindSpore's recursive_programming: the best plan for `net` over every candidate degree
/// (or `o.degrees`), the runner-up with the reason it lost, and the fastest plan the cap
/// ruled out when it would have won. Throws std::invalid_argument when nothing is valid.
inline search_result search_strategy(const network_spec& net, const search_options& o) {
    if (o.ranks < 1)
        throw std::invalid_argument("xshard: search: ranks must be at least 1");
    if (net.ops.empty() || net.batch == 0)
        throw std::invalid_argument("xshard: search: the network has no operators or no batch");
    if (!is_objective_level(o.level))
        throw std::invalid_argument(bad_objective_level("xshard: search: the level", o.level));
    search_result r;
    r.level = o.level;
    r.memory_cap = o.memory_per_rank;
    r.network = net.description;
    std::vector<parallel_degrees> cands;
    if (o.degrees) {
        for (int level : o.hsdp_levels) {
            auto d = *o.degrees;
            d.hsdp_level = level;
            cands.push_back(d);
        }
    } else {
        cands = candidate_degrees(net, o.ranks, o.hsdp_levels);
        if (o.max_pipeline_stages > 0)
            std::erase_if(cands,
                          [&](const parallel_degrees& d) { return d.pp > o.max_pipeline_stages; });
    }
    std::map<std::pair<int, int>, redistribution_pricer> pricers;
    std::vector<strategy_plan> fitting;
    // The best plan, and as runner-up the best on other degrees (another hsdp level alone is
    // a footnote, not an alternative).
    const auto choose = [&] {
        std::stable_sort(fitting.begin(), fitting.end(), [&](const auto& a, const auto& b) {
            return plan_key(a, o.level) < plan_key(b, o.level);
        });
        r.best.reset();
        r.runner_up.reset();
        if (fitting.empty())
            return;
        r.best = fitting.front();
        for (const auto& f : fitting) {
            auto a = f.degrees, b = r.best->degrees;
            a.hsdp_level = b.hsdp_level = 0;
            if (!(a == b)) {
                r.runner_up = f;
                break;
            }
        }
        if (!r.runner_up && fitting.size() > 1)
            r.runner_up = fitting[1];
    };
    // First every candidate without the cap (one scalar programme per stage); those whose
    // optimum breaks the cap are searched again under it (Pareto fronts), best bound first,
    // while their bound (the unconstrained optimum) could still beat the runner-up.
    struct capped {
        parallel_degrees d;
        search_key bound;
        redistribution_pricer* pricer;
    };
    std::vector<capped> again;
    for (const auto& d : cands) {
        auto it = pricers.find({d.dp, d.tp});
        if (it == pricers.end())
            it = pricers
                     .emplace(std::pair{d.dp, d.tp},
                              redistribution_pricer(
                                  mesh_shape({axis_name("dp"), axis_name("tp")}, {d.dp, d.tp}),
                                  o.machine.links, o.machine.element))
                     .first;
        ++r.candidates;
        auto p = search_degrees(net, d, o, it->second, o.exhaustive);
        if (!p)
            continue;
        if (p->fits) {
            fitting.push_back(std::move(*p));
            continue;
        }
        if (!r.over_cap || plan_key(*p, o.level) < plan_key(*r.over_cap, o.level))
            r.over_cap = p;
        if (!o.exhaustive)
            again.push_back({d, plan_key(*p, o.level), &it->second});
    }
    std::stable_sort(again.begin(), again.end(),
                     [](const capped& a, const capped& b) { return a.bound < b.bound; });
    for (const auto& c : again) {
        choose();
        if (r.best && r.runner_up && !(c.bound < plan_key(*r.runner_up, o.level)))
            break;
        auto p = search_degrees(net, c.d, o, *c.pricer, true);
        if (p && p->fits)
            fitting.push_back(std::move(*p));
    }
    choose();
    if (!r.best && !r.over_cap)
        throw std::invalid_argument("xshard: search: no valid strategy for " + net.description +
                                    " on " + std::to_string(o.ranks) +
                                    " ranks (the batch must split over the data-parallel ranks)");
    if (r.over_cap && r.best && !(plan_key(*r.over_cap, o.level) < plan_key(*r.best, o.level)))
        r.over_cap.reset();
    if (!r.best && o.level != 1) {
        // Nothing fits: report the plan of least memory instead (level 1, no cap).
        auto least = o;
        least.level = 1;
        least.memory_per_rank = std::numeric_limits<double>::infinity();
        r.over_cap = search_strategy(net, least).best;
    }
    if (r.best && r.runner_up)
        r.runner_up_lost = detail::why_lost(*r.best, *r.runner_up, o.level);
    return r;
}

/// The result as text: the chosen degrees, each operator's strategy and stage, the predicted
/// step time, memory and communication per rank, the runner-up and why it lost.
inline std::string describe(const search_result& r, const network_spec& net) {
    using detail::gib, detail::ms;
    std::string s;
    const char* objective[] = {"least communication (level 0)", "least memory (level 1)",
                               "fastest (level 2)"};
    s += "search (recursive_programming) for " + net.description + ", batch " +
         std::to_string(net.batch) + ", objective " + objective[r.level] + ", memory cap " +
         (std::isinf(r.memory_cap) ? std::string("none") : gib(r.memory_cap)) + "; " +
         std::to_string(r.candidates) + " candidate degrees\n";
    if (!r.best) {
        s += "no strategy fits the memory cap; the least memory any needs is " +
             gib(r.over_cap->memory_bytes) + " per rank (" +
             detail::degrees_text(r.over_cap->degrees) + ")\n";
        return s;
    }
    const auto& b = *r.best;
    s += "chosen: " + detail::degrees_text(b.degrees) + "\n";
    for (std::size_t i = 0; i < net.ops.size(); ++i) {
        const auto& c = b.choices[i];
        char line[256];
        const bool weighted =
            net.ops[i].kind == op_kind::linear || net.ops[i].kind == op_kind::embedding;
        std::snprintf(line, sizeof line, "  %-20s stage %d  in %-14s weight %-8s out %s\n",
                      net.ops[i].name.c_str(), b.stage_of[i], std::string(to_string(c.in)).c_str(),
                      weighted ? weight_layout(c.weight).to_string().c_str() : "-",
                      std::string(to_string(c.out)).c_str());
        s += line;
    }
    s += "predicted step " + ms(b.step_seconds) + " (compute " + ms(b.compute_seconds) +
         ", activation redistribution " + ms(b.communication_seconds) +
         ", gradient synchronisation and update " + ms(b.synchronization_seconds) + ", pipeline " +
         ms(b.pipeline_seconds) + "); memory " + gib(b.memory_bytes) + " per rank; communication " +
         gib(b.comm_bytes) + " sent per rank per step\n";
    if (r.runner_up)
        s += "runner-up: " + detail::degrees_text(r.runner_up->degrees) + ", step " +
             ms(r.runner_up->step_seconds) + ", memory " + gib(r.runner_up->memory_bytes) +
             ": lost by " + r.runner_up_lost + "\n";
    if (r.over_cap)
        s += "ruled out by the memory cap: " + detail::degrees_text(r.over_cap->degrees) +
             ", step " + ms(r.over_cap->step_seconds) + ", needs " + gib(r.over_cap->memory_bytes) +
             " per rank\n";
    return s;
}

} // namespace xshard
