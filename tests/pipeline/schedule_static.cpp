// Compile-time proofs about the schedule tables (static_assert only): every table over a
// grid of (p, m, v) is sound and deadlock-free, the bubbles are the closed forms of the
// literature (GPipe and 1F1B (p-1)/(m+p-1), interleaved (p-1)/(vm+p-1), ZB-H1
// (p-1)/(3m+p-1) for m >= p), and 1F1B keeps at most p micro-batches in flight.

#include <xshard/pipeline/analysis.hpp>

namespace {

using namespace xshard::pipeline;

/// bubble == (p-1) / denominator, exactly (cross-multiplied integers).
constexpr bool bubble_is(const schedule_report& r, std::int64_t p, std::int64_t denominator) {
    return r.deadlock_free && r.idle * denominator == r.total * (p - 1);
}

constexpr bool grid_holds(schedule_kind k) {
    for (int p = 1; p <= 6; ++p)
        for (int m = 1; m <= 12; ++m)
            for (int v = 1; v <= (k == schedule_kind::interleaved ? 3 : 1); ++v) {
                if (k == schedule_kind::interleaved && m % p != 0)
                    continue;
                const auto r = analyze(schedule_config{k, p, m, v});
                if (!r.deadlock_free || !r.problem.empty())
                    return false;
                switch (k) {
                case schedule_kind::gpipe:
                    if (!bubble_is(r, p, m + p - 1) || r.peak() != m)
                        return false;
                    break;
                case schedule_kind::one_f_one_b:
                    if (!bubble_is(r, p, m + p - 1) || r.peak() > p || r.peak() != std::min(p, m))
                        return false;
                    break;
                case schedule_kind::interleaved:
                    if (!bubble_is(r, p, v * m + p - 1))
                        return false;
                    break;
                case schedule_kind::zero_bubble:
                    if ((m >= p && !bubble_is(r, p, 3 * m + p - 1)) ||
                        r.peak() >= 2 * p + (p == 1 ? m : 0))
                        return false;
                    break;
                }
            }
    return true;
}

static_assert(grid_holds(schedule_kind::gpipe), "GPipe: bubble (p-1)/(m+p-1), peak m");
static_assert(grid_holds(schedule_kind::one_f_one_b), "1F1B: bubble (p-1)/(m+p-1), peak <= p");
static_assert(grid_holds(schedule_kind::interleaved), "interleaved: bubble (p-1)/(vm+p-1)");
static_assert(grid_holds(schedule_kind::zero_bubble), "ZB-H1: bubble (p-1)/(3m+p-1) for m >= p");

// The cases of the benchmark and the tools, spelled out.
static_assert(analyze(schedule_config{schedule_kind::one_f_one_b, 4, 8, 1}).peak_in_flight ==
              std::vector<int>{4, 3, 2, 1});
static_assert(bubble_is(analyze(schedule_config{schedule_kind::interleaved, 4, 8, 2}), 4, 19));
static_assert(bubble_is(analyze(schedule_config{schedule_kind::zero_bubble, 2, 8, 1}), 2, 25));
// The interleaved schedule beats 1F1B, ZB-H1 beats both (p = 4, m = 8).
static_assert(analyze(schedule_config{schedule_kind::zero_bubble, 4, 8, 1}).bubble() <
              analyze(schedule_config{schedule_kind::interleaved, 4, 8, 2}).bubble());
static_assert(analyze(schedule_config{schedule_kind::interleaved, 4, 8, 2}).bubble() <
              analyze(schedule_config{schedule_kind::one_f_one_b, 4, 8, 1}).bubble());

// 1F1B's first rank: 3 forwards of warm-up, then F, B alternate, sending to rank 1 and
// receiving gradients from it.
constexpr bool first_rank_of_1f1b() {
    const auto s = make_schedule(schedule_config{schedule_kind::one_f_one_b, 4, 8, 1});
    const auto& r0 = s.ranks[0];
    return r0.size() == 16 && r0[0] == action{pass::forward, 0, 0, -1, 1} &&
           r0[3] == action{pass::forward, 3, 0, -1, 1} &&
           r0[4] == action{pass::backward, 0, 0, 1, -1} && r0[15].kind == pass::backward;
}
static_assert(first_rank_of_1f1b());

// The checker catches broken tables: a backward moved before the forward it needs on the
// next rank, and a table missing a pass.
constexpr bool deadlock_is_found() {
    auto s = make_schedule(schedule_config{schedule_kind::one_f_one_b, 2, 2, 1});
    // Rank 0 runs B0 first: it waits for rank 1's B0, which waits for rank 0's F0.
    std::swap(s.ranks[0][0], s.ranks[0][2]);
    const auto r = analyze(s);
    return !r.deadlock_free && r.problem.starts_with("deadlock: rank 0");
}
static_assert(deadlock_is_found());

constexpr bool missing_pass_is_found() {
    auto s = make_schedule(schedule_config{schedule_kind::gpipe, 2, 2, 1});
    s.ranks[1].pop_back();
    return !analyze(s).deadlock_free &&
           analyze(s).problem.find("misses a pass") != std::string::npos;
}
static_assert(missing_pass_is_found());

} // namespace

// Boundary layouts checked at compile time (boundary.hpp): a stage's input layout fits the
// stage mesh's axes, has the boundary tensor's rank and no pending reduction.
#include <xshard/core/mesh.hpp>
#include <xshard/pipeline/boundary.hpp>

namespace {
using stage_mesh_names = xshard::mesh<"dp", "tp">;
using xshard::pipeline::boundary_problem;
using xshard::pipeline::check_boundary_layout;
static_assert(check_boundary_layout("[dp, tp]", 2, stage_mesh_names::axis_names) ==
              boundary_problem::none);
static_assert(check_boundary_layout("[(dp,tp), -]", 2, stage_mesh_names::axis_names) ==
              boundary_problem::none);
static_assert(check_boundary_layout("[dp]", 2, stage_mesh_names::axis_names) ==
              boundary_problem::wrong_rank);
static_assert(check_boundary_layout("[pp, -]", 2, stage_mesh_names::axis_names) ==
              boundary_problem::bad_layout);
static_assert(check_boundary_layout("[dp, dp]", 2, stage_mesh_names::axis_names) ==
              boundary_problem::bad_layout);
static_assert(check_boundary_layout("[dp, -] partial(sum: tp)", 2, stage_mesh_names::axis_names) ==
              boundary_problem::partial_input);
} // namespace
