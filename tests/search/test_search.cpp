// The strategy search (search/cost.hpp, search/recursive_programming.hpp,
// search/sharding_propagation.hpp): the cost model's prices against hand-computed ones, the
// consistency of redistribution prices on random layout triples, the dynamic programme against
// an exhaustive enumeration of every strategy, and propagation against the enumeration's
// optimum with some strategies given. The search runs in one process: every rank computes the
// same thing.

#include <xshard/driver/auto_parallel.hpp>
#include <xshard/driver/trainer.hpp>
#include <xshard/io/operator_strategy_file.hpp>
#include <xshard/models/searched_mlp.hpp>
#include <xshard/models/searched_transformer.hpp>
#include <xshard/nn/embedding.hpp>
#include <xshard/optim/optimizers.hpp>
#include <xshard/search/calibrate.hpp>
#include <xshard/search/cost.hpp>
#include <xshard/search/networks.hpp>
#include <xshard/search/operator_strategy.hpp>
#include <xshard/search/recursive_programming.hpp>
#include <xshard/search/sharding_propagation.hpp>
#include <xshard/tensor/distribute.hpp>
#include <xshard/tensor/gather.hpp>

#include "expect_error.hpp"
#include "mpi_test.hpp"

#include <xtensor/xrandom.hpp>

#include <filesystem>

#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <random>
#include <span>
#include <string>
#include <vector>

