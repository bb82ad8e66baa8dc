// Redistribution between random pairs of layouts on every test mesh: the global tensor is
// preserved exactly, the bytes moved are those the plan predicts, every rank receives
// exactly the elements it lacks (counted at the MPI boundary, against a brute-force count
// over the elements), a reused plan gives the same result, and the plan's buffers stay
// within its memory figure.

#include <xshard/comm/node.hpp>
#include <xshard/core/node_shared.hpp>
#include <xshard/redistribute/redistribute.hpp>
#include <xshard/tensor/distribute.hpp>
#include <xshard/tensor/gather.hpp>

#include "layouts.hpp"
#include "mpi_test.hpp"
#include "traffic.hpp"

#include <gtest/gtest.h>
#include <xtensor/xrandom.hpp>
#include <xtensor/xtensor.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <random>
#include <thread>

namespace {

using xshard::dynamic_layout;
using xshard::layout;
using xshard::testing::all_layouts;
using xshard::testing::for_each_mesh;
using xshard::testing::where;
using xshard::testing::world;

/// A source tensor of layout `l` whose gathered value is known: for partial layouts each
/// term (indexed by the rank's position along the partial axes) is different, and
/// `expected` receives their reduction.
template <std::size_t N, class Mesh>
auto make_source(const Mesh& m, const std::array<std::size_t, N>& shape, const layout& l,
                 xt::xtensor<long long, N>& expected) {
    const auto partial = l.partial_axes(m.shape());
    const int terms = m.shape().group_size(partial);
    // Each term's offset is a hash of its position p: a plan that reduces over the wrong
    // axes (or counts a term twice) gets another value. (p * 1000 * (p % 2 ? -1 : 1) did
    // not: on four terms 0 + -1000 == 2000 + -3000, so a route that reduced b, c wrongly as
    // c, a on 2x2x2 went unseen in most draws.)
    auto term = [&](int p, std::size_t i) {
        return (long long)((i * 7 + 3) % 101) - 50 +
               (long long)((unsigned long long)p * 2654435761ULL % 65521ULL);
    };
    expected = xt::xtensor<long long, N>::from_shape(shape);
    for (std::size_t i = 0; i < expected.size(); ++i) {
        long long v = term(0, i);
        for (int p = 1; p < terms; ++p)
            v = l.op == xshard::reduction::sum   ? v + term(p, i)
                : l.op == xshard::reduction::max ? std::max(v, term(p, i))
                                                 : std::min(v, term(p, i));
        expected.data()[i] = v;
    }
    const int me = m.shape().group_rank(m.rank(), partial);
    auto mine = xt::xtensor<long long, N>::from_shape(shape);
    for (std::size_t i = 0; i < mine.size(); ++i)
        mine.data()[i] = term(me, i);
    // Every rank slices its term; distribute would zero the terms of a sum, so cut the block
    // directly.
    const auto b = xshard::block_of(l, m.shape(), shape, m.rank());
    xt::xtensor<long long, N> local = xshard::detail::view_of(mine, b);
    return xshard::from_local(m, shape, std::move(local), l);
}

/// The bytes the other members of `m` sent to this rank, as counted by `traffic` since its
/// last reset (collective over the mesh).
template <class Mesh>
unsigned long long bytes_received(const Mesh& m) {
    auto sent = xshard::testing::traffic::sent_to();
    xshard::mpi::allreduce(m.comm(), std::span(sent.data(), sent.size()), xshard::reduction::sum);
    return sent[std::size_t(world().rank())];
}

template <std::size_t N>
std::array<std::size_t, N> random_shape(std::mt19937& rng) {
    std::array<std::size_t, N> s{};
    std::uniform_int_distribution<std::size_t> extent(1, N <= 2 ? 9 : 5);
    for (auto& e : s)
        e = extent(rng);
    return s;
}

template <std::size_t N, class Mesh>
void random_pairs(const Mesh& m, int pairs, unsigned seed) {
    const auto layouts = all_layouts(m.shape(), N, true);
    std::mt19937 rng(seed); // the same draws on every rank
    std::uniform_int_distribution<std::size_t> pick(0, layouts.size() - 1);
    for (int k = 0; k < pairs; ++k) {
        const auto shape = random_shape<N>(rng);
        const auto& from = layouts[pick(rng)];
        const auto& to = layouts[pick(rng)];
        xt::xtensor<long long, N> expected;
        const auto src = make_source(m, shape, from, expected);
        auto plan = xshard::make_redistribution<dynamic_layout(N)>(src, to);
        xshard::testing::traffic::reset();
        const auto out = plan(src);
        const auto sent = xshard::testing::traffic::sent();
        const auto received = bytes_received(m);
        const std::string what = from.to_string() + " -> " + to.to_string() + " shape " +
                                 xshard::detail::shape_string(shape) + " " + where(m);
        ASSERT_EQ(xshard::gather_all(out), expected) << what << "\n" << plan.describe();
        // The bytes this rank handed to MPI are the ones the plan counted and predicted
        // (counted where they go point to point: every step but the reductions, which small
        // tensors leave to MPI_Allreduce and MPI_Reduce_scatter).
        const auto& steps = plan.plan().summary().steps;
        if (std::none_of(steps.begin(), steps.end(), [](const auto& s) {
                return s.planned.kind == xshard::step_kind::all_reduce ||
                       s.planned.kind == xshard::step_kind::reduce_scatter;
            })) {
            EXPECT_EQ(sent, plan.plan().bytes_sent()) << what;
        }
        EXPECT_EQ(plan.plan().bytes_sent(), plan.plan().summary().bytes_sent()) << what;
        // Without reductions, a rank receives at least the elements it lacks; in one step,
        // exactly those (no byte travels to a rank that does not need it, none twice).
        if (!from.is_partial() && !to.is_partial()) {
            const auto lacking =
                xshard::testing::elements_lacking(m.shape(), shape, from, to, m.rank()) *
                sizeof(long long);
            if (plan.plan().summary().steps.size() <= 1) {
                EXPECT_EQ(received, lacking) << what << "\n" << plan.describe();
            } else {
                EXPECT_GE(received, lacking) << what << "\n" << plan.describe();
            }
        }
        // The plan holds exactly what its summary says, no more.
        EXPECT_EQ(plan.plan().allocations().peak, plan.plan().summary().peak_extra_bytes) << what;
        // Reused: the same result, into the same tensor, with nothing allocated.
        auto again = out;
        const auto allocations = plan.plan().allocations().allocations;
        plan.execute(src, again);
        EXPECT_EQ(plan.plan().allocations().allocations, allocations) << what;
        ASSERT_EQ(again.local(), out.local()) << what;
    }
}

TEST(redistribute, random_layout_pairs_preserve_the_tensor) {
    for_each_mesh([](const auto& m) {
        random_pairs<1>(m, 60, 1);
        random_pairs<2>(m, 120, 2);
        random_pairs<3>(m, 80, 3);
        random_pairs<4>(m, 40, 4);
    });
}

TEST(redistribute, single_step_plans_stay_within_one_destination_block) {
    for_each_mesh([](const auto& m) {
        const std::array<std::size_t, 2> shape{64, 48};
        for (const auto& from : all_layouts(m.shape(), 2, false)) {
            for (const auto& to : all_layouts(m.shape(), 2, false)) {
                // The route a plan takes (its steps are asserted equal below): routes of
                // several steps are skipped before any plan is built.
                const auto route =
                    xshard::choose_route(xshard::plan_redistribution(from, to), m.shape(), shape,
                                         sizeof(long long), xshard::cost_model{});
                if (route.steps.size() != 1)
                    continue;
                xt::xtensor<long long, 2> expected;
                const auto src = make_source(m, shape, from, expected);
                auto plan = xshard::make_redistribution<dynamic_layout(2)>(src, to);
                const auto& s = plan.plan().summary();
                ASSERT_EQ(s.steps.size(), 1u) << from << " -> " << to << " " << where(m);
                EXPECT_LE(plan.plan().allocations().peak, s.destination_bytes)
                    << from << " -> " << to << " " << where(m) << "\n"
                    << plan.describe();
            }
        }
    });
}

TEST(redistribute, plans_routed_through_an_intermediate_layout_are_exact) {
    // Where going through a third layout is cheaper than every greedy candidate (route.hpp),
    // the plan runs that route: the values must be those of the serial reference all the same.
    // Under the default model and under one whose all-to-alls and exchanges are 10x slower
    // (so that on every mesh of 2 ranks or more an all-gather and a slice beat them).
    xshard::cost_model slow_exchange;
    for (auto* link : {&slow_exchange.all_to_all, &slow_exchange.exchange}) {
        link->alpha *= 10;
        link->beta *= 10;
    }
    const std::array<xshard::cost_model, 2> models{xshard::cost_model{}, slow_exchange};
    for (std::size_t k = 0; k < models.size(); ++k) {
        const auto& model = models[k];
        for_each_mesh([&](const auto& m) {
            const std::array<std::size_t, 2> shape{96, 75};
            int routed = 0;
            std::size_t pair = 0;
            for (const auto& from : all_layouts(m.shape(), 2, true)) {
                for (const auto& to : all_layouts(m.shape(), 2, true)) {
                    // 2x2x2 has about 135 x 135 pairs, and under the slow exchanges a search
                    // settles most of its layouts: every 211th (three-axis meshes are
                    // routed_plans_on_three_axis_meshes_are_exact's).
                    if (m.shape().ndim() > 2 && pair++ % 211 != 0)
                        continue;
                    const auto candidates = xshard::plan_redistribution(from, to);
                    const auto route = xshard::choose_route(candidates, m.shape(), shape,
                                                            sizeof(long long), model);
                    if (std::find(candidates.paths.begin(), candidates.paths.end(), route.steps) !=
                        candidates.paths.end())
                        continue;
                    ++routed;
                    xt::xtensor<long long, 2> expected;
                    const auto src = make_source(m, shape, from, expected);
                    auto plan = xshard::make_redistribution<dynamic_layout(2)>(src, to, model);
                    const auto& steps = plan.plan().summary().steps;
                    ASSERT_EQ(steps.size(), route.steps.size()) << plan.describe();
                    for (std::size_t i = 0; i < steps.size(); ++i)
                        ASSERT_EQ(steps[i].planned, route.steps[i]) << plan.describe();
                    const auto out = plan(src);
                    ASSERT_EQ(xshard::gather_all(out), expected)
                        << from << " -> " << to << " " << where(m) << "\n"
                        << plan.describe();
                }
            }
            if (k == 1 && m.shape().size() > 1) {
                EXPECT_GT(routed, 0) << where(m);
            }
        });
    }
}

/// Meshes of three axes over the whole world, with axes of size 1: (1, W, 1), (W, 1, 1),
/// (2, 1, W/2) and (3, 1, W/3) where they divide, and 2x2x2 at 8 ranks.
template <class F>
void for_each_three_axis_mesh(F&& f) {
    const auto w = world();
    const int p = w.size();
    std::vector<std::array<int, 3>> shapes{{1, p, 1}, {p, 1, 1}};
    if (p % 2 == 0 && p > 2)
        shapes.push_back({2, 1, p / 2});
    if (p % 3 == 0 && p > 3)
        shapes.push_back({3, 1, p / 3});
    if (p == 8)
        shapes.push_back({2, 2, 2});
    for (const auto& s : shapes)
        f(xshard::mesh<"a", "b", "c">(w, s));
}

/// Random pairs of rank-N layouts (partial states with sum and max included) on `m`, each
/// planned under `model` and redistributed; adds to `routed` how many ran a route through an
/// intermediate layout (not one of the greedy candidates).
template <std::size_t N, class Mesh>
void routed_random_pairs(const Mesh& m, const xshard::cost_model& model, int pairs, unsigned seed,
                         int& routed) {
    const auto layouts = all_layouts(m.shape(), N, true);
    std::mt19937 rng(seed); // the same draws on every rank
    std::uniform_int_distribution<std::size_t> pick(0, layouts.size() - 1);
    for (int k = 0; k < pairs; ++k) {
        auto shape = random_shape<N>(rng);
        if (k % 2 == 1) // larger tensors too: bandwidth-bound steps route differently
            for (auto& e : shape)
                e = e * 13 + 5;
        const auto& from = layouts[pick(rng)];
        const auto& to = layouts[pick(rng)];
        xt::xtensor<long long, N> expected;
        const auto src = make_source(m, shape, from, expected);
        auto plan = xshard::make_redistribution<dynamic_layout(N)>(src, to, model);
        const auto candidates = xshard::plan_redistribution(from, to);
        std::vector<xshard::step> steps;
        for (const auto& s : plan.plan().summary().steps)
            steps.push_back(s.planned);
        routed +=
            std::none_of(candidates.paths.begin(), candidates.paths.end(), [&](const auto& c) {
                return std::equal(c.begin(), c.end(), steps.begin(), steps.end());
            });
        ASSERT_EQ(xshard::gather_all(plan(src)), expected)
            << from << " -> " << to << " shape " << xshard::detail::shape_string(shape) << " "
            << where(m) << "\n"
            << plan.describe();
    }
}

TEST(redistribute, routed_plans_on_three_axis_meshes_are_exact) {
    // The plan a route search gives on meshes of three axes (route.hpp), against the serial
    // reference, under the default model and one whose all-to-alls and exchanges are 10x
    // slower (more routes). First the pair that lost values when a reduce_scatter edge could
    // name a new partial axis ([-] partial(sum: b, c) -> [c] partial(sum: a)).
    xshard::cost_model slow_exchange;
    for (auto* link : {&slow_exchange.all_to_all, &slow_exchange.exchange}) {
        link->alpha *= 10;
        link->beta *= 10;
    }
    for_each_three_axis_mesh([&](const auto& m) {
        for (const auto& model : {xshard::cost_model{}, slow_exchange}) {
            for (std::size_t n : {1, 2, 3, 5, 7, 8, 9, 13, 64, 1000}) {
                const std::array<std::size_t, 1> shape{n};
                for (const char* from : {"[-] partial(sum: b, c)", "[a] partial(sum: b, c)",
                                         "[-] partial(max: a, c)", "[b] partial(sum: a)"}) {
                    for (const char* to : {"[(c,b,a)]", "[(c,b)] partial(sum: a)", "[c]"}) {
                        xt::xtensor<long long, 1> expected;
                        const auto src = make_source(m, shape, layout(from), expected);
                        auto plan =
                            xshard::make_redistribution<dynamic_layout(1)>(src, layout(to), model);
                        ASSERT_EQ(xshard::gather_all(plan(src)), expected)
                            << from << " -> " << to << " shape " << n << " " << where(m) << "\n"
                            << plan.describe();
                    }
                }
            }
        }
        int routed = 0;
        for (std::size_t k = 0; k < 2; ++k) {
            const auto& model = k == 0 ? xshard::cost_model{} : slow_exchange;
            routed_random_pairs<1>(m, model, 60, 31 + unsigned(k), routed);
            routed_random_pairs<2>(m, model, 60, 33 + unsigned(k), routed);
            routed_random_pairs<3>(m, model, 25, 35 + unsigned(k), routed);
        }
        if (m.shape().size() > 1) {
            EXPECT_GT(routed, 0) << where(m);
        }
    });
}

TEST(redistribute, typed_layouts_plan_at_compile_time) {
    using M = xshard::mesh<"dp", "mp">;
    const M m = xshard::testing::world_mesh_2d();
    const std::array<std::size_t, 2> shape{13, 10};
    std::mt19937 e(5);
    const xt::xtensor<double, 2> g = xt::random::rand<double>(shape, 0.0, 1.0, e);

    auto a = xshard::distribute<"[(dp,mp), -]">(m, g);
    auto b = xshard::redistribute<"[-, (mp,dp)]">(a);
    static_assert(std::is_same_v<decltype(b), xshard::dtensor<double, M, "[-, (mp,dp)]">>);
    EXPECT_EQ(xshard::gather_all(b), g);
    // Partial to split: the reduced values land split.
    auto p = xshard::distribute<"[-, mp] partial(sum: dp)">(m, g);
    auto q = xshard::redistribute<"[dp, -]">(p);
    EXPECT_TRUE(xt::allclose(xshard::gather_all(q), g));
    // Identical layouts: moved, not copied.
    const double* storage = q.local().data();
    auto r = xshard::redistribute<"[dp, -]">(std::move(q));
    EXPECT_EQ(r.local().data(), storage);
    // A run-time layout to a typed one and back.
    auto d = xshard::redistribute<dynamic_layout(2)>(r, layout("[mp, dp]"));
    EXPECT_EQ(d.layout(), layout("[mp, dp]"));
    EXPECT_EQ(xshard::gather_all(xshard::redistribute<"[-, -]">(d)), xshard::gather_all(r));
}

/// Tuning that sends every step among ranks of one node through shared memory, and tuning
/// that keeps every step on MPI messages.
const xshard::reduce_tuning through_shared_memory{.shared_memory_min_bytes = 0,
                                                  .shared_memory_all_reduce = true};
const xshard::reduce_tuning through_messages{.shared_memory_min_bytes = SIZE_MAX};
/// The shared-memory path with every output block written with non-temporal stores.
const xshard::reduce_tuning streaming_through_shared_memory{.shared_memory_min_bytes = 0,
                                                            .shared_memory_all_reduce = true,
                                                            .shared_memory_streaming_bytes = 0};

/// Whether the ranks of this rank's group along `axes` ("dp,mp", as plan summaries name
/// them) share one node and allow shared memory. Collective over that group.
template <class Mesh>
bool group_on_one_node(const Mesh& m, const std::string& axes) {
    xshard::axis_set group{};
    for (std::size_t at = 0; at < axes.size();) {
        const std::size_t comma = std::min(axes.find(',', at), axes.size());
        group = group | xshard::axis_set::of(m.shape().index(axes.substr(at, comma - at)));
        at = comma + 1;
    }
    return xshard::node_group(m.sub(group)).whole_communicator_shares_memory();
}

/// Random pairs through the shared-memory path (redistribute/node_step.hpp): exact values;
/// a reused plan on new values whose writers are deliberately slow (ranks arrive at
/// different times, so a reader that did not wait for the owner's staging would read the
/// old values); not a byte through MPI once the windows are set up; and the result fed to a
/// plan on MPI messages and back (tensors of both paths mixed). Over several nodes the
/// steps within a node take that path and the others MPI's (a hierarchical plan).
template <std::size_t N, class Mesh>
void random_pairs_shared(const Mesh& m, int pairs, unsigned seed, bool in_storage = false,
                         const xshard::reduce_tuning& tuning = through_shared_memory) {
    const auto layouts = all_layouts(m.shape(), N, true);
    std::mt19937 rng(seed); // the same draws on every rank
    std::uniform_int_distribution<std::size_t> pick(0, layouts.size() - 1);
    for (int k = 0; k < pairs; ++k) {
        const auto shape = random_shape<N>(rng);
        const auto& from = layouts[pick(rng)];
        const auto& to = layouts[pick(rng)];
        xt::xtensor<long long, N> expected;
        const auto src = make_source(m, shape, from, expected);
        const std::string what = from.to_string() + " -> " + to.to_string() + " shape " +
                                 xshard::detail::shape_string(shape) + " " + where(m);
        auto plan = xshard::make_redistribution<dynamic_layout(N)>(src, to, {}, tuning);
        auto out = plan(src);
        ASSERT_EQ(xshard::gather_all(out), expected) << what << "\n" << plan.describe();
        const auto& steps = plan.plan().summary().steps;
        bool within = false, across = false; // communicating steps within a node, across
        for (const auto& s : steps)
            if (s.group_size > 1 && s.planned.kind != xshard::step_kind::zero)
                (group_on_one_node(m, s.group) ? within : across) = true;
        EXPECT_EQ(plan.plan().shared_memory_steps() > 0, within) << what;
        // New values (three times the old: sums, maxima and minima scale alike), written
        // late by some ranks.
        auto again = src;
        again.local() *= 3LL;
        std::this_thread::sleep_for(std::chrono::milliseconds(2 * (m.rank() % 3)));
        xshard::testing::traffic::reset();
        plan.execute(again, out);
        const auto sent = xshard::testing::traffic::sent();
        const xt::xtensor<long long, N> tripled = 3LL * expected;
        ASSERT_EQ(xshard::gather_all(out), tripled) << what;
        if (xshard::shared_memory_allowed() && !across) {
            EXPECT_EQ(sent, 0u) << what << ": bytes went through MPI";
        }
        // Shards in node storage on every rank, one step: read in place, no staging window.
        // An exchange among them: every member writes its block into the destinations.
        if (in_storage && steps.size() == 1) {
            EXPECT_EQ(plan.plan().window_bytes(), 0u) << what;
            const auto kind = steps[0].planned.kind;
            const bool exchange =
                kind != xshard::step_kind::all_reduce && kind != xshard::step_kind::reduce_scatter;
            EXPECT_EQ(plan.plan().steps_written_in_place(),
                      exchange && plan.plan().shared_memory_steps() == 1 ? 1u : 0u)
                << what;
        }
        // Mixed: back to the source layout on MPI messages, then once more through shared
        // memory from a tensor the MPI path made.
        auto back = xshard::make_redistribution<dynamic_layout(N)>(out, from, {}, through_messages);
        const auto returned = back(out);
        auto forth =
            xshard::make_redistribution<dynamic_layout(N)>(returned, to, {}, through_shared_memory);
        ASSERT_EQ(xshard::gather_all(forth(returned)), tripled) << what;
    }
}

TEST(redistribute, through_shared_memory_the_tensor_is_preserved) {
    for_each_mesh([](const auto& m) {
        random_pairs_shared<1>(m, 12, 11);
        random_pairs_shared<2>(m, 24, 12);
        random_pairs_shared<3>(m, 12, 13);
        // Output blocks written with non-temporal stores (and fenced before the barrier).
        random_pairs_shared<2>(m, 12, 14, false, streaming_through_shared_memory);
    });
}

/// Whether every rank of the world has an open node arena with `bytes` free.
bool storage_everywhere(const xshard::node_storage& storage, std::size_t bytes) {
    int ok = storage.is_open() && storage.free_bytes() >= bytes ? 1 : 0;
    xshard::mpi::allreduce(world(), std::span(&ok, 1), xshard::reduction::min);
    return ok == 1;
}

TEST(redistribute, shards_in_node_storage_are_read_in_place) {
    // The same random pairs with every shard in node storage (node_shared meshes): exact,
    // no byte through MPI, and single-step plans need no staging window.
    xshard::node_storage storage(world(), 1 << 20);
    const bool everywhere = storage_everywhere(storage, 1 << 20);
    for_each_mesh([&](const auto& m) {
        const xshard::node_shared<std::remove_cvref_t<decltype(m)>> nm(m);
        random_pairs_shared<1>(nm, 12, 21, everywhere);
        random_pairs_shared<2>(nm, 24, 22, everywhere);
        random_pairs_shared<3>(nm, 12, 23, everywhere);
        random_pairs_shared<3>(nm, 12, 24, everywhere, streaming_through_shared_memory);
    });
}

TEST(redistribute, large_blocks_written_in_place_band_by_band_are_exact) {
    // Blocks of many bands (64 KiB each, node_step.hpp's push): bands of the first dimension,
    // and of the second at every index of the first (slices of the first too large), each
    // written into every destination in node storage, exact.
    xshard::node_storage storage(world(), 16 << 20);
    const bool everywhere = storage_everywhere(storage, 16 << 20);
    const std::array<std::array<std::size_t, 3>, 2> shapes{{{40, 70, 50}, {3, 301, 53}}};
    const std::pair<const char*, const char*> pairs[] = {{"[x, -, -]", "[-, -, x]"},
                                                         {"[-, x, -]", "[x, -, -]"},
                                                         {"[-, -, x]", "[-, x, -]"},
                                                         {"[x, -, -]", "[-, -, -]"},
                                                         {"[-, x, -]", "[-, -, -]"}};
    using M = xshard::node_shared<xshard::mesh<"x">>;
    const M m(world(), {world().size()});
    for (const auto& shape : shapes)
        for (const bool streaming : {false, true}) // cached or non-temporal stores
            for (const auto& [from, to] : pairs) {
                xt::xtensor<long long, 3> expected;
                const auto src = make_source(m, shape, layout(from), expected);
                auto plan = xshard::make_redistribution<dynamic_layout(3)>(
                    src, layout(to), {},
                    streaming ? streaming_through_shared_memory : through_shared_memory);
                const std::string what = std::string(from) + " -> " + to + " shape " +
                                         xshard::detail::shape_string(shape) +
                                         (streaming ? " streaming" : "");
                EXPECT_EQ(xshard::gather_all(plan(src)), expected) << what;
                if (everywhere && world().size() > 1 && xshard::shared_memory_allowed()) {
                    EXPECT_EQ(plan.plan().steps_written_in_place(), 1u) << what;
                }
            }
}

TEST(redistribute, shards_partly_in_node_storage_are_exact) {
    // Mixed: every other rank's arena too small for any shard (theirs go to the heap and are
    // staged), and arenas that fill up during the test.
    const auto w = world();
    xshard::node_storage storage(w, w.rank() % 2 ? 4096 : 64);
    for_each_mesh([&](const auto& m) {
        const xshard::node_shared<std::remove_cvref_t<decltype(m)>> nm(m);
        random_pairs_shared<2>(nm, 16, 31);
        random_pairs_shared<3>(nm, 8, 32);
    });
}

TEST(redistribute, shards_in_different_arenas_are_staged) {
    // Each half of the world opens its own node storage: members of a step that spans both
    // halves cannot read each other's arena through their own, so every member stages its
    // block (after the first barrier, those whose block lies in their arena), exact.
    const auto w = world();
    const auto half = w.split(w.rank() % 2, w.rank());
    xshard::node_storage storage(half, 1 << 20);
    for_each_mesh([&](const auto& m) {
        const xshard::node_shared<std::remove_cvref_t<decltype(m)>> nm(m);
        random_pairs_shared<2>(nm, 12, 41);
    });
}

TEST(redistribute, plans_whose_blocks_move_in_and_out_of_node_storage_are_exact) {
    // One plan run on blocks on the heap and in node storage by turns: reading (staged),
    // writing in place, and reading again after a run that wrote in place (which skips the
    // early staging its prediction makes useless, so the members stage late), with new
    // values every run. Exact, and the runs into node storage are written in place.
    const auto w = world();
    for_each_mesh([&](const auto& m) {
        const xshard::node_shared<std::remove_cvref_t<decltype(m)>> nm(m);
        const auto layouts = all_layouts(nm.shape(), 2, false);
        std::mt19937 rng(61);
        std::uniform_int_distribution<std::size_t> pick(0, layouts.size() - 1);
        int tested = 0; // pairs whose plan has a shared-memory step
        for (int k = 0; k < 60 && tested < 6; ++k) {
            const auto shape = random_shape<2>(rng);
            const auto& from = layouts[pick(rng)];
            const auto& to = layouts[pick(rng)];
            const std::string what = from.to_string() + " -> " + to.to_string() + " shape " +
                                     xshard::detail::shape_string(shape) + " " + where(nm);
            xt::xtensor<long long, 2> expected;
            auto src_heap = make_source(nm, shape, from, expected); // no storage open: heap
            auto plan = xshard::make_redistribution<dynamic_layout(2)>(src_heap, to, {},
                                                                       through_shared_memory);
            auto out_heap = plan(src_heap);
            if (plan.plan().shared_memory_steps() == 0)
                continue; // (the same on every rank)
            ++tested;
            const std::size_t bytes =
                (src_heap.local().size() + out_heap.local().size()) * sizeof(long long);
            xshard::node_storage storage(w, bytes + 4096);
            {
                auto src_node = src_heap; // copies into node storage
                auto out_node = plan(src_node);
                if (src_node.local().size() > 0) {
                    EXPECT_TRUE(xshard::node_arena::locate(src_node.local().data())) << what;
                }
                long long factor = 1;
                const std::array<std::pair<bool, bool>, 6> runs{
                    {{false, false},
                     {false, true},
                     {false, false},
                     {true, true},
                     {true, false},
                     {false, true}}}; // (source, destination) in node storage
                for (const auto& [in_node, into_node] : runs) {
                    factor += 2;
                    auto& src = in_node ? src_node : src_heap;
                    auto& out = into_node ? out_node : out_heap;
                    const auto before = src.local();
                    src.local() *= factor;
                    plan.execute(src, out);
                    const xt::xtensor<long long, 2> want = factor * expected;
                    ASSERT_EQ(xshard::gather_all(out), want)
                        << what << " source in node storage " << in_node << ", destination "
                        << into_node << "\n"
                        << plan.describe();
                    src.local() = before;
                    const auto& steps = plan.plan().summary().steps;
                    // (One step, whose kind says it all, and no empty destination block: an
                    // empty block is not in node storage, and then every member reads.)
                    int filled = out_node.local().size() > 0;
                    xshard::mpi::allreduce(w, std::span(&filled, 1), xshard::reduction::min);
                    if (steps.size() == 1 && filled) {
                        const bool exchange =
                            plan.plan().shared_memory_steps() == 1 &&
                            steps[0].planned.kind != xshard::step_kind::all_reduce &&
                            steps[0].planned.kind != xshard::step_kind::reduce_scatter;
                        EXPECT_EQ(plan.plan().steps_written_in_place(),
                                  exchange && into_node ? 1u : 0u)
                            << what << " destination in node storage " << into_node;
                    }
                }
            }
        }
        if (xshard::shared_memory_allowed() && nm.size() > 1) {
            EXPECT_EQ(tested, 6) << where(nm);
        }
    });
}

TEST(redistribute, tensors_in_node_storage_take_the_node_path_by_default) {
    // From 1 MiB on, without any tuning, all-reduce included; smaller ones and ordinary
    // meshes keep MPI messages.
    const auto w = world();
    xshard::node_storage storage(w, 8 << 20);
    const xshard::mesh<"x"> plain(w, {w.size()});
    const xshard::node_shared<xshard::mesh<"x">> m(plain);
    const std::array<std::size_t, 2> big{512, 300}, small{16, 3}; // 1.17 MiB, 384 B
    const bool node = w.size() > 1 && xshard::shared_memory_allowed();
    for (const char* to : {"[-, x]", "[-, -]"}) {
        auto a =
            xshard::full<double, dynamic_layout(2)>(m, big, 1.0, layout("[-, -] partial(sum: x)"));
        auto pa = xshard::make_redistribution<dynamic_layout(2)>(a, layout(to));
        const xt::xtensor<double, 2> ones = xt::ones<double>(big);
        EXPECT_EQ(xshard::gather_all(pa(a)), ones) << to;
        EXPECT_EQ(pa.plan().shared_memory_steps() > 0, node) << to;
        auto b = xshard::full<double, dynamic_layout(2)>(m, small, 1.0, layout("[x, -]"));
        auto pb = xshard::make_redistribution<dynamic_layout(2)>(b, layout(to));
        (void)pb(b);
        EXPECT_EQ(pb.plan().shared_memory_steps(), 0u) << to;
        auto c = xshard::full<double, dynamic_layout(2)>(plain, big, 1.0, layout("[x, -]"));
        auto pc = xshard::make_redistribution<dynamic_layout(2)>(c, layout(to));
        (void)pc(c);
        EXPECT_EQ(pc.plan().shared_memory_steps(), 0u) << to;
    }
}

TEST(redistribute, a_slow_writer_is_never_read_early) {
    // In place, a reader reads the owner's shard itself: a rank that writes its shard late
    // (sleeping while the others already entered the redistribution) must still be read
    // after it wrote, and a rank that overwrites its shard as soon as its call returns must
    // not disturb a peer still reading. All-to-all, all-gather and the reductions, exact.
    const auto w = world();
    xshard::node_storage storage(w, 1 << 22);
    using M = xshard::node_shared<xshard::mesh<"x">>;
    const M m(w, {w.size()});
    const std::array<std::size_t, 2> shape{std::size_t(37 * w.size() + 5), 29};
    const std::pair<const char*, const char*> pairs[] = {{"[x, -]", "[-, x]"},
                                                         {"[x, -]", "[-, -]"},
                                                         {"[-, x]", "[x, -]"},
                                                         {"[-, -] partial(sum: x)", "[-, -]"},
                                                         {"[-, -] partial(sum: x)", "[x, -]"}};
    for (const auto& [from, to] : pairs) {
        const bool partial = std::string_view(from).find("partial") != std::string_view::npos;
        auto value = [&](int round, int term, std::size_t i) {
            return (long long)(i % 1009) * (round + 1) + (partial ? 100000LL * term : 0);
        };
        auto src = xshard::zeros<long long, dynamic_layout(2)>(m, shape, layout(from));
        auto plan = xshard::make_redistribution<dynamic_layout(2)>(src, layout(to), {},
                                                                   through_shared_memory);
        auto out = plan(src);
        const auto b = src.block();
        for (int round = 0; round < 6; ++round) {
            if (m.rank() == round % m.size())
                std::this_thread::sleep_for(std::chrono::milliseconds(20));
            // This rank's shard: its block of the global tensor (its own term, partial).
            auto& local = src.local();
            const auto ext = b.extent;
            for (std::size_t r = 0; r < ext[0]; ++r)
                for (std::size_t c = 0; c < ext[1]; ++c)
                    local(r, c) = value(round, partial ? m.rank() : 0,
                                        (b.offset[0] + r) * shape[1] + b.offset[1] + c);
            plan.execute(src, out);
            local.fill(-1); // at once: a peer still reading would see it
            auto expected = xt::xtensor<long long, 2>::from_shape(shape);
            for (std::size_t i = 0; i < expected.size(); ++i) {
                expected.data()[i] = 0;
                for (int q = 0; q < (partial ? m.size() : 1); ++q)
                    expected.data()[i] += value(round, q, i);
            }
            const auto ob = out.block();
            bool exact = true;
            for (std::size_t r = 0; r < ob.extent[0] && exact; ++r)
                for (std::size_t c = 0; c < ob.extent[1] && exact; ++c)
                    exact = out.local()(r, c) == expected(ob.offset[0] + r, ob.offset[1] + c);
            EXPECT_TRUE(exact) << from << " -> " << to << " round " << round << " rank "
                               << m.rank();
        }
    }
}

TEST(redistribute, through_shared_memory_large_reductions_are_exact) {
    // Reductions beyond the all-reduce's cache chunk, sums of doubles that are integers (so
    // exact whatever the order), partial -> replicate / split / split of dimension 1.
    for_each_mesh([](const auto& m) {
        if (m.shape().ndim() != 1)
            return;
        const std::array<std::size_t, 2> shape{1237, 11};
        const layout from = "[-, -] partial(sum: x)";
        for (const char* to : {"[-, -]", "[x, -]", "[-, x]"}) {
            auto local = xt::xtensor<double, 2>::from_shape(shape);
            auto expected = xt::xtensor<double, 2>::from_shape(shape);
            for (std::size_t i = 0; i < local.size(); ++i) {
                local.data()[i] = double(int(i % 97) - 40 + 1000 * m.rank());
                expected.data()[i] = 0;
                for (int q = 0; q < m.size(); ++q)
                    expected.data()[i] += double(int(i % 97) - 40 + 1000 * q);
            }
            const auto src = xshard::from_local(m, shape, local, from);
            for (const auto& tuning : {through_shared_memory, through_messages}) {
                auto plan =
                    xshard::make_redistribution<dynamic_layout(2)>(src, layout(to), {}, tuning);
                for (int run = 0; run < 2; ++run)
                    EXPECT_EQ(xshard::gather_all(plan(src)), expected)
                        << to << " run " << run << " " << where(m);
            }
        }
    });
}

TEST(redistribute, misuse_raises_on_every_rank) {
    const auto w = world();
    const xshard::mesh<"x"> m(w, {w.size()});
    const xshard::mesh<"x"> other(w, {w.size()});
    const std::array<std::size_t, 1> shape{std::size_t(3 * w.size() + 1)};
    auto t = xshard::zeros<double, "[x]">(m, shape);
    auto plan = xshard::make_redistribution<"[-]">(t);
    // Another mesh, another shape.
    EXPECT_THROW(plan(xshard::zeros<double, "[x]">(other, shape)), xshard::error);
    EXPECT_THROW(plan(xshard::zeros<double, "[x]">(m, {shape[0] + 1})), xshard::error);
    // A shard resized on one rank only: every rank throws.
    auto broken = t;
    if (m.rank() == 0)
        broken.local() = xt::zeros<double>({std::size_t(1000)});
    EXPECT_THROW(plan(broken), xshard::error);
    // A run-time layout the mesh cannot have.
    EXPECT_THROW(xshard::redistribute<dynamic_layout(1)>(t, layout("[y]")), xshard::error);
    // Everyone is still in step.
    EXPECT_EQ(xshard::gather_all(plan(t)), xt::zeros<double>(shape));
}

} // namespace
