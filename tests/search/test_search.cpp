// The strategy search on described networks (search/cost.hpp, search/recursive_programming.hpp,
// search/sharding_propagation.hpp): the cost model's prices against hand-computed ones, the
// consistency of redistribution prices on random layout triples, the dynamic programme against
// an exhaustive enumeration of every strategy, propagation against the enumeration's optimum
// with some strategies given, and the links fitted on the ranks. The search runs in one
// process: every rank computes the same thing.

#include <xshard/io/operator_strategy_file.hpp>
#include <xshard/search/calibrate.hpp>
#include <xshard/search/cost.hpp>
#include <xshard/search/networks.hpp>
#include <xshard/search/operator_strategy.hpp>
#include <xshard/search/recursive_programming.hpp>
#include <xshard/search/sharding_propagation.hpp>
#include <xshard/tensor/gather.hpp>

#include "mpi_test.hpp"

#include <gtest/gtest.h>
#include <xtensor/xbuilder.hpp>
#include <xtensor/xtensor.hpp>

#include <array>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

// Named: the program's files compile as one unit (XSHARD_UNITY_TESTS), and share no names.
namespace search_tests {

using namespace xshard;

mesh_shape dp_tp(int dp, int tp) {
    return mesh_shape({axis_name("dp"), axis_name("tp")}, {dp, tp});
}

/// A random layout of a rank-2 tensor on axes dp, tp: each axis splits a dimension, is
/// partial, or is replicated.
layout random_layout(std::mt19937& g) {
    std::string d[2];
    std::vector<std::string> partial;
    for (const char* a : {"dp", "tp"}) {
        const auto w = g() % 4;
        if (w < 2)
            d[w] += (d[w].empty() ? "" : ",") + std::string(a);
        else if (w == 2)
            partial.push_back(a);
    }
    std::string t = "[";
    for (int i = 0; i < 2; ++i) {
        t += i ? ", " : "";
        t += d[i].empty() ? "-" : d[i].find(',') != std::string::npos ? "(" + d[i] + ")" : d[i];
    }
    t += "]";
    if (!partial.empty()) {
        t += " partial(sum: ";
        for (std::size_t i = 0; i < partial.size(); ++i)
            t += (i ? ", " : "") + partial[i];
        t += ")";
    }
    return layout::parse(t);
}

bool same(double a, double b) {
    return std::abs(a - b) <= 1e-9 * std::max(std::abs(a), std::abs(b));
}

TEST(search_cost, the_planner_routes_through_a_cheaper_intermediate_layout) {
    // The planner's greedy candidates priced [tp, -] -> [dp, -] partial(tp) above the route
    // through [tp, dp]; the planner now takes the cheapest route (redistribute/route.hpp),
    // and the search prices what it runs.
    redistribution_pricer p(dp_tp(2, 3), cost_model{}, 4);
    const std::array<std::size_t, 2> shape{1336, 1336};
    const auto a = layout::parse("[tp, -]"), b = layout::parse("[tp, dp]"),
               c = layout::parse("[dp, -] partial(sum: tp)");
    const double via = p.direct(a, b, shape).seconds + p.direct(b, c, shape).seconds;
    EXPECT_LE(p(a, c, 1336, 1336).seconds, via * (1 + 1e-12));
    const auto r = p.route(a, c, 1336, 1336);
    ASSERT_GE(r.size(), 2u);
    EXPECT_EQ(r.front(), a);
    EXPECT_EQ(r.back(), c);
    double along = 0;
    for (std::size_t i = 0; i + 1 < r.size(); ++i)
        along += p.direct(r[i], r[i + 1], shape).seconds;
    EXPECT_LE(p(a, c, 1336, 1336).seconds, along * (1 + 1e-9));
}

TEST(search_cost, direct_never_costs_more_than_via_on_random_triples) {
    std::mt19937 g(17);
    int checked = 0;
    for (auto [dp, tp] : {std::pair{2, 3}, {4, 2}, {3, 5}, {8, 8}, {64, 256}}) {
        redistribution_pricer p(dp_tp(dp, tp), cost_model{}, 4);
        for (int i = 0; i < 60; ++i) {
            const auto a = random_layout(g), b = random_layout(g), c = random_layout(g);
            const std::size_t rows = 1 + g() % 3000, cols = 1 + g() % 2000;
            const double ab = p(a, b, rows, cols).seconds, bc = p(b, c, rows, cols).seconds;
            const double ac = p(a, c, rows, cols).seconds;
            EXPECT_LE(ac, (ab + bc) * (1 + 1e-12) + 1e-15)
                << a.to_string() << " -> " << c.to_string() << " via " << b.to_string()
                << " on dp=" << dp << " tp=" << tp << ", " << rows << "x" << cols;
            // Never above the planner's own plan.
            EXPECT_LE(ac,
                      p.direct(a, c, std::array<std::size_t, 2>{rows, cols}).seconds * (1 + 1e-12));
            ++checked;
        }
    }
    EXPECT_EQ(checked, 300);
}

TEST(search_cost, per_axis_links_price_steps_over_their_axes) {
    cost_model m;
    m.axis_links.push_back({axis_name("tp"), {1e-5, 1.0 / 1e9}});
    const auto mesh = dp_tp(4, 4);
    redistribution_pricer p(mesh, m, 4);
    const std::array<std::size_t, 2> shape{4096, 4096};
    // all-gather over tp: 3 messages, 3/4 of the 4096 x 4096 floats received, a quarter kept
    // (the step itself: with tp's link that slow, the planner's route avoids it, below).
    const double bytes = 4096.0 * 4096 * 4;
    const auto gather = [&](const char* from) {
        const auto c = plan_redistribution(layout::parse(from), layout::parse("[-, -]"));
        return price_route(c.paths[0], mesh, shape, 4, p.sample_ranks(), m).seconds;
    };
    const double tp_gather = gather("[tp, -]");
    EXPECT_LE(p.direct(layout::parse("[tp, -]"), layout::parse("[-, -]"), shape).seconds,
              tp_gather);
    EXPECT_TRUE(same(tp_gather, 3 * 1e-5 + 0.75 * bytes / 1e9 + m.copy * bytes / 4)) << tp_gather;
    // A link faster than the kind's leaves the kind's: the algorithm's own speed bounds it.
    cost_model fast = m;
    fast.axis_links[0].link = {1e-9, 1.0 / 1e12};
    EXPECT_EQ(fast.link(step_kind::all_gather, mesh, axis_set::of(1)), m.all_gather);
    fast.axis_links[0].link = {1e-9, 1.0 / 1e8};
    EXPECT_EQ(fast.link(step_kind::all_gather, mesh, axis_set::of(1)),
              (link_cost{m.all_gather.alpha, 1.0 / 1e8}));
    // over dp (no link of its own): the kind's link.
    const double dp_gather = gather("[dp, -]");
    EXPECT_TRUE(same(dp_gather, 3 * m.all_gather.alpha + 0.75 * bytes * m.all_gather.beta +
                                    m.copy * bytes / 4))
        << dp_gather;
    static_assert(cost_model{}.link(step_kind::all_gather, mesh_shape{}, axis_set{}).alpha ==
                  cost_model{}.all_gather.alpha);
}

TEST(search_cost, hsdp_is_priced_on_the_layout_it_shards_to) {
    // The cost model's sharded layout is train/hsdp.hpp's: the dimension whose block comes out
    // smallest, not the one whose own piece does ([8, 6] split [-, tp] over dp 2, tp 2: the
    // rows, a block of 4 x 3, not the columns' 8 x 2; it priced the columns before).
    const auto m = dp_tp(2, 2);
    const auto dp = axis_set{}.with(0), both = dp.with(1); // the axes a weight is replicated on
    struct one_case {
        layout value;
        std::vector<std::size_t> shape;
        axis_set replicated;
    };
    for (const auto& [value, shape, replicated] :
         std::vector<one_case>{{layout::parse("[-, tp]"), {8, 6}, dp},
                               {layout::parse("[tp, -]"), {8, 6}, dp},
                               {layout::parse("[-, -]"), {3, 10}, both},
                               {layout::parse("[-, -]"), {4096, 1024}, both},
                               {layout::parse("[-, tp]"), {1024, 4096}, dp},
                               {layout::parse("[-]"), {5}, both}}) {
        const auto priced = detail::sharded_layout(value, m, shape);
        ASSERT_TRUE(priced.has_value());
        EXPECT_EQ(*priced, sharded_layout(value, m, shape, replicated)) << value.to_string();
    }
    EXPECT_EQ(*detail::sharded_layout(layout::parse("[-, tp]"), m, {8, 6}),
              layout::parse("[dp, tp]"));
    EXPECT_FALSE(detail::sharded_layout(layout::parse("[dp, tp]"), m, {8, 6}).has_value());
}

TEST(search_cost, linear_layer_costs_by_hand) {
    machine_model m;
    m.element = 4;
    const auto mesh = dp_tp(2, 2);
    redistribution_pricer p(mesh, m.links, m.element);
    const op_spec op{"l", op_kind::linear, 784, 512, true, 1};
    // Column parallel on 64 samples: [32 rows, 784] x [784, 256] per rank.
    const op_choice col{activation_split::rows, weight_split::output, activation_split::features};
    const auto c = cost_of(op, col, 64, 1, 0, m, p);
    ASSERT_TRUE(c.valid);
    EXPECT_TRUE(same(c.compute, 3 * 2.0 * 32 * 784 * 256 / m.gemm_flops));
    EXPECT_EQ(c.communication, 0); // the output is already [dp, tp]
    const double w = (784.0 * 256 + 256) * 4;
    EXPECT_EQ(c.weight_memory, std::size_t(w * 4)); // weight, gradient, two Adam states
    EXPECT_EQ(c.activation_memory, std::size_t(32 * 784 * 4));
    // The weight's gradient terms are all-reduced over dp (2 ranks): the planner's price.
    const double sync = p.direct(layout::parse("[-, tp] partial(sum: dp)"),
                                 layout::parse("[-, tp]"), std::array<std::size_t, 2>{784, 512})
                            .seconds +
                        p.direct(layout::parse("[tp] partial(sum: dp)"), layout::parse("[tp]"),
                                 std::array<std::size_t, 1>{512})
                            .seconds;
    // Plus the update (weight, gradient, two slots) and zero_grad, memory-bound: 8 x the bytes.
    EXPECT_TRUE(same(c.synchronization, sync + 8 * w / m.memory_bandwidth));
    // hsdp level 2: gradient and state sharded over dp (the bias is below the threshold).
    const auto c2 = cost_of(op, col, 64, 1, 2, m, p);
    const double wb = 784.0 * 256 * 4, bb = 256.0 * 4;
    EXPECT_EQ(c2.weight_memory, std::size_t(wb + wb / 2 + 2 * wb / 2 + 4 * bb));
    // Row parallel after it: the pending sum all-reduced over tp forward (and backward).
    const op_choice row{activation_split::features, weight_split::input, activation_split::rows};
    const auto r = cost_of(op_spec{"l2", op_kind::linear, 512, 10, true, 1}, row, 64, 1, 0, m, p);
    ASSERT_TRUE(r.valid);
    EXPECT_GT(r.communication, 0);
    EXPECT_TRUE(same(r.compute, 3 * 2.0 * 32 * 256 * 10 / m.gemm_flops));
    // GEMMs slow down on narrow shapes: the row-parallel layer's smallest dimension is its 10
    // outputs, the column-parallel one's its 32 rows.
    auto narrow = m;
    narrow.gemm_half_dimension = 20;
    EXPECT_TRUE(same(cost_of(op_spec{"l2", op_kind::linear, 512, 10, true, 1}, row, 64, 1, 0,
                             narrow, p)
                         .compute,
                     3 * 2.0 * 32 * 256 * 10 * (1 + 20.0 / 10) / m.gemm_flops));
    EXPECT_TRUE(same(cost_of(op, col, 64, 1, 0, narrow, p).compute,
                     3 * 2.0 * 32 * 784 * 256 * (1 + 20.0 / 32) / m.gemm_flops));
    // Unsuited: a row-parallel weight on whole features.
    EXPECT_FALSE(cost_of(op, {activation_split::rows, weight_split::input, activation_split::rows},
                         64, 1, 0, m, p)
                     .valid);
}

/// The dynamic programme's plan equals the enumeration's optimum, degree by degree.
void expect_programme_is_optimal(const network_spec& net, int ranks, int level, double cap) {
    search_options o;
    o.ranks = ranks;
    o.level = level;
    o.memory_per_rank = cap;
    int compared = 0;
    for (const auto& d : candidate_degrees(net, ranks, {0, 1, 2})) {
        redistribution_pricer p(dp_tp(d.dp, d.tp), o.machine.links, o.machine.element);
        auto dyn = search_degrees(net, d, o, p);
        auto ex_o = o;
        ex_o.exhaustive = true;
        auto ex = search_degrees(net, d, ex_o, p);
        if (!ex) { // nothing fits: the programme's plan must not fit either
            if (dyn) {
                EXPECT_FALSE(dyn->fits) << detail::degrees_text(d);
            }
            continue;
        }
        ASSERT_TRUE(dyn) << detail::degrees_text(d);
        EXPECT_TRUE(dyn->fits) << detail::degrees_text(d);
        EXPECT_TRUE(same(dyn->objective.first, ex->objective.first) &&
                    same(dyn->objective.second, ex->objective.second))
            << net.description << " " << detail::degrees_text(d) << " level " << level
            << ": programme " << dyn->objective.first << "," << dyn->objective.second
            << " enumeration " << ex->objective.first << "," << ex->objective.second;
        ++compared;
    }
    EXPECT_GT(compared, 0);
}

TEST(recursive_programming, programme_equals_enumeration) {
    const auto net = mlp_network({48, 96, 64, 16}, 24);
    for (int ranks : {1, 2, 4, 6})
        for (int level : {0, 1, 2})
            expect_programme_is_optimal(net, ranks, level, std::numeric_limits<double>::infinity());
}

TEST(recursive_programming, programme_equals_enumeration_under_a_memory_cap) {
    const auto net = mlp_network({256, 1024, 1024, 64}, 32);
    // Caps between the least memory and the fastest plan's: the fastest breaks them, so the
    // programme's Pareto fronts decide.
    search_options o;
    o.ranks = 4;
    const auto fast = search_strategy(net, o);
    o.level = 1;
    const auto small = search_strategy(net, o);
    ASSERT_TRUE(fast.best && small.best);
    ASSERT_LT(small.best->memory_bytes, fast.best->memory_bytes);
    for (double f : {0.3, 0.7}) {
        const double cap =
            small.best->memory_bytes + f * (fast.best->memory_bytes - small.best->memory_bytes);
        expect_programme_is_optimal(net, 4, 2, cap);
        expect_programme_is_optimal(net, 4, 0, cap);
        o.level = 2;
        o.memory_per_rank = cap;
        const auto capped = search_strategy(net, o);
        ASSERT_TRUE(capped.best);
        EXPECT_LE(capped.best->memory_bytes, cap);
        EXPECT_GE(capped.best->step_seconds, fast.best->step_seconds);
    }
}

TEST(recursive_programming, search_result_and_runner_up) {
    const auto net = mlp_network({784, 512, 512, 10}, 64);
    search_options o;
    o.ranks = 8;
    const auto r = search_strategy(net, o);
    ASSERT_TRUE(r.best && r.runner_up);
    EXPECT_LE(r.best->step_seconds, r.runner_up->step_seconds);
    EXPECT_FALSE(r.runner_up_lost.empty());
    EXPECT_EQ(r.best->degrees.dp * r.best->degrees.tp * r.best->degrees.pp, 8);
    const auto text = describe(r, net);
    EXPECT_NE(text.find("linear1"), std::string::npos) << text;
    EXPECT_NE(text.find("runner-up"), std::string::npos) << text;
    // Least memory (level 1) never needs more than the fastest.
    o.level = 1;
    const auto small = search_strategy(net, o);
    EXPECT_LE(small.best->memory_bytes, r.best->memory_bytes);
    // A cap below everything: nothing fits, the least found is reported.
    o.level = 2;
    o.memory_per_rank = 1;
    const auto none = search_strategy(net, o);
    EXPECT_FALSE(none.best);
    EXPECT_TRUE(none.over_cap);
    // A batch no data-parallel degree splits still has dp = 1.
    EXPECT_THROW(search_strategy(mlp_network({4, 4}, 0), o), std::invalid_argument);
}

TEST(recursive_programming, transformer_searches_at_scale) {
    const auto net = transformer_network(2, 256, 8, 128, 1000, 16);
    search_options o;
    o.ranks = 64;
    const auto r = search_strategy(net, o);
    ASSERT_TRUE(r.best);
    EXPECT_EQ(r.best->choices.size(), net.ops.size());
    const auto again = evaluate_strategy(net, r.best->degrees, r.best->choices, o);
    EXPECT_TRUE(again.valid);
    EXPECT_TRUE(same(again.step_seconds, r.best->step_seconds));
}

TEST(sharding_propagation, completes_partial_strategies_as_the_enumeration) {
    const auto net = mlp_network({48, 96, 64, 16}, 24);
    for (auto d : {parallel_degrees{2, 2, 1, 1, 0}, parallel_degrees{1, 4, 1, 1, 1},
                   parallel_degrees{2, 1, 2, 4, 0}}) {
        search_options o;
        o.ranks = d.dp * d.tp * d.pp;
        redistribution_pricer p(dp_tp(d.dp, d.tp), o.machine.links, o.machine.element);
        auto ex_o = o;
        ex_o.exhaustive = true;
        const auto optimum = search_degrees(net, d, ex_o, p);
        ASSERT_TRUE(optimum);
        // Given the optimum's first and last strategies, propagation finds the optimum.
        std::vector<std::optional<op_choice>> given(net.ops.size());
        given.front() = optimum->choices.front();
        given.back() = optimum->choices.back();
        const auto prop = propagate_strategies(net, d, given, o);
        EXPECT_TRUE(same(prop.objective.first, optimum->objective.first))
            << detail::degrees_text(d);
        // Given another first strategy, it equals the enumeration with that one pinned.
        for (const auto& first : {op_choice{activation_split::rows, weight_split::replicated,
                                            activation_split::all_rows},
                                  op_choice{activation_split::rows, weight_split::output,
                                            activation_split::features}}) {
            std::vector<std::optional<op_choice>> one(net.ops.size());
            one[0] = first;
            auto pinned = ex_o;
            pinned.fixed = one;
            const auto best_pinned = search_degrees(net, d, pinned, p);
            const auto got = propagate_strategies(net, d, one, o);
            ASSERT_TRUE(best_pinned);
            EXPECT_EQ(got.choices[0], first);
            EXPECT_TRUE(same(got.objective.first, best_pinned->objective.first))
                << detail::degrees_text(d);
        }
    }
    // An unsuitable given strategy: a row-parallel weight on whole features.
    std::vector<std::optional<op_choice>> bad(net.ops.size());
    bad[0] = op_choice{activation_split::rows, weight_split::input, activation_split::rows};
    EXPECT_THROW(propagate_strategies(net, {2, 2, 1, 1, 0}, bad), std::invalid_argument);
}

// --- operator strategy files: what xshard-plan search --model --save writes -------------------

TEST(operator_strategy_file, a_saved_search_loads_as_it_was_and_a_bad_file_raises_naming_it) {
    const auto net = transformer_network(2, 64, 4, 16, 100, 8);
    search_options o;
    o.ranks = 16;
    const auto r = search_strategy(net, o);
    ASSERT_TRUE(r.best);
    const auto saved = make_operator_strategy(net, *r.best);
    const std::string dir = std::string(XSHARD_SEARCH_SCRATCH) + "/operators_rank" +
                            std::to_string(xshard::testing::world().rank());
    std::filesystem::create_directories(dir);
    save_operator_strategy(dir + "/s.json", saved);
    const auto loaded = load_operator_strategy(dir + "/s.json");
    EXPECT_EQ(loaded.network, net.description);
    EXPECT_EQ(loaded.ranks, 16);
    EXPECT_EQ(loaded.degrees, r.best->degrees);
    EXPECT_EQ(loaded.choices(), r.best->choices);
    EXPECT_EQ(loaded.step_seconds, r.best->step_seconds);
    ASSERT_EQ(loaded.operators.size(), net.ops.size());
    for (std::size_t i = 0; i < net.ops.size(); ++i)
        EXPECT_EQ(loaded.operators[i].name, net.ops[i].name);
    const auto raises = [&](const std::string& text, const std::string& what) {
        std::ofstream(dir + "/bad.json") << text;
        try {
            (void)load_operator_strategy(dir + "/bad.json");
            ADD_FAILURE() << "no error for " << text;
        } catch (const io_error& e) {
            EXPECT_NE(std::string(e.what()).find("bad.json"), std::string::npos) << e.what();
            EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
        }
    };
    raises(R"({"format": "xshard-operator-strategy", "version": 7})", "version 7 is not supported");
    auto wrong = saved;
    wrong.ranks = 15;
    raises(wrong.to_json(), "is not the 15 ranks");
    auto text = saved.to_json();
    text.replace(text.find("\"weight\": \""), 11, "\"weight\": \"x");
    raises(text, "unknown split");
    EXPECT_THROW((void)load_operator_strategy(dir + "/missing.json"), io_error);
}

// --- the machine: links fitted on the ranks ------------------------------------------------

TEST(machine, links_are_fitted_on_the_ranks_and_agree) {
    const auto w = xshard::testing::world();
    const cost_model base{};
    const auto fit = calibrate_links(w, base, {.elements = 1 << 14, .repeats = 2});
    // measure_machine asked not to fit them keeps the links it is given.
    const auto kept = measure_machine<double>(
        w, {},
        {.rows = 8, .in = 16, .out = 16, .square = 16, .elements = 1 << 10, .fit_links = false});
    EXPECT_EQ(kept.links, base);
    if (w.size() == 1) { // nothing moves on one rank
        EXPECT_EQ(fit.links, base);
        EXPECT_TRUE(fit.points.empty());
        return;
    }
    // A tiny and a large plan per kind, timed and priced.
    ASSERT_EQ(fit.points.size(), 8u);
    for (const auto& x : fit.points) {
        EXPECT_TRUE(std::isfinite(x.seconds) && x.seconds > 0) << x.kind;
        EXPECT_TRUE(std::isfinite(x.predicted) && x.predicted > 0) << x.kind;
        EXPECT_GT(x.bytes, 0u) << x.kind;
    }
    EXPECT_LT(fit.points[0].bytes, fit.points[1].bytes);
    // Finite, non-negative, and the same on every rank.
    const auto& l = fit.links;
    std::vector<double> v{l.copy};
    for (const auto* c :
         {&l.all_gather, &l.all_to_all, &l.exchange, &l.reduce_scatter, &l.all_reduce}) {
        v.push_back(c->alpha);
        v.push_back(c->beta);
    }
    for (double x : v)
        EXPECT_TRUE(std::isfinite(x) && x >= 0) << x;
    EXPECT_GT(l.copy, 0);
    std::vector<double> low = v, high = v;
    xshard::mpi::allreduce(w, std::span(low), reduction::min);
    xshard::mpi::allreduce(w, std::span(high), reduction::max);
    EXPECT_EQ(low, high) << "a fitted link differs between ranks";
    EXPECT_EQ(l.exchange, l.all_to_all);
}

TEST(machine, every_axis_of_more_than_one_rank_gets_a_link_of_its_own) {
    const auto w = xshard::testing::world();
    // Axis "a" of 2 ranks where the world is even, "b" the rest; a link for another axis kept.
    const mesh<"a", "b"> m({w.size() % 2 == 0 ? 2 : 1, xshard::auto_size});
    cost_model base{};
    base.axis_links.push_back({"z", {1.0, 2.0}});
    const auto fit = calibrate_axis_links(m, base, {.elements = 1 << 14, .repeats = 2});
    const auto& links = fit.links.axis_links;
    auto link_of = [&](std::string_view axis) -> const link_cost* {
        for (const auto& a : links)
            if (a.axis == axis_name(axis))
                return &a.link;
        return nullptr;
    };
    ASSERT_NE(link_of("z"), nullptr);
    EXPECT_EQ(*link_of("z"), (link_cost{1.0, 2.0}));
    std::size_t fitted = 0;
    std::vector<double> v;
    for (std::size_t i = 0; i < 2; ++i) {
        const std::string axis(m.shape().names[i].view());
        const auto* l = link_of(axis);
        if (m.axis_size(i) == 1) {
            EXPECT_EQ(l, nullptr) << axis << ": nothing moves over an axis of one rank";
            continue;
        }
        ++fitted;
        ASSERT_NE(l, nullptr) << axis;
        EXPECT_TRUE(std::isfinite(l->alpha) && l->alpha >= 0) << axis;
        EXPECT_TRUE(std::isfinite(l->beta) && l->beta > 0) << axis;
        v.push_back(l->alpha);
        v.push_back(l->beta);
        // A step over this axis is priced by the slower of it and the step's kind's link.
        for (const auto k : {step_kind::all_gather, step_kind::all_reduce}) {
            const auto& kind = fit.links.of(k);
            EXPECT_EQ(fit.links.link(k, m.shape(), axis_set::of(i)),
                      (link_cost{std::max(kind.alpha, l->alpha), std::max(kind.beta, l->beta)}));
        }
    }
    EXPECT_EQ(links.size(), 1 + fitted);
    EXPECT_EQ(fit.points.size(), 8 * fitted);
    for (const auto& x : fit.points)
        EXPECT_TRUE(x.kind.starts_with("a.") || x.kind.starts_with("b.")) << x.kind;
    // The kinds' links: the base's where nothing was fitted, else fitted, the same on every
    // rank.
    const auto& l = fit.links;
    if (fitted == 0) {
        EXPECT_EQ(l, base);
    }
    EXPECT_EQ(l.exchange, l.all_to_all);
    EXPECT_EQ(l.shared_memory, base.shared_memory);
    v.push_back(l.copy);
    for (const auto* c : {&l.all_gather, &l.all_to_all, &l.reduce_scatter, &l.all_reduce}) {
        EXPECT_TRUE(std::isfinite(c->alpha) && c->alpha >= 0);
        EXPECT_TRUE(std::isfinite(c->beta) && c->beta > 0);
        v.push_back(c->alpha);
        v.push_back(c->beta);
    }
    std::vector<double> low = v, high = v;
    xshard::mpi::allreduce(w, std::span(low), reduction::min);
    xshard::mpi::allreduce(w, std::span(high), reduction::max);
    EXPECT_EQ(low, high) << "a fitted link differs between ranks";
}

// --- the crossovers between the pairwise reductions and MPI's ------------------------------

TEST(machine, a_crossover_is_the_piece_from_which_the_pairwise_path_loses_least) {
    // Pairwise seconds per piece of 1, 4, 16, ... KiB, against MPI's 1 s at each.
    auto points = [](std::initializer_list<double> pairwise) {
        std::vector<crossover_point> v;
        std::size_t piece = 1024;
        for (double s : pairwise) {
            v.push_back({"all_reduce", piece, s, 1.0});
            piece *= 4;
        }
        return v;
    };
    using detail::crossover_from;
    EXPECT_EQ(crossover_from(points({1.5, 1.3, 0.8, 0.7}), 1.05), 16384u);
    EXPECT_EQ(crossover_from(points({0.5, 1.05, 0.9}), 1.05), 1024u); // within the margin
    EXPECT_EQ(crossover_from(points({1.5, 1.3, 1.2}), 1.05), SIZE_MAX);
    // Winning, losing, winning: the threshold that gives up least (4 KiB: 1.2 at 16 KiB is
    // a smaller loss than MPI's at 4, 64 and 256 KiB).
    EXPECT_EQ(crossover_from(points({2.0, 0.5, 1.2, 0.9, 0.4}), 1.05), 4096u);
    // Where the pairwise path loses at the largest pieces only, what it gains below counts.
    EXPECT_EQ(crossover_from(points({0.5, 0.9, 1.5}), 1.05), 1024u);
    EXPECT_EQ(crossover_from(points({0.95, 0.97, 2.0}), 1.0), SIZE_MAX);
    EXPECT_EQ(crossover_from(points({}), 1.05), SIZE_MAX);
}

/// Puts the crossovers of this process back as they were, however the test ends (on this
/// rank alone: no collective in a destructor).
struct crossovers_kept {
    reduce_tuning was{};
    ~crossovers_kept() {
        detail::default_crossovers().all_reduce = was.min_piece_bytes;
        detail::default_crossovers().reduce_scatter = was.reduce_scatter_min_piece_bytes;
    }
};

TEST(machine, crossovers_are_fitted_on_the_ranks_and_installed_for_later_plans) {
    const auto w = xshard::testing::world();
    const crossovers_kept kept;
    const int p = w.size();
    reduce_tuning base{};
    base.chunk_bytes = 4096;
    const auto fit = calibrate_reduce_tuning(w, base, {.largest = 64 << 10, .repeats = 2});
    if (p == 1) { // nothing reduces on one rank
        EXPECT_EQ(fit.tuning, base);
        EXPECT_TRUE(fit.points.empty());
    } else {
        // Pieces of 1, 4, 16 and 64 KiB, each reduction through both paths.
        ASSERT_EQ(fit.points.size(), 8u);
        for (std::size_t i = 0; i < 8; ++i) {
            const auto& x = fit.points[i];
            EXPECT_EQ(x.kind, i < 4 ? "all_reduce" : "reduce_scatter");
            EXPECT_EQ(x.piece_bytes, std::size_t(1024) << (2 * (i % 4)));
            EXPECT_TRUE(std::isfinite(x.pairwise) && x.pairwise > 0) << x.kind;
            EXPECT_TRUE(std::isfinite(x.mpi) && x.mpi > 0) << x.kind;
        }
        const std::span all(fit.points);
        EXPECT_EQ(fit.tuning.min_piece_bytes, detail::crossover_from(all.first(4), 1.05));
        EXPECT_EQ(fit.tuning.reduce_scatter_min_piece_bytes,
                  detail::crossover_from(all.last(4), 1.05));
        // The other fields are the base's.
        reduce_tuning rest = fit.tuning;
        rest.min_piece_bytes = base.min_piece_bytes;
        rest.reduce_scatter_min_piece_bytes = base.reduce_scatter_min_piece_bytes;
        EXPECT_EQ(rest, base);
        const auto r = value_ranges<2>(
            w, {fit.tuning.min_piece_bytes, fit.tuning.reduce_scatter_min_piece_bytes});
        EXPECT_TRUE(r[0].agrees() && r[1].agrees()) << "a fitted crossover differs between ranks";
    }

    // Installed, the crossovers are those of every tuning made afterwards: a pending sum of 4
    // doubles per rank (of ones: its terms are 1 on one rank, 0 on the others) then reduces
    // through the pairwise path (which needs scratch), exact.
    const mesh<"x"> m(w, {p});
    const auto src = full<double, "[-] partial(sum: x)">(m, {4 * std::size_t(p)}, 1.0);
    const auto reduce = [&] { return make_redistribution<"[-]">(src); };
    use_reduce_crossovers({.min_piece_bytes = 0, .reduce_scatter_min_piece_bytes = 0});
    EXPECT_EQ(reduce_tuning{}.min_piece_bytes, 0u);
    EXPECT_EQ(reduce_tuning{.chunk_bytes = 64}.reduce_scatter_min_piece_bytes, 0u);
    auto pairwise = reduce();
    use_reduce_crossovers(kept.was);
    EXPECT_EQ(reduce_tuning{}, kept.was);
    auto through_mpi = reduce();
    const auto scratch = [](const auto& plan) {
        std::size_t b = 0;
        for (const auto& s : plan.plan().summary().steps)
            b += s.scratch_bytes;
        return b;
    };
    if (p > 1) {
        EXPECT_GT(scratch(pairwise), 0u) << pairwise.describe();
        EXPECT_EQ(scratch(through_mpi), 0u) << through_mpi.describe();
    }
    // A plan keeps the crossovers it was made with.
    const xt::xtensor<double, 1> sum = xt::ones<double>({4 * std::size_t(p)});
    for (auto* plan : {&pairwise, &through_mpi})
        EXPECT_EQ(gather_all((*plan)(src)), sum) << plan->describe();
    if (p > 1) {
        EXPECT_GT(scratch(pairwise), 0u);
    }

    // Ranks that hold different crossovers raise on every rank, and none changes.
    const std::size_t mine = w.rank() == 0 ? 1 : 2;
    if (p > 1) {
        EXPECT_THROW(use_reduce_crossovers(
                         {.min_piece_bytes = mine, .reduce_scatter_min_piece_bytes = mine}),
                     std::invalid_argument);
        EXPECT_EQ(reduce_tuning{}, kept.was);
    }
}

} // namespace search_tests