// Named: the program's files compile as one unit (XSHARD_UNITY_TESTS), and share no names.
namespace search_tests {

using namespace xshard;
namespace nn = xshard::nn;
namespace optim = xshard::optim;

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

// --- the engines at run time: searched strategies train as one rank ----------------------------

using mesh_t = xshard::mesh<"dp", "tp">;
using mlp_t = searched_mlp<double, mesh_t>;
constexpr std::size_t rows = 24, features = 12, classes = 6;

std::string scratch(const std::string& name) {
    const std::string dir = std::string(XSHARD_SEARCH_SCRATCH) + "/np" +
                            std::to_string(xshard::testing::world().size());
    std::filesystem::create_directories(dir);
    return dir + "/" + name;
}

auto batch_of(const mesh_t& m, int step) {
    std::mt19937 e(unsigned(300 + step));
    const xt::xtensor<double, 2> x = xt::random::randn<double>({rows, features}, 0.0, 1.0, e);
    const xt::xtensor<std::int64_t, 1> y =
        xt::random::randint<std::int64_t>({rows}, 0, std::int64_t(classes), e);
    return std::pair(distribute<dynamic_layout(2)>(m, x, nn::make_layout({"dp", ""})),
                     distribute<dynamic_layout(1)>(m, y, nn::make_layout({"dp"})));
}

/// Has `net` load and save operator strategy files where the paths are not empty.
template <class Net>
void strategy_files(Net& net, const std::string& load, const std::string& save) {
    if (!load.empty())
        net.load_operator_strategy_file(load);
    if (!save.empty())
        net.save_operator_strategy_file(save);
}

struct record {
    std::vector<double> losses;
    std::vector<xt::xarray<double>> weights;
};

/// `steps` steps of SGD with momentum through the driver, the model laid out by `mode`'s engine
/// (or by `choices` when given, in semi_auto).
record train(const mesh_t& m, const std::vector<std::size_t>& widths, const std::string& mode,
             const std::vector<op_choice>* choices = nullptr, int steps = 3,
             const std::string& load = {}, const std::string& save = {},
             const searched_mlp_options& options = {}) {
    mlp_t model(m, widths, rows, 5, options);
    if (choices)
        model.apply_strategy(*choices);
    auto_parallel<mlp_t, mesh_t> net(model, m, mode);
    strategy_files(net, load, save);
    optim::momentum opt({.lr = 0.1, .momentum = 0.9});
    nn::parallel_cross_entropy<double, mesh_t> loss;
    xshard::model trainer(net, loss, opt);
    std::vector<decltype(batch_of(m, 0))> data;
    for (int s = 0; s < steps; ++s)
        data.push_back(batch_of(m, s));
    record r;
    r.losses = trainer.train(1, data);
    for_each_weight(model,
                    [&](const std::string&, auto& w) { r.weights.push_back(gather_all(w.value)); });
    return r;
}

void expect_same(const record& a, const record& b, const std::string& context) {
    ASSERT_EQ(a.losses.size(), b.losses.size()) << context;
    for (std::size_t i = 0; i < a.losses.size(); ++i)
        EXPECT_NEAR(a.losses[i], b.losses[i], 1e-11) << context << " loss " << i;
    ASSERT_EQ(a.weights.size(), b.weights.size()) << context;
    for (std::size_t i = 0; i < a.weights.size(); ++i)
        EXPECT_TRUE(xt::allclose(a.weights[i], b.weights[i], 1e-10, 1e-11))
            << context << " weight " << i;
}

std::vector<mesh_t> world_meshes() {
    const auto w = xshard::testing::world();
    std::vector<mesh_t> r;
    for (int dp = 1; dp <= w.size(); ++dp)
        if (w.size() % dp == 0)
            r.push_back(mesh_t(w, {dp, w.size() / dp}));
    return r;
}

std::string mesh_text(const mesh_t& m) {
    return m.shape().to_string();
}

TEST(searched_mlp, every_valid_strategy_trains_as_one_rank) {
    // Every chain of strategies of linear -> relu -> linear the model accepts, trained, against
    // the data-parallel model on one rank.
    const std::vector<std::size_t> widths{features, 16, classes};
    const mesh_t one(communicator::self(), {1, 1});
    const auto serial = train(one, widths, "semi_auto", nullptr, 2);
    for (const auto& m : world_meshes()) {
        int chains = 0;
        const auto net = mlp_network(widths, rows);
        std::vector<op_choice> c(net.ops.size());
        std::function<void(std::size_t)> each = [&](std::size_t i) {
            if (i == c.size()) {
                if (c.back().out == activation_split::all_rows)
                    return;
                ++chains;
                std::string ctx = mesh_text(m);
                for (const auto& x : c)
                    ctx += std::string(" ") + std::string(to_string(x.in)) + "/" +
                           std::string(to_string(x.weight)) + "/" + std::string(to_string(x.out));
                expect_same(train(m, widths, "semi_auto", &c, 2), serial, ctx);
                return;
            }
            for (auto in : activation_splits)
                for (auto w : {weight_split::replicated, weight_split::output, weight_split::input})
                    for (auto out : activation_splits) {
                        if (in != (i == 0 ? activation_split::rows : c[i - 1].out))
                            continue;
                        const auto options = op_options(net.ops[i], in, m.axis_size<"dp">(),
                                                        m.axis_size<"tp">(), rows);
                        if (std::none_of(options.begin(), options.end(),
                                         [&](const auto& o) { return o.first == w; }))
                            continue;
                        c[i] = {in, w, out};
                        each(i + 1);
                    }
        };
        each(0);
        EXPECT_EQ(chains, 6 * 8) << mesh_text(m); // 6 first layers x (rows 4, features 2, all 2)
    }
    // A strategy that does not suit its operator raises, on every rank alike.
    const auto m = world_meshes().back();
    mlp_t model(m, widths, rows);
    const std::vector<op_choice> bad{
        {activation_split::rows, weight_split::input, activation_split::rows},
        {activation_split::rows, weight_split::replicated, activation_split::rows},
        {activation_split::rows, weight_split::replicated, activation_split::rows}};
    xshard::testing::expect_error([&] { model.apply_strategy(bad); }, "cannot run with");
}

TEST(searched_mlp, recursive_programming_trains_as_one_rank) {
    const std::vector<std::size_t> widths{features, 32, 32, classes};
    const mesh_t one(communicator::self(), {1, 1});
    const auto serial = train(one, widths, "semi_auto");
    for (const auto& m : world_meshes()) {
        expect_same(train(m, widths, "recursive_programming"), serial,
                    mesh_text(m) + " recursive_programming");
        expect_same(train(m, widths, "sharding_propagation"), serial,
                    mesh_text(m) + " sharding_propagation");
    }
}

TEST(searched_mlp, linears_without_bias) {
    // linear1 without bias (MindSpore's MatMulCell): no parameter linear1.bias, and the
    // searched layouts train as one rank.
    const std::vector<std::size_t> widths{features, 32, 32, classes};
    const searched_mlp_options o{.without_bias = {1}};
    const mesh_t one(communicator::self(), {1, 1});
    {
        mlp_t model(one, widths, rows, 5, o);
        std::vector<std::string> names;
        for_each_weight(model, [&](const std::string& n, auto&) { names.push_back(n); });
        EXPECT_EQ(names,
                  (std::vector<std::string>{"linear1.weight", "linear2.weight", "linear2.bias",
                                            "linear3.weight", "linear3.bias"}));
    }
    const auto serial = train(one, widths, "semi_auto", nullptr, 3, {}, {}, o);
    EXPECT_EQ(serial.weights.size(), 5u);
    for (const auto& m : world_meshes())
        expect_same(train(m, widths, "recursive_programming", nullptr, 3, {}, {}, o), serial,
                    mesh_text(m) + " recursive_programming without linear1's bias");
}

TEST(searched_mlp, operator_strategy_files_apply_at_run_time) {
    // The dry run's file (searched for this mesh) loaded by sharding_propagation: the model runs
    // the file's strategies and trains as one rank; the saved file equals the loaded one.
    const std::vector<std::size_t> widths{features, 32, 32, classes};
    const mesh_t one(communicator::self(), {1, 1});
    const auto serial = train(one, widths, "semi_auto");
    const auto m = world_meshes().back();
    const auto net = mlp_network(widths, rows);
    search_options o;
    o.ranks = m.size();
    o.degrees = parallel_degrees{m.axis_size<"dp">(), m.axis_size<"tp">(), 1, 1, 0};
    o.hsdp_levels = {0};
    o.output_splits = {activation_split::rows, activation_split::features};
    // Pin a tensor-parallel first layer so the file is not the trivial one.
    std::vector<std::optional<op_choice>> given(net.ops.size());
    given[0] = op_choice{activation_split::rows, weight_split::output, activation_split::features};
    const auto plan = propagate_strategies(net, *o.degrees, given, o);
    const auto path = scratch("operators.json"), saved = scratch("saved.json");
    agreed(m.comm(), [&] {
        if (m.rank() == 0)
            save_operator_strategy(path, make_operator_strategy(net, plan));
    });
    const auto file = load_operator_strategy(path);
    EXPECT_EQ(file.choices(), plan.choices);
    EXPECT_EQ(file.degrees, plan.degrees);
    EXPECT_EQ(file.network, net.description);
    expect_same(train(m, widths, "sharding_propagation", nullptr, 3, path, saved), serial,
                mesh_text(m) + " loaded");
    EXPECT_EQ(load_operator_strategy(saved).choices(), plan.choices);
    // A file for other degrees, a missing file and a malformed one raise on every rank.
    auto other = make_operator_strategy(net, plan);
    other.degrees.dp = m.size() + 1;
    other.ranks = other.degrees.dp * other.degrees.tp;
    const auto wrong = scratch("wrong.json"), broken = scratch("broken.json");
    agreed(m.comm(), [&] {
        if (m.rank() == 0) {
            save_operator_strategy(wrong, other);
            std::ofstream(broken) << "{\"format\": \"xshard-operator-strategy\", \"version\": 7}";
        }
    });
    xshard::testing::expect_error(
        [&] { train(m, widths, "sharding_propagation", nullptr, 1, wrong); }, "is for dp=");
    xshard::testing::expect_error(
        [&] { train(m, widths, "sharding_propagation", nullptr, 1, scratch("missing.json")); },
        "missing.json");
    xshard::testing::expect_error([&] { (void)load_operator_strategy(broken); },
                                  "version 7 is not supported");
}

TEST(searched_mlp, engines_price_with_the_machine_measured_or_set) {
    // measure_machine: positive, finite figures, the same on every rank (the slowest rank's).
    const auto m = world_meshes().back();
    const auto measured = measure_machine<double>(
        m.comm(), {}, {.rows = 32, .in = 128, .out = 256, .elements = 1 << 16, .repeats = 2});
    EXPECT_EQ(measured.element, sizeof(double));
    for (double v : {measured.gemm_flops, measured.memory_bandwidth}) {
        EXPECT_TRUE(std::isfinite(v) && v > 0) << v;
        std::array<double, 2> range{v, -v};
        xshard::mpi::allreduce(m.comm(), std::span(range), reduction::min);
        EXPECT_EQ(range[0], -range[1]) << "a figure differs between ranks";
    }
    // The engines price with the machine they are given: GEMMs and memory 1000x slower make
    // the tiny MLP's predicted computation about 1000x longer. (Slowing the GEMMs alone is not
    // enough on a loaded machine: a low measured memory bandwidth can make the relus' share of
    // the computation larger than the GEMMs'.)
    const std::vector<std::size_t> widths{features, 32, 32, classes};
    auto slow = measured;
    slow.gemm_flops = measured.gemm_flops / 1000;
    slow.memory_bandwidth = measured.memory_bandwidth / 1000;
    mlp_t model(m, widths, rows, 5);
    const auto fast_plan =
        run_strategy_engine(model, m.shape(), m.comm(), false, {}, {}, measured);
    const auto slow_plan = run_strategy_engine(model, m.shape(), m.comm(), false, {}, {}, slow);
    EXPECT_GT(slow_plan.compute_seconds, 500 * fast_plan.compute_seconds) << mesh_text(m);
    // auto_parallel passes the machine it was set to its engine: the saved file's prediction.
    const auto path = scratch("priced.json");
    {
        mlp_t searched(m, widths, rows, 5);
        auto_parallel<mlp_t, mesh_t> net(searched, m, "sharding_propagation");
        net.set_machine_model(slow);
        EXPECT_EQ(net.machine().gemm_flops, slow.gemm_flops);
        net.save_operator_strategy_file(path);
        net.compile();
    }
    // What the engine computes (strategy_engine.hpp), priced with the slow machine.
    const auto net = mlp_network(widths, rows);
    const auto o = engine_options(m.shape(), slow);
    const auto expected = propagate_strategies(
        net, *o.degrees, std::vector<std::optional<op_choice>>(net.ops.size()), o);
    EXPECT_NEAR(load_operator_strategy(path).step_seconds, expected.step_seconds,
                1e-9 * expected.step_seconds);
    EXPECT_GT(expected.step_seconds, 500 * fast_plan.compute_seconds);
    // A machine that cannot be priced with raises on every rank.
    mlp_t other(m, widths, rows, 5);
    auto_parallel<mlp_t, mesh_t> unpriced(other, m, "recursive_programming");
    auto bad = measured;
    bad.memory_bandwidth = 0;
    xshard::testing::expect_error([&] { unpriced.set_machine_model(bad); }, "must be positive");
    // max_device_memory reaches the engine: a cap no strategy fits raises on every rank,
    // naming the least; a cap every strategy fits gives the plan without one.
    mlp_t capped(m, widths, rows, 5);
    auto_parallel<mlp_t, mesh_t> tight(capped, m, "recursive_programming");
    tight.max_device_memory(16);
    xshard::testing::expect_error([&] { tight.compile(); }, "fits 16 bytes per rank; the least is");
    xshard::testing::expect_error([&] { tight.max_device_memory(-1); }, "must be positive");
    const auto roomy =
        run_strategy_engine(model, m.shape(), m.comm(), false, {}, {}, measured, {}, 1e12);
    EXPECT_EQ(roomy.step_seconds, fast_plan.step_seconds);
}

TEST(machine, links_are_fitted_on_the_ranks_and_agree) {
    const auto m = world_meshes().back();
    const cost_model base{};
    const auto fit = calibrate_links(m.comm(), base, {.elements = 1 << 14, .repeats = 2});
    // measure_machine asked not to fit them keeps the links it is given.
    const auto kept = measure_machine<double>(
        m.comm(), {}, {.rows = 8, .in = 16, .out = 16, .elements = 1 << 10, .fit_links = false});
    EXPECT_EQ(kept.links, base);
    if (m.size() == 1) { // nothing moves on one rank
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
    xshard::mpi::allreduce(m.comm(), std::span(low), reduction::min);
    xshard::mpi::allreduce(m.comm(), std::span(high), reduction::max);
    EXPECT_EQ(low, high) << "a fitted link differs between ranks";
    EXPECT_EQ(l.exchange, l.all_to_all);
}

// --- the searched transformer: any chain the search can choose trains as one rank ---------------

using transformer_t = searched_transformer<double, mesh_t>;
constexpr transformer_sizes tiny{.layers = 2, .hidden = 8, .heads = 2, .sequence = 4,
                                 .vocabulary = 11};
constexpr std::size_t sequences = 24; // whole sequences over 1, 2, 3, 4, 6 and 8 ranks

record train_transformer(const mesh_t& m, const std::string& mode,
                         const std::vector<op_choice>* choices = nullptr, int steps = 2,
                         const std::string& hsdp_level = {}) {
    transformer_t model(m, tiny, sequences, 9);
    if (choices)
        model.apply_strategy(*choices);
    auto_parallel<transformer_t, mesh_t> net(model, m, mode);
    if (!hsdp_level.empty())
        net.hsdp(-1, 0, hsdp_level); // every weight sharded
    optim::momentum opt({.lr = 0.1, .momentum = 0.9});
    nn::parallel_cross_entropy<double, mesh_t> loss;
    xshard::model trainer(net, loss, opt);
    using ids = nn::tensor<std::int64_t, mesh_t, 1>;
    std::vector<std::pair<ids, ids>> data;
    for (int s = 0; s < steps; ++s) {
        std::mt19937 e(unsigned(700 + s));
        const std::size_t tokens = sequences * tiny.sequence;
        const auto v = std::int64_t(tiny.vocabulary);
        const xt::xtensor<std::int64_t, 1> x = xt::random::randint<std::int64_t>({tokens}, 0, v, e);
        const xt::xtensor<std::int64_t, 1> y = xt::random::randint<std::int64_t>({tokens}, 0, v, e);
        data.emplace_back(distribute<dynamic_layout(1)>(m, x, nn::make_layout({"dp"})),
                          distribute<dynamic_layout(1)>(m, y, nn::make_layout({"dp"})));
    }
    record r;
    r.losses = trainer.train(1, data);
    for_each_weight(model,
                    [&](const std::string&, auto& w) { r.weights.push_back(gather_all(w.value)); });
    return r;
}

/// Named chains of the transformer's strategies: data parallel, Megatron, sequence parallel
/// (the search's choice at scale), and one whose residuals change layout.
std::vector<std::pair<std::string, std::vector<op_choice>>> transformer_chains() {
    using enum activation_split;
    using w = weight_split;
    const op_choice keep_rows{rows, w::replicated, rows}, keep_all{all_rows, w::replicated, all_rows};
    std::vector<std::pair<std::string, std::vector<op_choice>>> r;
    auto chain = [&](std::string name, op_choice embedding, std::array<op_choice, 8> block,
                     op_choice norm, op_choice head) {
        std::vector<op_choice> c{embedding};
        for (std::size_t l = 0; l < tiny.layers; ++l)
            c.insert(c.end(), block.begin(), block.end());
        c.push_back(norm);
        c.push_back(head);
        r.emplace_back(std::move(name), std::move(c));
    };
    chain("dp", keep_rows, {keep_rows, keep_rows, keep_rows, keep_rows, keep_rows, keep_rows,
                            keep_rows, keep_rows},
          keep_rows, keep_rows);
    chain("megatron", keep_rows,
          {keep_rows, op_choice{rows, w::output, features}, op_choice{features, w::replicated, features},
           op_choice{features, w::input, rows}, keep_rows, op_choice{rows, w::output, features},
           op_choice{features, w::replicated, features}, op_choice{features, w::input, rows}},
          keep_rows, op_choice{rows, w::output, features});
    chain("sequence_parallel", op_choice{rows, w::input, all_rows},
          {keep_all, keep_all, keep_all, keep_all, op_choice{all_rows, w::replicated, rows},
           op_choice{rows, w::output, features}, op_choice{features, w::replicated, features},
           op_choice{features, w::input, all_rows}},
          keep_all, op_choice{all_rows, w::replicated, rows});
    chain("residuals_relaid", op_choice{rows, w::output, all_rows},
          {op_choice{all_rows, w::replicated, rows}, keep_rows, keep_rows, keep_rows, keep_rows,
           keep_rows, op_choice{rows, w::replicated, all_rows}, keep_all},
          op_choice{all_rows, w::replicated, rows}, op_choice{rows, w::output, features});
    return r;
}

TEST(searched_transformer, every_kind_of_chain_trains_as_one_rank) {
    const mesh_t one(communicator::self(), {1, 1});
    const auto serial = train_transformer(one, "semi_auto");
    // The table, per block 2 norms x 2 and 4 linears x 2, the last norm, the head.
    ASSERT_EQ(serial.weights.size(), 1 + 2 * 12 + 2 + 1u);
    for (double l : serial.losses)
        EXPECT_TRUE(std::isfinite(l) && l > 0) << l;
    EXPECT_LT(serial.losses.back(), serial.losses.front() + 1.0);
    for (const auto& m : world_meshes()) {
        const auto net = transformer_network(tiny.layers, tiny.hidden, tiny.heads, tiny.sequence,
                                             tiny.vocabulary, sequences);
        int ran = 0;
        for (const auto& [name, c] : transformer_chains()) {
            bool valid = true;
            try {
                detail::check_strategy_chain(net, c, m.shape(), "test");
            } catch (const error&) {
                valid = false; // heads over a tp they do not divide
            }
            if (!valid)
                continue;
            ++ran;
            expect_same(train_transformer(m, "semi_auto", &c), serial, mesh_text(m) + " " + name);
        }
        // Optimizer sharding, level3 included (its backward through a model whose input, the
        // token ids, has no gradient).
        for (const std::string level : {"level2", "level3"})
            expect_same(train_transformer(m, "recursive_programming", nullptr, 2, level), serial,
                        mesh_text(m) + " recursive_programming under hsdp " + level);
        // dp, sequence parallel and the relaid residuals suit every mesh; Megatron where tp
        // divides the heads.
        EXPECT_GE(ran, 3) << mesh_text(m);
        expect_same(train_transformer(m, "recursive_programming"), serial,
                    mesh_text(m) + " recursive_programming");
        expect_same(train_transformer(m, "sharding_propagation"), serial,
                    mesh_text(m) + " sharding_propagation");
    }
    // A strategy that does not suit its operator (a normalisation over split features) raises
    // on every rank alike, naming it.
    const auto m = world_meshes().back();
    transformer_t model(m, tiny, sequences);
    auto bad = transformer_chains()[0].second;
    bad[1] = {activation_split::rows, weight_split::replicated, activation_split::features};
    bad[2] = {activation_split::features, weight_split::replicated, activation_split::rows};
    xshard::testing::expect_error([&] { model.apply_strategy(bad); },
                                  "operator block0.qkv cannot run with");
    // Sequences that do not split whole over the rows' blocks raise on every rank alike.
    if (m.size() > 1) {
        transformer_t odd(m, tiny, sequences);
        const xt::xtensor<std::int64_t, 1> x = xt::zeros<std::int64_t>({tiny.sequence + 1});
        xshard::testing::expect_error(
            [&] { (void)odd.forward(distribute<dynamic_layout(1)>(m, x, nn::make_layout({"dp"}))); },
            "whole sequences");
    }
}

// --- searched models through pipeline stages ---------------------------------------------------

using pp_mesh_t = xshard::mesh<"pp", "dp", "tp">;

/// A run of train_piped: its losses (the eval's last) and weights, the (virtual) stage of each
/// module of the pipeline, and the stage of each operator in the engine's plan.
struct piped_record : record {
    std::vector<std::pair<std::string, int>> stages;
    std::vector<int> planned;
};

/// Three steps of the searched MLP through the driver under pipeline(pp of `full`,
/// `interleave`) with `micro` micro-batches, laid out by `mode`'s engine, then an eval
/// (through the pipeline) whose loss joins the losses; the weights read after every stage
/// has shared its own.
piped_record train_piped(const pp_mesh_t& full, const std::vector<std::size_t>& widths,
                         const std::string& mode, int micro, bool interleave = false,
                         const std::string& hsdp_level = {}, const std::string& load = {},
                         const std::string& save = {}) {
    const auto stage = xshard::pipeline::stage_mesh_of<mesh_t>(full);
    mlp_t model(stage, widths, rows, 5);
    auto_parallel<mlp_t, pp_mesh_t> net(model, full, mode);
    net.pipeline(full.axis_size<"pp">(), false, interleave);
    if (!hsdp_level.empty())
        net.hsdp(-1, 0, hsdp_level);
    strategy_files(net, load, save);
    optim::momentum opt({.lr = 0.1, .momentum = 0.9});
    nn::parallel_cross_entropy<double, mesh_t> loss;
    xshard::model trainer(net, loss, opt, {.micro_batches = micro});
    EXPECT_EQ(trainer.pipelined(), full.axis_size<"pp">() > 1);
    std::vector<decltype(batch_of(stage, 0))> data;
    for (int s = 0; s < 3; ++s)
        data.push_back(batch_of(stage, s));
    piped_record r;
    r.losses = trainer.train(1, data);
    r.losses.push_back(trainer.eval(std::vector{batch_of(stage, 7)}).loss);
    trainer.share_stage_weights();
    for_each_weight(model,
                    [&](const std::string&, auto& w) { r.weights.push_back(gather_all(w.value)); });
    r.stages = trainer.pipeline_stages();
    if (net.searched_plan())
        r.planned = net.searched_plan()->stage_of;
    return r;
}

TEST(searched_mlp, pipeline_stages_cut_where_the_search_cuts) {
    // The engines search with the pipeline's stages and micro-batches; the driver cuts the
    // chain of operators where the plan does, and the pipelined model trains as one rank.
    const std::vector<std::size_t> widths{features, 32, 32, classes};
    const auto serial =
        train_piped(pp_mesh_t(communicator::self(), {1, 1, 1}), widths, "semi_auto", 1);
    EXPECT_TRUE(serial.stages.empty()); // no pipeline
    const auto w = xshard::testing::world();
    std::vector<pp_mesh_t> meshes;
    for (int pp : {2, 3})
        if (w.size() % pp == 0) {
            meshes.push_back(pp_mesh_t(w, {pp, w.size() / pp, 1}));
            if (w.size() > pp)
                meshes.push_back(pp_mesh_t(w, {pp, 1, w.size() / pp}));
        }
    const auto net = mlp_network(widths, rows);
    for (const auto& full : meshes) {
        const std::string ctx = full.shape().to_string();
        const int pp = full.axis_size<"pp">();
        for (const std::string mode : {"recursive_programming", "sharding_propagation"}) {
            const auto r = train_piped(full, widths, mode, 2);
            expect_same(r, serial, ctx + " " + mode);
            ASSERT_EQ(r.planned.size(), net.ops.size()) << ctx;
            ASSERT_EQ(r.stages.size(), net.ops.size()) << ctx;
            for (std::size_t i = 0; i < net.ops.size(); ++i) {
                EXPECT_EQ(r.stages[i].first, net.ops[i].name) << ctx;
                EXPECT_EQ(r.stages[i].second, r.planned[i]) << ctx << " " << net.ops[i].name;
            }
            EXPECT_EQ(r.planned.front(), 0) << ctx;
            EXPECT_EQ(r.planned.back(), pp - 1) << ctx;
        }
        // The operator strategy file of a pipelined search (every operator derived) records its
        // stages, and loads into the same strategies and cut.
        const auto file = scratch("piped_operators.json");
        const auto searched = train_piped(full, widths, "sharding_propagation", 2, false, {}, {},
                                          file);
        const auto saved = load_operator_strategy(file);
        EXPECT_EQ(saved.degrees.pp, pp) << ctx;
        EXPECT_EQ(saved.degrees.micro_batches, 2) << ctx;
        for (std::size_t i = 0; i < net.ops.size(); ++i)
            EXPECT_EQ(saved.operators[i].stage, searched.planned[i]) << ctx;
        const auto loaded = train_piped(full, widths, "sharding_propagation", 2, false, {}, file);
        expect_same(loaded, serial, ctx + " loaded");
        EXPECT_EQ(loaded.planned, searched.planned) << ctx;
        // Optimizer sharding per stage, its weights gathered around the micro-batches.
        expect_same(train_piped(full, widths, "recursive_programming", 4, false, "level3"), serial,
                    ctx + " hsdp level3");
        // Interleaved: 2 virtual stages per rank (which the search does not price: the
        // pipeline balances them), 2 pp of them for 5 operators.
        if (pp == 2) {
            const auto r = train_piped(full, widths, "recursive_programming", 2, true);
            expect_same(r, serial, ctx + " interleaved");
            ASSERT_EQ(r.stages.size(), net.ops.size()) << ctx;
            EXPECT_EQ(r.stages.back().second, 2 * pp - 1) << ctx;
        }
    }
    // The searched transformer's operators are no chain of modules: pipeline(2) raises on
    // every rank.
    if (w.size() % 2 == 0) {
        const pp_mesh_t full(w, {2, w.size() / 2, 1});
        const auto stage = xshard::pipeline::stage_mesh_of<mesh_t>(full);
        transformer_t model(stage, tiny, sequences);
        auto_parallel<transformer_t, pp_mesh_t> piped(model, full, "recursive_programming");
        piped.pipeline(2);
        optim::momentum opt({.lr = 0.1});
        nn::parallel_cross_entropy<double, mesh_t> loss;
        xshard::testing::expect_error([&] { xshard::model(piped, loss, opt); },
                                      "searched_transformer is not one");
    }
}

} // namespace search_tests
