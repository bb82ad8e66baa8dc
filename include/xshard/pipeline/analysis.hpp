#pragma once
/// \file
/// What a schedule table promises, computed from the table alone: whether it runs to the
/// end (every receive is reached by its matching send: no deadlock), how long it takes in
/// units of work, its bubble (the idle share of the ranks' time) and the peak number of
/// micro-batches in flight on each rank (activations kept between a forward pass and the
/// backward pass that releases them). constexpr, so `static_assert` proves it for given
/// sizes; the pipeline runtime checks the same at run time before any data moves.

#include <xshard/pipeline/schedule.hpp>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

namespace xshard::pipeline {

/// The work of one pass in units (a forward pass of one virtual stage is 1): a backward
/// pass 2, its input and weight halves 1 each (the usual ratio: a backward pass costs two
/// matrix products per forward one).
constexpr int work_of(pass p) noexcept {
    return p == pass::backward ? 2 : 1;
}

/// The outcome of `analyze`.
struct schedule_report {
    /// Whether every action is reached (no rank waits forever for a transfer).
    bool deadlock_free = false;
    /// Why not, or what is inconsistent in the table ("" when it is sound).
    std::string problem;
    /// The step's length in units of work, each rank starting an action as soon as it is
    /// free and the action's input has arrived (transfers taking no time).
    std::int64_t makespan = 0;
    /// The ranks' idle time and total time (p x makespan) in units; bubble = idle / total.
    std::int64_t idle = 0, total = 0;
    /// Per rank, the largest number of micro-batches (per virtual stage) between their
    /// forward pass and the pass that releases their activations (B, or W when split).
    std::vector<int> peak_in_flight;

    /// The idle share of the step (0 for one stage).
    constexpr double bubble() const noexcept {
        return total == 0 ? 0.0 : double(idle) / double(total);
    }
    /// The largest `peak_in_flight` over the ranks.
    constexpr int peak() const noexcept {
        return peak_in_flight.empty()
                   ? 0
                   : *std::max_element(peak_in_flight.begin(), peak_in_flight.end());
    }
};

namespace detail {

/// Per (virtual stage, micro-batch), a time for each kind of pass: F, B (whole or input
/// half), W; `never` where the pass has not run (or, checking a table, does not appear).
struct pass_times {
    static constexpr std::int64_t never = -1;
    int micro_batches = 0;
    std::vector<std::int64_t> f, b, w;

    constexpr pass_times(int stages, int m)
        : micro_batches(m)
        , f(std::size_t(stages) * std::size_t(m), never)
        , b(f)
        , w(f) {}

    constexpr std::size_t index(int stage, int mb) const {
        return std::size_t(stage) * std::size_t(micro_batches) + std::size_t(mb);
    }
    /// The time of pass `p` of micro-batch `mb` on stage `stage`.
    constexpr std::int64_t& of(pass p, int stage, int mb) {
        return (p == pass::forward ? f : p == pass::backward_weight ? w : b)[index(stage, mb)];
    }
};

/// Why `s` is not a table `analyze` can run, or "" when it is one: every (micro-batch,
/// virtual stage) has exactly one forward and one backward (or one B and one W) on the rank
/// of its stage, and every action's transfers are the ones its stages imply.
constexpr std::string table_problem(const schedule& s) {
    const auto& c = s.config;
    const int p = c.stages, m = c.micro_batches, stages = c.total_stages();
    const bool split = s.split_backward();
    if (int(s.ranks.size()) != p)
        return concat("the table has ", decimal(s.ranks.size()), " ranks, not ", decimal(p));
    pass_times seen(stages, m); // 0 where a pass appears
    for (int r = 0; r < p; ++r)
        for (const auto& a : s.ranks[r]) {
            const auto where = [&] {
                return concat("rank ", decimal(r), ": ", std::string(1, letter(a.kind)),
                              decimal(a.micro_batch), " on stage ", decimal(a.stage));
            };
            if (a.stage < 0 || a.stage >= stages || a.micro_batch < 0 || a.micro_batch >= m ||
                c.rank_of_stage(a.stage) != r)
                return concat(where(), " is out of range or on the wrong rank");
            if ((a.kind == pass::backward) == split && a.kind != pass::forward)
                return concat(where(), ": the schedule ", split ? "splits" : "does not split",
                              " backward passes");
            if (!(a == with_transfers(c, a.kind, a.micro_batch, a.stage)))
                return concat(where(), " names transfers its stages do not imply");
            auto& slot = seen.of(a.kind, a.stage, a.micro_batch);
            if (slot != pass_times::never)
                return concat(where(), " appears twice");
            slot = 0;
        }
    for (std::size_t i = 0; i < seen.f.size(); ++i)
        if (seen.f[i] == pass_times::never || seen.b[i] == pass_times::never ||
            (split && seen.w[i] == pass_times::never))
            return concat("micro-batch ", decimal(i % m), " on stage ", decimal(i / m),
                          " misses a pass");
    return "";
}

/// When the input of action `a` exists, given the finish times so far (`never`: not yet).
constexpr std::int64_t input_time(pass_times& t, const action& a, int last_stage) {
    const int st = a.stage, mb = a.micro_batch;
    if (a.kind != pass::forward && t.of(pass::forward, st, mb) == pass_times::never)
        return pass_times::never; // a backward before its own forward never runs
    if (a.kind == pass::forward)
        return st == 0 ? 0 : t.of(pass::forward, st - 1, mb);
    if (a.kind == pass::backward_weight)
        return t.of(pass::backward, st, mb);
    return st == last_stage ? t.of(pass::forward, st, mb) : t.of(pass::backward, st + 1, mb);
}

/// Runs the table `s` (one `table_problem` accepts) into `rep`: each rank takes its next
/// action when the action's input exists (sends never block: they are nonblocking, waited
/// for at the end of the step).
constexpr void simulate(const schedule& s, schedule_report& rep) {
    const int p = s.config.stages;
    pass_times done(s.config.total_stages(), s.config.micro_batches);
    std::vector<std::size_t> next(p, 0);
    std::vector<std::int64_t> free_at(p, 0), busy(p, 0);
    std::vector<int> in_flight(p, 0);
    rep.peak_in_flight.assign(p, 0);
    for (bool progress = true; progress;) {
        progress = false;
        for (int r = 0; r < p; ++r)
            while (next[r] < s.ranks[r].size()) {
                const auto& a = s.ranks[r][next[r]];
                const std::int64_t input = input_time(done, a, s.config.total_stages() - 1);
                if (input == pass_times::never)
                    break;
                const std::int64_t start = std::max(free_at[r], input);
                free_at[r] = start + work_of(a.kind);
                busy[r] += work_of(a.kind);
                done.of(a.kind, a.stage, a.micro_batch) = free_at[r];
                if (a.kind == pass::forward)
                    rep.peak_in_flight[r] = std::max(rep.peak_in_flight[r], ++in_flight[r]);
                else if (a.kind == pass::backward_weight || a.kind == pass::backward)
                    --in_flight[r];
                ++next[r];
                progress = true;
            }
    }
    for (int r = 0; r < p; ++r)
        if (next[r] < s.ranks[r].size()) {
            const auto& a = s.ranks[r][next[r]];
            rep.problem = concat("deadlock: rank ", decimal(r), " waits forever at ",
                                 std::string(1, letter(a.kind)), decimal(a.micro_batch),
                                 " on stage ", decimal(a.stage));
            return;
        }
    rep.deadlock_free = true;
    rep.makespan = *std::max_element(free_at.begin(), free_at.end());
    rep.total = rep.makespan * p;
    rep.idle = rep.total;
    for (int r = 0; r < p; ++r)
        rep.idle -= busy[r];
}

} // namespace detail

/// Checks and simulates `s`: every (micro-batch, virtual stage) has exactly one forward
/// and one backward (or one B and one W) on the rank of its stage, in an order where W
/// follows B; every action's transfers are the ones its stages imply; then runs the table
/// with the work of `work_of` and reports (see `schedule_report`).
constexpr schedule_report analyze(const schedule& s) {
    schedule_report rep;
    rep.problem = detail::table_problem(s);
    if (rep.problem.empty())
        detail::simulate(s, rep);
    return rep;
}

/// `analyze(make_schedule(c))`.
constexpr schedule_report analyze(const schedule_config& c) {
    return analyze(make_schedule(c));
}

} // namespace xshard::pipeline
