// The strategy search on programs (search/program_search.hpp): its minimiser against brute
// force on random chains and graphs, the search on small programs against every combination
// of their nodes' ways, and sharding propagation on the AutoParallel document's
// ParallelNetwork (one annotated matmul) and recursive programming on a residual network:
// the annotation kept, every derived layout what compile lays out, and training equal to one
// rank's; a dataset strategy laying a driven program's input out.

#include <xshard/driver/trainer.hpp>
#include <xshard/graph.hpp>
#include <xshard/io/strategy_file.hpp>
#include <xshard/nn/embedding.hpp>
#include <xshard/optim/optimizers.hpp>
#include <xshard/search/calibrate.hpp>
#include <xshard/search/program_file.hpp>
#include <xshard/search/program_search.hpp>
#include <xshard/search/program_strategy_file.hpp>
#include <xshard/tensor/distribute.hpp>
#include <xshard/tensor/gather.hpp>
#include <xshard/train/gradients.hpp>

#include "mpi_test.hpp"

#include <gtest/gtest.h>
#include <xtensor/xrandom.hpp>

#include <array>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <random>
#include <span>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

// Named: the program's files compile as one unit (XSHARD_UNITY_TESTS), and share no names.
namespace program_search_tests {

using xshard::traced_tensor;
using xshard::testing::world;
namespace ops = xshard::ops;
using mesh_t = xshard::mesh<"dp", "tp">;

/// The least cost of `p` among picks whose `figure` is at most `cap` (every pick without a
/// figure), by trying every combination (infinity when none is).
double brute_force_within(const xshard::detail::cost_problem& p,
                          const std::vector<std::vector<double>>& figure, double cap) {
    std::vector<std::size_t> pick(p.unary.size(), 0);
    double best = INFINITY;
    while (true) {
        double f = 0;
        for (std::size_t v = 0; v < figure.size(); ++v)
            f += figure[v][pick[v]];
        if (f <= cap)
            best = std::min(best, p.total(pick));
        std::size_t i = 0;
        while (i < pick.size() && ++pick[i] == p.unary[i].size())
            pick[i++] = 0;
        if (i == pick.size())
            return best;
    }
}

/// The minimum of `p` by trying every combination.
double brute_force(const xshard::detail::cost_problem& p) {
    return brute_force_within(p, {}, INFINITY);
}

double combinations(const xshard::detail::cost_problem& p) {
    double n = 1;
    for (const auto& u : p.unary)
        n *= double(u.size());
    return n;
}

/// A random problem of `n` variables: a chain, a tree, or a graph with extra edges (some
/// parallel), each variable with 1 to 4 values.
xshard::detail::cost_problem random_problem(std::mt19937& engine, std::size_t n, int shape) {
    std::uniform_real_distribution<double> cost(0.0, 10.0);
    std::uniform_int_distribution<std::size_t> values(1, 4);
    xshard::detail::cost_problem p;
    for (std::size_t v = 0; v < n; ++v) {
        p.unary.emplace_back(values(engine));
        for (auto& c : p.unary.back())
            c = cost(engine);
    }
    auto add = [&](std::size_t a, std::size_t b) {
        xshard::detail::cost_problem::edge e{a, b, {}};
        e.cost.resize(p.unary[a].size() * p.unary[b].size());
        for (auto& c : e.cost)
            c = cost(engine);
        p.edges.push_back(std::move(e));
    };
    for (std::size_t v = 1; v < n; ++v)
        add(shape == 0 ? v - 1 : std::uniform_int_distribution<std::size_t>(0, v - 1)(engine), v);
    if (shape == 2)
        for (std::size_t extra = 0; extra < n; ++extra) {
            std::uniform_int_distribution<std::size_t> pick(0, n - 1);
            const auto a = pick(engine), b = pick(engine);
            if (a != b)
                add(std::min(a, b), std::max(a, b));
        }
    return p;
}

TEST(cost_minimizer, finds_the_brute_force_minimum_of_random_chains_trees_and_graphs) {
    std::mt19937 engine(17);
    int graphs = 0, branching = 0;
    for (int shape = 0; shape < 3; ++shape)
        for (std::size_t n = 4; n <= 8; ++n)
            for (int trial = 0; trial < 40; ++trial) {
                const auto p = random_problem(engine, n, shape);
                xshard::detail::cost_minimizer m(p);
                const auto s = m.solve();
                const double expected = brute_force(p);
                ASSERT_TRUE(s.exact);
                EXPECT_NEAR(s.cost, expected, 1e-9 * expected)
                    << "shape " << shape << ", " << n << " variables";
                EXPECT_NEAR(p.total(s.pick), s.cost, 1e-9 * expected);
                ++graphs;
                branching += s.branched > 0;
            }
    if (world().rank() == 0)
        std::printf(
            "cost_minimizer: %d random problems of 4-8 variables (chains, trees, graphs; %d "
            "needed branching) equal to brute force\n",
            graphs, branching);
    EXPECT_GT(branching, 0); // the graphs exercise the branching, not only eliminations
}

TEST(cost_minimizer, beyond_its_branch_budget_still_gives_a_consistent_answer) {
    std::mt19937 engine(5);
    const auto p = random_problem(engine, 8, 2);
    xshard::detail::cost_minimizer m(p, 0);
    const auto s = m.solve();
    EXPECT_NEAR(p.total(s.pick), s.cost, 1e-9 * s.cost);
    EXPECT_GE(s.cost, brute_force(p) - 1e-9);
}

TEST(cost_minimizer, within_a_cap_its_bound_and_its_pick_enclose_the_brute_force_minimum) {
    std::mt19937 engine(23);
    std::uniform_int_distribution<int> bytes(0, 100);
    int problems = 0, binding = 0, equal = 0, proven = 0;
    for (int shape = 0; shape < 3; ++shape)
        for (std::size_t n = 4; n <= 8; ++n)
            for (int trial = 0; trial < 20; ++trial) {
                const auto p = random_problem(engine, n, shape);
                std::vector<std::vector<double>> figure;
                for (const auto& u : p.unary) {
                    figure.emplace_back();
                    for (std::size_t c = 0; c < u.size(); ++c)
                        figure.back().push_back(bytes(engine));
                }
                const double least = xshard::detail::least_figure(figure);
                EXPECT_FALSE(xshard::detail::minimize_within(p, figure, least - 1));
                const auto free = xshard::detail::cost_minimizer(p).solve();
                double free_figure = 0;
                for (std::size_t v = 0; v < n; ++v)
                    free_figure += figure[v][free.pick[v]];
                for (double share : {0.0, 0.4, 0.8, 1.0}) {
                    const double cap = least + share * (free_figure - least);
                    const auto found = xshard::detail::minimize_within(p, figure, cap);
                    ASSERT_TRUE(found);
                    const double expected = brute_force_within(p, figure, cap);
                    double f = 0;
                    for (std::size_t v = 0; v < n; ++v)
                        f += figure[v][found->pick[v]];
                    EXPECT_LE(f, cap);
                    EXPECT_EQ(found->figure, f);
                    EXPECT_NEAR(found->cost, p.total(found->pick), 1e-9 * expected);
                    EXPECT_LE(found->bound, expected + 1e-9 * expected);
                    EXPECT_GE(found->cost, expected - 1e-9 * expected);
                    if (found->exact) {
                        EXPECT_NEAR(found->cost, expected, 1e-9 * expected);
                    }
                    if (share == 1.0) { // the unconstrained minimum fits
                        EXPECT_TRUE(found->exact);
                    }
                    ++problems;
                    binding += free_figure > cap;
                    equal += std::abs(found->cost - expected) <= 1e-9 * expected;
                    proven += found->exact;
                }
            }
    if (world().rank() == 0)
        std::printf("minimize_within: %d random problems of 4-8 variables under a cap (%d where it "
                    "binds): %d at the brute-force minimum, %d of them proven by the bound\n",
                    problems, binding, equal, proven);
    EXPECT_GT(binding, problems / 2);
    EXPECT_GT(equal, problems * 9 / 10);
}

// --- programs -----------------------------------------------------------------------------------

constexpr std::size_t batch = 24, features = 16, classes = 10;

/// MindSpore's ParallelNetwork (flatten, matmul with fc1 [16, 10], relu) with a loss; the
/// matmul annotated with `strategy` when given.
xshard::program parallel_network(std::optional<std::vector<xshard::strategy>> strategy) {
    return xshard::trace(
        [&](traced_tensor x, traced_tensor y) {
            auto fc1 =
                xshard::param("fc1", {features, classes}, xshard::initializer::normal(0, 0.3));
            auto h = ops::flatten(x);
            h = strategy ? ops::matmul.shard(*strategy)(h, fc1) : ops::matmul(h, fc1);
            return ops::mean<0>(ops::cross_entropy(ops::relu(h), y));
        },
        xshard::input<double>("x", {batch, 4, 4}), xshard::input<std::int64_t>("y", {batch}));
}

/// A residual MLP with a weight used twice: relu(x w1) + x, then (.) w1 again, a head.
xshard::program residual_network() {
    return xshard::trace(
        [&](traced_tensor x, traced_tensor y) {
            auto w1 =
                xshard::param("w1", {features, features}, xshard::initializer::normal(0, 0.3));
            auto h = ops::relu(ops::matmul(x, w1)) + x;
            h = ops::matmul(h, w1);
            auto w2 =
                xshard::param("head.w2", {features, classes}, xshard::initializer::normal(0, 0.3));
            return ops::mean<0>(ops::cross_entropy(ops::matmul(h, w2), y));
        },
        xshard::input<double>("x", {batch, features}), xshard::input<std::int64_t>("y", {batch}));
}

xshard::mesh_shape shape_of(std::vector<std::string> names, std::vector<int> sizes) {
    xshard::static_vector<xshard::axis_name, xshard::max_mesh_axes> n;
    xshard::static_vector<int, xshard::max_mesh_axes> s;
    for (std::size_t i = 0; i < names.size(); ++i) {
        n.push_back(xshard::axis_name(names[i]));
        s.push_back(sizes[i]);
    }
    return xshard::mesh_shape(n, s);
}

/// Every node of `p`, laid out by compile's pass after `found.apply`, runs as the search chose.
void expect_compile_lays_out(xshard::program p, const xshard::program_strategy& found,
                             const xshard::mesh_shape& mesh) {
    found.apply(p);
    const auto laid = xshard::assign_layouts(p, mesh);
    ASSERT_EQ(laid.nodes.size(), found.nodes.size());
    for (std::size_t k = 0; k < found.nodes.size(); ++k) {
        EXPECT_EQ(laid.nodes[k].operands, found.nodes[k].layouts.operands) << found.nodes[k].node;
        EXPECT_EQ(laid.nodes[k].results, found.nodes[k].layouts.results) << found.nodes[k].node;
    }
}

TEST(program_search, finds_the_minimum_over_every_combination_of_small_programs) {
    int programs = 0;
    double tried = 0;
    const std::vector<xshard::mesh_shape> meshes = {shape_of({"x"}, {2}), shape_of({"x"}, {4}),
                                                    shape_of({"dp", "tp"}, {2, 2})};
    for (const auto& mesh : meshes)
        for (bool residual : {false, true}) {
            const auto p = residual ? residual_network() : parallel_network(std::nullopt);
            const xshard::program_search_options o{.keep_annotations = false};
            xshard::detail::program_costs costs(p, mesh, o);
            const double n = combinations(costs.problem());
            if (n > 3e6)
                continue;
            const auto found = xshard::search_program(p, mesh, o);
            const double expected = brute_force(costs.problem());
            EXPECT_NEAR(found.seconds, expected, 1e-9 * expected) << mesh.to_string();
            expect_compile_lays_out(p, found, mesh);
            ++programs;
            tried += n;
        }
    if (world().rank() == 0)
        std::printf(
            "program_search: %d programs, %.0f strategy combinations priced by brute force, "
            "the search's minimum equal on each\n",
            programs, tried);
    EXPECT_GE(programs, 4);
}

/// One image of 8 channels, 32 x 32: conv - batch norm - relu - conv - global average - fc.
xshard::program one_image_convnet() {
    return xshard::trace(
        [](traced_tensor x) {
            auto h = ops::conv2d(x, xshard::param("conv1.weight", {8, 8, 3, 3}), {.padding = 1});
            h = ops::relu(
                ops::batch_norm(h, xshard::param("bn.gamma", {8}, xshard::initializer::constant(1)),
                                xshard::param("bn.beta", {8}, xshard::initializer::zeros())));
            h = ops::conv2d(h, xshard::param("conv2.weight", {8, 8, 3, 3}), {.padding = 1});
            return ops::sum_all(
                ops::matmul(ops::global_avg_pool2d(h), xshard::param("fc.weight", {8, 3})));
        },
        xshard::input<double>("x", {1, 8, 32, 32}));
}

TEST(program_search, a_single_large_image_is_split_by_height_and_width) {
    // A batch of one image cannot be split, and split channels gather or sum the activations
    // at every convolution: the search splits the image into bands and pays their halos.
    const auto p = one_image_convnet();
    for (const auto& mesh : {shape_of({"x"}, {4}), shape_of({"dp", "tp"}, {2, 2})}) {
        const auto found = xshard::search_program(p, mesh, {.keep_annotations = false});
        std::size_t spatial = 0;
        for (const auto& n : found.nodes)
            if (n.op == "conv2d" &&
                (n.layouts.operands[0].is_split(2) || n.layouts.operands[0].is_split(3)))
                ++spatial;
        EXPECT_EQ(spatial, 2u) << found.explain();
        expect_compile_lays_out(p, found, mesh);
    }
    // On this run's ranks the searched program's step equals one rank's.
    const int ranks = world().size();
    const mesh_t one(xshard::communicator::self(), {1, 1}), mesh(world(), {1, ranks});
    std::mt19937 engine(6);
    const xt::xtensor<double, 4> x = xt::random::randn<double>({1, 8, 32, 32}, 0.0, 1.0, engine);
    auto alone = xshard::compile<double>(p, one, {.seed = 2});
    const double expected =
        alone.train_step(xshard::distribute<xshard::dynamic_layout(4)>(one, x, "[-, -, -, -]"));
    auto searched = p;
    const auto found = xshard::search_program(searched, mesh.shape(), {.keep_annotations = false});
    found.apply(searched);
    auto net = xshard::compile<double>(searched, mesh, {.seed = 2});
    const double loss =
        net.train_step(xshard::distribute<xshard::dynamic_layout(4)>(mesh, x, "[-, -, -, -]"));
    EXPECT_NEAR(loss, expected, 1e-10 * std::abs(expected)) << found.explain();
    std::map<std::string, xt::xarray<double>> want;
    xshard::for_each_weight(
        alone, [&](const std::string& name, auto& w) { want[name] = xshard::gather_all(w.grad); });
    xshard::for_each_weight(net, [&](const std::string& name, auto& w) {
        const xt::xarray<double> g = xshard::gather_all(w.grad);
        EXPECT_LT(double(xt::amax(xt::abs(g - want.at(name)))()), 1e-10) << name;
    });
}

TEST(program_search, an_annotation_kept_cannot_run_on_the_mesh_raises_naming_the_node) {
    const auto p = parallel_network(std::vector<xshard::strategy>{{1, 1}, {1, 3}});
    try {
        (void)xshard::search_program(p, shape_of({"dp", "tp"}, {2, 2}));
        FAIL() << "no error";
    } catch (const xshard::error& e) {
        EXPECT_NE(std::string(e.what()).find("matmul"), std::string::npos) << e.what();
    }
}

TEST(program_search, calibrate_ops_prices_each_primitive_as_the_slowest_rank_ran_it) {
    const int p = world().size();
    const mesh_t mesh(world(), {1, p});
    const auto traced = residual_network();
    const xshard::machine_model base{};
    const auto found = xshard::search_program(traced, mesh.shape(), {.machine = base});
    // A profile of two steps in which every node took (rank + 2) times its price, a quarter
    // forward; the redistributions' seconds are not the primitives'.
    const double mine = world().rank() + 2, slowest = p + 1;
    auto profile_of = [&](const xshard::program_strategy& s, double factor) {
        xshard::program_profile prof;
        prof.forward_passes = prof.backward_passes = 2;
        for (const auto& n : s.nodes)
            prof.nodes.push_back(
                {n.node, n.op, 0.5 * factor * n.compute, 1.5 * factor * n.compute, 7.0});
        return prof;
    };
    const auto fitted = xshard::calibrate_ops(world(), base, profile_of(found, mine), found);
    std::size_t priced = 0;
    for (const auto& n : found.nodes)
        if (n.compute > 0) {
            ++priced;
            EXPECT_NEAR(fitted.scale_of(n.op), slowest, 1e-9 * slowest) << n.node;
        }
    EXPECT_GE(priced, 4u);
    // The same strategy priced again: each node's compute is the slowest rank's.
    auto pinned = traced;
    found.apply(pinned);
    const auto again = xshard::search_program(pinned, mesh.shape(), {.machine = fitted});
    ASSERT_EQ(again.nodes.size(), found.nodes.size());
    for (std::size_t k = 0; k < found.nodes.size(); ++k)
        EXPECT_NEAR(again.nodes[k].compute, slowest * found.nodes[k].compute,
                    1e-9 * slowest * found.nodes[k].compute + 1e-300)
            << found.nodes[k].node;
    // A step that ran as priced keeps the factors it was priced with.
    const auto kept = xshard::calibrate_ops(world(), fitted, profile_of(again, 1.0), again);
    for (const auto& [op, f] : fitted.op_scale)
        EXPECT_NEAR(kept.scale_of(op), f, 1e-9 * f) << op;
    // A profile without a step, on one rank or on all, raises on every rank.
    auto empty = profile_of(found, mine);
    if (world().rank() == p - 1)
        empty.forward_passes = 0;
    EXPECT_THROW((void)xshard::calibrate_ops(world(), base, empty, found), xshard::error);
    auto missing = profile_of(found, mine);
    missing.nodes.pop_back();
    EXPECT_THROW((void)xshard::calibrate_ops(world(), base, missing, found), xshard::error);
}

/// Trains `p` on `mesh` for a few steps with SGD; returns the losses.
std::vector<double> train(const xshard::program& p, const mesh_t& mesh, bool flat) {
    auto net = xshard::compile<double>(p, mesh, {.seed = 4});
    xshard::optim::sgd optimizer({.lr = 0.2});
    std::mt19937 engine(8);
    std::vector<double> losses;
    for (int step = 0; step < 3; ++step) {
        const xt::xtensor<std::int64_t, 1> y =
            xt::random::randint<std::int64_t>({batch}, 0, std::int64_t(classes), engine);
        const auto labels = xshard::distribute<xshard::dynamic_layout(1)>(mesh, y, "[-]");
        if (flat) {
            const xt::xtensor<double, 2> x =
                xt::random::rand<double>({batch, features}, -1.0, 1.0, engine);
            losses.push_back(net.train_step(
                xshard::distribute<xshard::dynamic_layout(2)>(mesh, x, "[-, -]"), labels));
        } else {
            const xt::xtensor<double, 3> x = xt::random::rand<double>(
                {batch, std::size_t(4), std::size_t(4)}, -1.0, 1.0, engine);
            losses.push_back(net.train_step(
                xshard::distribute<xshard::dynamic_layout(3)>(mesh, x, "[-, -, -]"), labels));
        }
        auto grads = xshard::gradients_of(net);
        xshard::synchronize_gradients(net, grads);
        optimizer.step(net);
        xshard::for_each_weight(net, [](const std::string&, auto& w) { w.zero_grad(); });
    }
    return losses;
}

TEST(program_search, sharding_propagation_keeps_the_annotated_matmul_and_trains_like_one_rank) {
    const int p = world().size();
    if (p % 2 != 0)
        GTEST_SKIP() << "the annotation ((1, 1), (1, 2)) needs an axis of 2";
    const mesh_t one(xshard::communicator::self(), {1, 1});
    const auto reference = train(parallel_network(std::nullopt), one, false);
    const mesh_t mesh(world(), {p / 2, 2});
    auto net = parallel_network(std::vector<xshard::strategy>{{1, 1}, {1, 2}});
    const auto annotated = xshard::assign_layouts(net, mesh.shape());
    const auto found = xshard::search_program(net, mesh.shape());
    if (world().rank() == 0)
        std::printf("%s", found.explain().c_str());
    std::size_t kept = 0;
    for (std::size_t k = 0; k < found.nodes.size(); ++k)
        if (found.nodes[k].annotated) {
            ++kept;
            EXPECT_EQ(found.nodes[k].layouts.operands, annotated.nodes[k].operands);
            EXPECT_EQ(found.nodes[k].layouts.results, annotated.nodes[k].results);
        } else {
            EXPECT_GT(found.nodes[k].ways, 1u) << found.nodes[k].node;
        }
    EXPECT_EQ(kept, 1u);
    expect_compile_lays_out(net, found, mesh.shape());
    found.apply(net);
    const auto losses = train(net, mesh, false);
    for (std::size_t s = 0; s < losses.size(); ++s)
        EXPECT_NEAR(losses[s], reference[s], 1e-10) << "step " << s;
}

/// ParallelNetwork's matmul and relu without its loss: the logits, for the driver's loss.
xshard::program parallel_logits() {
    return xshard::trace(
        [&](traced_tensor x) {
            auto fc1 =
                xshard::param("fc1", {features, classes}, xshard::initializer::normal(0, 0.3));
            return ops::relu(ops::matmul(x, fc1));
        },
        xshard::input<double>("x", {batch, features}));
}

/// Three steps of the driver on `net` under `mode`, configured by `configure`, then
/// `inspect` given the configuration; the batches come replicated. Returns the losses.
template <class Configure, class Inspect>
std::vector<double> drive(xshard::compiled_program<double, mesh_t>& net, const mesh_t& mesh,
                          std::string_view mode, Configure&& configure, Inspect&& inspect) {
    xshard::auto_parallel parallel(net, mesh, mode);
    configure(parallel);
    xshard::nn::parallel_cross_entropy<double, mesh_t> loss;
    xshard::optim::sgd optimizer({.lr = 0.2});
    xshard::trainer driver(parallel, loss, optimizer); // compile(): lays the input out
    std::mt19937 engine(8);
    std::vector<std::pair<xshard::dtensor<double, mesh_t, xshard::dynamic_layout(2)>,
                          xshard::dtensor<std::int64_t, mesh_t, xshard::dynamic_layout(1)>>>
        batches;
    for (int step = 0; step < 3; ++step) {
        const xt::xtensor<double, 2> x =
            xt::random::rand<double>({batch, features}, -1.0, 1.0, engine);
        const xt::xtensor<std::int64_t, 1> y =
            xt::random::randint<std::int64_t>({batch}, 0, std::int64_t(classes), engine);
        batches.emplace_back(xshard::distribute<xshard::dynamic_layout(2)>(mesh, x, "[-, -]"),
                             xshard::distribute<xshard::dynamic_layout(1)>(mesh, y, "[-]"));
    }
    auto losses = driver.train(1, batches);
    inspect(std::as_const(parallel));
    return losses;
}

template <class Configure>
std::vector<double> drive(xshard::compiled_program<double, mesh_t>& net, const mesh_t& mesh,
                          std::string_view mode, Configure&& configure) {
    return drive(net, mesh, mode, configure, [](const auto&) {});
}

/// The elements of a distributed tensor's global shape.
template <class D>
std::size_t global_size(const D& t) {
    std::size_t n = 1;
    for (auto e : t.shape())
        n *= e;
    return n;
}

/// hsdp level3 on a compiled program runs inside the program: each weight of at least the
/// threshold is kept split over every mesh axis it does not use and gathered at its use
/// (ZeRO-3), and the driver trains like one rank. Below the threshold, or under
/// gradients_mean, the weight stays whole (the sharding gathers around the passes).
TEST(program_search, hsdp_level3_keeps_a_program_s_weights_split_and_gathers_each_at_its_use) {
    const mesh_t one(xshard::communicator::self(), {1, 1});
    auto alone = xshard::compile<double>(parallel_logits(), one, {.seed = 3});
    const auto reference = drive(alone, one, "semi_auto", [](auto&) {});
    const int n = world().size();
    std::vector<mesh_t> meshes{mesh_t(world(), {n, 1}), mesh_t(world(), {1, n})};
    if (n % 2 == 0 && n > 2)
        meshes.push_back(mesh_t(world(), {n / 2, 2}));
    for (const auto& mesh : meshes) {
        const std::string where = "mesh(" + mesh.shape().to_string() + ")";
        // fc1 holds 16 x 10 doubles, 1.25 KB: split at a threshold of 1 KB, whole at 2 KB.
        for (const std::int64_t kb : {1, 2}) {
            auto net = xshard::compile<double>(parallel_logits(), mesh, {.seed = 3});
            const auto losses =
                drive(net, mesh, "semi_auto", [&](auto& c) { c.hsdp(-1, kb, "level3"); });
            ASSERT_EQ(losses.size(), reference.size());
            for (std::size_t s = 0; s < losses.size(); ++s)
                EXPECT_NEAR(losses[s], reference[s], 1e-10) << "step " << s << " " << where;
            const bool split = kb == 1 && n > 1;
            xshard::for_each_weight(net, [&](const std::string& name, auto& w) {
                const auto axes = w.value.layout().split_axes(mesh.shape());
                EXPECT_EQ(w.value.local().size() < global_size(w.value), split)
                    << name << " laid out " << w.value.layout().to_string() << ", " << where;
                for (std::size_t a = 0; a < mesh.shape().ndim(); ++a)
                    if (mesh.shape().sizes[a] > 1) {
                        EXPECT_EQ(axes.contains(a), split) << name << " " << where;
                    }
            });
            EXPECT_EQ(net.describe().find("forward redistribution of fc1") != std::string::npos,
                      split)
                << where << "\n"
                << net.describe();
        }
        // gradients_mean: the weight stays whole, the step as with the mean alone.
        auto mean_net = xshard::compile<double>(parallel_logits(), mesh, {.seed = 3});
        const auto mean_losses = drive(mean_net, mesh, "semi_auto", [](auto& c) {
            c.hsdp(-1, 0, "level3");
            c.enable_gradients_mean();
        });
        auto plain_mean = xshard::compile<double>(parallel_logits(), mesh, {.seed = 3});
        const auto expected =
            drive(plain_mean, mesh, "semi_auto", [](auto& c) { c.enable_gradients_mean(); });
        for (std::size_t s = 0; s < expected.size(); ++s)
            EXPECT_NEAR(mean_losses[s], expected[s], 1e-10) << "step " << s << " " << where;
        xshard::for_each_weight(mean_net, [&](const std::string& name, auto& w) {
            EXPECT_EQ(w.value.local().size(), global_size(w.value)) << name << " " << where;
        });
    }
}

TEST(program_search, the_driver_searches_within_max_device_memory_and_trains_like_one_rank) {
    const mesh_t one(xshard::communicator::self(), {1, 1});
    auto alone = xshard::compile<double>(parallel_logits(), one, {.seed = 3});
    const auto reference = drive(alone, one, "semi_auto", [](auto&) {});
    const mesh_t mesh(world(), {1, world().size()});
    // The cap: halfway between the least bytes any strategy needs and the fastest's.
    const xshard::program_search_options free{.keep_annotations = false};
    const xshard::detail::program_costs costs(parallel_logits(), mesh.shape(), free);
    const double least = xshard::detail::least_figure(costs.memory());
    const auto fastest = xshard::search_program(parallel_logits(), mesh.shape(), free);
    const double cap = std::floor(0.5 * (least + double(fastest.memory_bytes())));
    auto net = xshard::compile<double>(parallel_logits(), mesh, {.seed = 3});
    const auto losses = drive(
        net, mesh, "recursive_programming", [&](auto& c) { c.max_device_memory(cap); },
        [&](const auto& c) {
            ASSERT_TRUE(c.searched_program());
            EXPECT_LE(double(c.searched_program()->memory_bytes()), cap);
            EXPECT_EQ(c.searched_program()->memory_cap, cap);
        });
    ASSERT_EQ(losses.size(), reference.size());
    for (std::size_t s = 0; s < losses.size(); ++s)
        EXPECT_NEAR(losses[s], reference[s], 1e-10) << "step " << s;
    // Below the least, or not positive: every rank raises.
    auto again = xshard::compile<double>(parallel_logits(), mesh, {.seed = 3});
    EXPECT_THROW(drive(again, mesh, "recursive_programming",
                       [&](auto& c) { c.max_device_memory(least - 1); }),
                 xshard::error);
    EXPECT_THROW(
        drive(again, mesh, "recursive_programming", [&](auto& c) { c.max_device_memory(0); }),
        xshard::error);
}

TEST(program_search, a_dataset_strategy_lays_the_program_input_out_and_trains_like_one_rank) {
    // MindSpore's dataset_strategy as layouts and as strategies: compile() compiles the
    // program again with its input so (the search keeps it), the driver lays each batch out
    // so, and the losses are one rank's.
    const int p = world().size();
    const mesh_t one(xshard::communicator::self(), {1, 1});
    auto alone = xshard::compile<double>(parallel_logits(), one, {.seed = 3});
    const auto reference = drive(alone, one, "semi_auto", [](auto&) {});
    std::vector<mesh_t> meshes{mesh_t(world(), {p, 1})};
    if (p % 2 == 0 && p > 2)
        meshes.emplace_back(world(), std::array{p / 2, 2});
    using L = xshard::layout;
    for (const auto& mesh : meshes) {
        const int tp = mesh.axis_size<"tp">();
        const std::vector<std::vector<L>> forms{
            {L::parse("[dp, tp]"), L::parse("[dp]")},
            {L::parse("[-, (dp,tp)]"), L::parse("[-]")},
            {xshard::resolve({1, tp}, mesh.shape()), xshard::resolve({1}, mesh.shape())}};
        for (std::string_view mode : {"semi_auto", "recursive_programming"})
            for (std::size_t f = 0; f < forms.size(); ++f) {
                auto net = xshard::compile<double>(parallel_logits(), mesh, {.seed = 3});
                const auto losses = drive(net, mesh, mode, [&](auto& c) {
                    if (f + 1 < forms.size())
                        c.dataset_strategy(forms[f]);
                    else // ((1, tp), (1,))
                        c.dataset_strategy(std::vector<xshard::strategy>{{1, tp}, {1}});
                });
                const auto ctx = xshard::testing::where(mesh) + " " + std::string(mode) + ", x " +
                                 forms[f][0].to_string();
                EXPECT_EQ(net.layouts().values[net.source().inputs()[0]], forms[f][0]) << ctx;
                ASSERT_EQ(losses.size(), reference.size()) << ctx;
                for (std::size_t s = 0; s < losses.size(); ++s)
                    EXPECT_NEAR(losses[s], reference[s], 1e-10) << ctx << ", step " << s;
            }
    }
}

std::string scratch(const std::string& name) {
    const std::string dir =
        std::string(XSHARD_SEARCH_SCRATCH) + "/programs_np" + std::to_string(world().size());
    std::filesystem::create_directories(dir);
    return dir + "/" + name;
}

TEST(program_search, the_driver_searches_on_the_machine_measured_or_set) {
    // measure_machine: positive, finite figures, the same on every rank (the slowest rank's).
    const auto measured = xshard::measure_machine<double>(
        world(), {},
        {.rows = 32, .in = 128, .out = 256, .square = 128, .elements = 1 << 16, .repeats = 2});
    EXPECT_EQ(measured.element, sizeof(double));
    EXPECT_TRUE(std::isfinite(measured.gemm_half_dimension) && measured.gemm_half_dimension >= 0)
        << measured.gemm_half_dimension;
    for (double v : {measured.gemm_flops, measured.memory_bandwidth,
                     1 + measured.gemm_half_dimension, measured.transcendental_seconds}) {
        EXPECT_TRUE(std::isfinite(v) && v > 0) << v;
        std::array<double, 2> range{v, -v};
        xshard::mpi::allreduce(world(), std::span(range), xshard::reduction::min);
        EXPECT_EQ(range[0], -range[1]) << "a figure differs between ranks";
    }
    // The driver searches on the machine it is set to: with GEMMs and memory 1000x slower,
    // the strategy it chooses computes 1000x longer than the same strategy priced on the
    // measured machine (this program has no kernel priced otherwise), and the operator
    // strategy file it saves predicts what its search did.
    auto slow = measured;
    slow.gemm_flops /= 1000;
    slow.memory_bandwidth /= 1000;
    const mesh_t mesh(world(), {1, world().size()});
    const auto path = scratch("priced.json");
    auto net = xshard::compile<double>(parallel_logits(), mesh, {.seed = 3});
    std::optional<xshard::program_strategy> chosen;
    drive(
        net, mesh, "sharding_propagation",
        [&](auto& c) {
            c.set_machine_model(slow);
            EXPECT_EQ(c.machine().gemm_flops, slow.gemm_flops);
            c.save_operator_strategy_file(path);
        },
        [&](const auto& c) { chosen = c.searched_program(); });
    ASSERT_TRUE(chosen);
    EXPECT_NEAR(xshard::load_program_strategy(path, mesh.shape()).seconds, chosen->seconds,
                1e-9 * chosen->seconds);
    auto pinned = parallel_logits();
    chosen->apply(pinned);
    const auto fast = xshard::search_program(pinned, mesh.shape(),
                                             {.machine = measured, .keep_annotations = true});
    const auto compute = [](const xshard::program_strategy& s) {
        double c = 0;
        for (const auto& n : s.nodes)
            c += n.compute;
        return c;
    };
    ASSERT_EQ(fast.nodes.size(), chosen->nodes.size());
    for (std::size_t i = 0; i < fast.nodes.size(); ++i)
        EXPECT_EQ(fast.nodes[i].layouts.operands, chosen->nodes[i].layouts.operands)
            << fast.nodes[i].node;
    EXPECT_GT(compute(fast), 0);
    EXPECT_NEAR(compute(*chosen), 1000 * compute(fast), 1e-9 * compute(*chosen));
    // A machine that cannot be priced raises on every rank.
    auto other = xshard::compile<double>(parallel_logits(), mesh, {.seed = 3});
    xshard::auto_parallel unpriced(other, mesh, "recursive_programming");
    auto bad = measured;
    bad.memory_bandwidth = 0;
    EXPECT_THROW(unpriced.set_machine_model(bad), xshard::error);
    bad = measured;
    bad.gemm_half_dimension = -1;
    EXPECT_THROW(unpriced.set_machine_model(bad), xshard::error);
    bad.gemm_half_dimension = std::numeric_limits<double>::infinity();
    EXPECT_THROW(unpriced.set_machine_model(bad), xshard::error);
    bad = measured;
    bad.transcendental_seconds = 0;
    EXPECT_THROW(unpriced.set_machine_model(bad), xshard::error);
}

TEST(program_search, transcendental_functions_are_priced_per_element) {
    // gelu evaluates an erf forward and an erf and an exp backward per element; softmax an
    // exp forward; relu none; log_softmax an exp each way, but on the input (which depends on
    // no weight) no cotangent reaches it, and it runs forward only. Each node's price grows by
    // that count times the elements times the machine's seconds per function, and nothing
    // else changes. Its memory traffic likewise: once forward, twice more backward.
    auto p = xshard::trace(
        [](traced_tensor x) {
            auto h = ops::matmul(ops::log_softmax<1>(x), xshard::param("w", {64, 32}));
            return ops::relu(ops::softmax<1>(ops::gelu(h)));
        },
        xshard::input<double>("x", {8, 64}));
    const auto priced = [&](double seconds, double bandwidth) {
        xshard::machine_model m;
        m.element = sizeof(double);
        m.transcendental_seconds = seconds;
        m.memory_bandwidth = bandwidth;
        std::map<std::string, double> compute;
        for (const auto& n : xshard::search_program(p, shape_of({"x"}, {1}), {.machine = m}).nodes)
            compute[n.op] = n.compute;
        return compute;
    };
    const auto fast = priced(1e-9, 1e10), slow = priced(5e-9, 1e10);
    ASSERT_EQ(fast.size(), 5u);
    EXPECT_NEAR(slow.at("gelu") - fast.at("gelu"), 3 * 8 * 32 * 4e-9, 1e-15);
    EXPECT_NEAR(slow.at("softmax") - fast.at("softmax"), 1 * 8 * 32 * 4e-9, 1e-15);
    EXPECT_NEAR(slow.at("log_softmax") - fast.at("log_softmax"), 1 * 8 * 64 * 4e-9, 1e-15);
    EXPECT_EQ(slow.at("relu"), fast.at("relu"));
    EXPECT_EQ(slow.at("matmul"), fast.at("matmul"));
    // Half the bandwidth: each byte's time again. [8, 64] in and out, forward only; relu's
    // [8, 32] in and out, three times.
    const auto narrow = priced(1e-9, 5e9);
    EXPECT_NEAR(narrow.at("log_softmax") - fast.at("log_softmax"), 1 * 2 * 8 * 64 * 8 / 1e10,
                1e-15);
    EXPECT_NEAR(narrow.at("relu") - fast.at("relu"), 3 * 2 * 8 * 32 * 8 / 1e10, 1e-15);
}

TEST(program_search, fit_gemm_recovers_the_peak_and_half_dimension_of_hockney_s_model) {
    // Rates made by the model itself (peak 1e11, half dimension 30) are fitted back exactly.
    const auto rate = [](double peak, double half, double d) { return peak / (1 + half / d); };
    xshard::machine_model m;
    xshard::fit_gemm(m, rate(1e11, 30, 64), 64, rate(1e11, 30, 512), 512);
    EXPECT_NEAR(m.gemm_flops, 1e11, 1e-9 * 1e11);
    EXPECT_NEAR(m.gemm_half_dimension, 30, 1e-9);
    EXPECT_NEAR(m.gemm_seconds(2e9, 64), 2e9 / rate(1e11, 30, 64), 1e-12);
    EXPECT_EQ(m.gemm_seconds(2e9), 2e9 / m.gemm_flops); // no GEMM: the peak
    // A narrow GEMM no slower than the wide one: one speed, the wide one's.
    xshard::fit_gemm(m, 9e10, 64, 8e10, 512);
    EXPECT_EQ(m.gemm_flops, 8e10);
    EXPECT_EQ(m.gemm_half_dimension, 0);
    EXPECT_EQ(m.gemm_seconds(1e9, 8), 1e9 / 8e10);
    // Samples of the same smallest dimension cannot tell a half dimension.
    xshard::fit_gemm(m, 5e10, 512, 8e10, 512);
    EXPECT_EQ(m.gemm_flops, 8e10);
    EXPECT_EQ(m.gemm_half_dimension, 0);
    // A narrow GEMM far slower: the peak at most twice the wide one's, the wide one kept.
    xshard::fit_gemm(m, 1e9, 64, 8e10, 512);
    EXPECT_NEAR(m.gemm_flops, 1.6e11, 1e-9 * 1.6e11);
    EXPECT_NEAR(m.gemm_seconds(1e9, 512), 1e9 / 8e10, 1e-15);
}

TEST(program_search, a_gemm_is_priced_at_the_speed_of_its_smallest_dimension) {
    // [8, 64] x [64, 32] on one rank: its smallest dimension is the 8 rows. The input takes no
    // cotangent, so the node runs its product forward and once backward (the weight's).
    auto p = xshard::trace(
        [](traced_tensor x) { return ops::matmul(x, xshard::param("w", {64, 32})); },
        xshard::input<double>("x", {8, 64}));
    // And a convolution of 4 images of 6 x 6 with 3 channels into 16 through 3 x 3 windows:
    // its GEMM is [16, 27] x [27, 4 * 4 * 4], smallest 16.
    auto q = xshard::trace(
        [](traced_tensor x) { return ops::conv2d(x, xshard::param("w", {16, 3, 3, 3})); },
        xshard::input<double>("x", {4, 3, 6, 6}));
    const auto one = shape_of({"x"}, {1});
    const auto priced = [&](const xshard::program& net, double half) {
        xshard::machine_model m;
        m.element = sizeof(double);
        m.gemm_half_dimension = half;
        return xshard::search_program(net, one, {.machine = m}).nodes.at(0).compute;
    };
    const double peak = xshard::machine_model{}.gemm_flops;
    // A matmul is priced as its GEMM alone: the GEMM streams its operands as it multiplies.
    // A convolution also streams its operands and im2col's columns at the memory bandwidth.
    EXPECT_NEAR(priced(p, 0), 2 * (2.0 * 8 * 64 * 32) / peak, 1e-15);
    EXPECT_GT(priced(q, 0), 1.01 * 2 * (2.0 * 16 * 27 * 64) / peak);
    EXPECT_NEAR(priced(p, 4) - priced(p, 0), 2 * (2.0 * 8 * 64 * 32) * (4.0 / 8) / peak, 1e-15);
    EXPECT_NEAR(priced(q, 4) - priced(q, 0), 2 * (2.0 * 16 * 27 * 64) * (4.0 / 16) / peak,
                1e-15);
    // Split over two ranks' rows, the product's smallest dimension halves and its slowdown
    // doubles: per rank, half the FLOPs at twice the slowdown.
    const auto two = shape_of({"dp"}, {2});
    xshard::machine_model m;
    m.element = sizeof(double);
    m.gemm_half_dimension = 4;
    auto split = p;
    split.node("matmul").annotation.in_layouts = {xshard::layout::parse("[dp, -]"),
                                                  xshard::layout::parse("[-, -]")};
    const double slowed = xshard::search_program(split, two, {.machine = m}).nodes.at(0).compute;
    m.gemm_half_dimension = 0;
    const double plain = xshard::search_program(split, two, {.machine = m}).nodes.at(0).compute;
    EXPECT_NEAR(slowed - plain, 2 * (2.0 * 4 * 64 * 32) * (4.0 / 4) / peak, 1e-15);
}

TEST(program_search, a_parameter_strategy_file_lays_the_program_weights_out) {
    // One run plans fc1's layout (MindSpore's parameter_plan: compile's weight_layouts) and
    // saves its strategy file; another compiles the program plainly and loads the file:
    // compile() compiles it again with fc1 so, and the losses are one rank's.
    const int p = world().size();
    const mesh_t one(xshard::communicator::self(), {1, 1});
    auto alone = xshard::compile<double>(parallel_logits(), one, {.seed = 3});
    const auto reference = drive(alone, one, "semi_auto", [](auto&) {});
    const mesh_t mesh(world(), {1, p});
    const xshard::layout planned("[-, tp]");
    auto first = xshard::compile<double>(
        parallel_logits(), mesh, {.seed = 3, .layouts = {.weight_layouts = {{"fc1", planned}}}});
    const auto path = scratch("planned_fc1.json");
    xshard::save_strategy_file(path, first);
    auto net = xshard::compile<double>(parallel_logits(), mesh, {.seed = 3});
    const auto losses =
        drive(net, mesh, "semi_auto", [&](auto& c) { c.load_param_strategy_file(path); });
    xshard::for_each_weight(net, [&](const std::string& name, auto& w) {
        EXPECT_EQ(w.value.layout(), planned) << name;
    });
    ASSERT_EQ(losses.size(), reference.size());
    for (std::size_t s = 0; s < losses.size(); ++s)
        EXPECT_NEAR(losses[s], reference[s], 1e-10) << "step " << s;
}

TEST(program_search, compile_keeps_the_weights_values_when_it_lays_a_program_out) {
    // Weights changed after xshard::compile (as training or a checkpoint load would) keep
    // their values when auto_parallel's compile() compiles the program again: for a dataset
    // strategy, a parameter strategy file and the engines' searches.
    const int p = world().size();
    const mesh_t mesh = p % 2 == 0 && p > 2 ? mesh_t(world(), {p / 2, 2}) : mesh_t(world(), {p, 1});
    auto first = xshard::compile<double>(
        parallel_logits(), mesh,
        {.seed = 3, .layouts = {.weight_layouts = {{"fc1", xshard::layout("[tp, -]")}}}});
    const auto path = scratch("kept_values_fc1.json");
    xshard::save_strategy_file(path, first);
    using config_t = xshard::auto_parallel<xshard::compiled_program<double, mesh_t>, mesh_t>;
    struct lay_out_case {
        std::string what, mode;
        std::function<void(config_t&)> configure;
    };
    const auto nothing = [](config_t&) {
    };
    const std::vector<lay_out_case> cases{
        {"dataset strategy", "semi_auto",
         [](config_t& c) {
             c.dataset_strategy(
                 std::vector<xshard::layout>{xshard::layout("[-, dp]"), xshard::layout("[-]")});
         }},
        {"parameter strategy file", "semi_auto",
         [&](config_t& c) {
             c.load_param_strategy_file(path);
         }},
        {"search", "recursive_programming", nothing},
        {"propagation", "sharding_propagation", nothing}};
    for (const auto& [what, mode, configure] : cases) {
        auto net = xshard::compile<double>(parallel_logits(), mesh, {.seed = 3});
        std::map<std::string, xt::xarray<double>> changed;
        xshard::for_each_weight(net, [&](const std::string& name, auto& w) {
            w.value.local() = 0.5 * w.value.local() + 1.0;
            changed[name] = xshard::gather_all(w.value);
        });
        xshard::auto_parallel parallel(net, mesh, mode);
        configure(parallel);
        parallel.compile();
        const auto ctx = xshard::testing::where(mesh) + " " + what;
        std::size_t checked = 0;
        xshard::for_each_weight(net, [&](const std::string& name, auto& w) {
            EXPECT_EQ(xshard::gather_all(w.value), changed.at(name)) << name << ", " << ctx;
            ++checked;
        });
        EXPECT_EQ(checked, changed.size()) << ctx;
        if (what == "dataset strategy") { // compiled again: its input as the strategy says
            EXPECT_EQ(net.layouts().values[net.source().inputs()[0]], xshard::layout("[-, dp]"))
                << ctx;
        }
    }
}

TEST(program_search, a_memory_cap_keeps_the_strategy_within_it_or_raises_with_the_least) {
    int capped = 0;
    for (const auto& mesh : {shape_of({"x"}, {4}), shape_of({"dp", "tp"}, {2, 2})}) {
        const auto p = residual_network();
        const xshard::program_search_options free{.keep_annotations = false};
        xshard::detail::program_costs costs(p, mesh, free);
        const auto fastest = xshard::search_program(p, mesh, free);
        // The same terms, summed in another order.
        EXPECT_NEAR(fastest.lower_bound, fastest.seconds, 1e-12 * fastest.seconds);
        const double least = xshard::detail::least_figure(costs.memory());
        ASSERT_LT(least, double(fastest.memory_bytes())) << mesh.to_string();
        for (double share : {0.0, 0.5}) {
            auto o = free;
            o.memory_per_rank = std::floor(least + share * (fastest.memory_bytes() - least));
            const auto found = xshard::search_program(p, mesh, o);
            // The strategy's bytes are what the search constrained, and within the cap.
            EXPECT_LE(double(found.memory_bytes()), o.memory_per_rank) << mesh.to_string();
            EXPECT_GE(found.seconds, fastest.seconds);
            const double expected =
                brute_force_within(costs.problem(), costs.memory(), o.memory_per_rank);
            EXPECT_LE(found.lower_bound, expected * (1 + 1e-9));
            EXPECT_GE(found.seconds, expected * (1 - 1e-9));
            EXPECT_NE(found.explain().find("within the cap of"), std::string::npos);
            expect_compile_lays_out(p, found, mesh);
            if (world().rank() == 0 && share == 0.5)
                std::printf("memory cap %.0f B on mesh(%s): %.4g s against %.4g s uncapped, "
                            "brute force %.4g s\n",
                            o.memory_per_rank, mesh.to_string().c_str(), found.seconds,
                            fastest.seconds, expected);
            ++capped;
        }
        auto o = free;
        o.memory_per_rank = least - 1;
        try {
            (void)xshard::search_program(p, mesh, o);
            ADD_FAILURE() << "no error below the least memory";
        } catch (const xshard::error& e) {
            const std::string what = e.what();
            EXPECT_NE(what.find("no strategy fits"), std::string::npos) << what;
            EXPECT_NE(what.find("the least is " + std::to_string(std::uint64_t(least))),
                      std::string::npos)
                << what;
        }
    }
    EXPECT_EQ(capped, 4);
    // On the run's mesh, a strategy within a cap trains like one rank.
    const mesh_t one(xshard::communicator::self(), {1, 1});
    const auto reference = train(residual_network(), one, true);
    const mesh_t mesh(world(), {1, world().size()});
    const xshard::program_search_options free{.keep_annotations = false};
    const auto fastest = xshard::search_program(residual_network(), mesh.shape(), free);
    xshard::detail::program_costs costs(residual_network(), mesh.shape(), free);
    auto o = free;
    o.memory_per_rank = std::floor(
        0.5 * (xshard::detail::least_figure(costs.memory()) + double(fastest.memory_bytes())));
    auto net = residual_network();
    xshard::search_program(net, mesh.shape(), o).apply(net);
    const auto losses = train(net, mesh, true);
    for (std::size_t s = 0; s < losses.size(); ++s)
        EXPECT_NEAR(losses[s], reference[s], 1e-10) << "step " << s;
    EXPECT_THROW((void)xshard::search_program(residual_network(), shape_of({"x"}, {2}),
                                              {.memory_per_rank = -1.0}),
                 xshard::error);
}

TEST(program_search, find_repeated_blocks_finds_the_runs_of_identical_blocks) {
    using xshard::detail::find_repeated_blocks;
    auto runs = [](std::vector<std::size_t> s) {
        std::string t;
        for (const auto& r : find_repeated_blocks(s))
            t += std::to_string(r.count) + "x" + std::to_string(r.nodes) + "@" +
                 std::to_string(r.first) + " ";
        return t;
    };
    EXPECT_EQ(runs({0, 1, 2, 1, 2, 1, 2, 3}), "3x2@1 ");
    EXPECT_EQ(runs({5, 5, 5}), "3x1@0 ");
    EXPECT_EQ(runs({1, 2, 3}), "");
    EXPECT_EQ(runs({0, 1, 0, 1, 2, 2}), "2x2@0 2x1@4 ");
    EXPECT_EQ(runs({7, 1, 2, 1, 2, 1, 2, 1, 2}), "4x2@1 "); // not 2 x (1, 2, 1, 2)
    EXPECT_EQ(runs({}), "");
}

/// A layer, three identical residual blocks (h + relu(h w_b)), a head and the loss.
xshard::program repeated_network() {
    return xshard::trace(
        [&](traced_tensor x, traced_tensor y) {
            auto h = ops::matmul(
                x, xshard::param("in", {features, features}, xshard::initializer::normal(0, 0.3)));
            for (int b = 0; b < 3; ++b) {
                xshard::name_scope scope("block" + std::to_string(b));
                auto w =
                    xshard::param("w", {features, features}, xshard::initializer::normal(0, 0.3));
                h = h + ops::relu(ops::matmul(h, w));
            }
            auto head =
                xshard::param("head", {features, classes}, xshard::initializer::normal(0, 0.3));
            return ops::mean<0>(ops::cross_entropy(ops::matmul(h, head), y));
        },
        xshard::input<double>("x", {batch, features}), xshard::input<std::int64_t>("y", {batch}));
}

TEST(program_search, repeated_blocks_are_searched_once_and_laid_out_alike) {
    const auto p = repeated_network();
    for (const auto& mesh : {shape_of({"x"}, {4}), shape_of({"dp", "tp"}, {2, 2})}) {
        const xshard::program_search_options o{.keep_annotations = false};
        xshard::detail::program_costs costs(p, mesh, o);
        ASSERT_EQ(costs.repeated().size(), 1u);
        const auto run = costs.repeated()[0];
        EXPECT_EQ(run.count, 3u);
        EXPECT_EQ(run.nodes, 3u); // matmul, relu, add
        EXPECT_EQ(run.first_name, "block0.matmul");
        const auto found = xshard::search_program(p, mesh, o);
        for (std::size_t b = 1; b < run.count; ++b)
            for (std::size_t j = 0; j < run.nodes; ++j)
                EXPECT_EQ(found.nodes[run.first + b * run.nodes + j].layouts.operands,
                          found.nodes[run.first + j].layouts.operands)
                    << found.nodes[run.first + b * run.nodes + j].node;
        // The minimum over strategies that lay the blocks out alike, by brute force over them.
        const auto tied =
            xshard::detail::tie(costs.problem(), costs.memory(), costs.representatives());
        EXPECT_EQ(tied.problem.unary.size(), p.nodes().size() - 6);
        const double expected = brute_force(tied.problem);
        EXPECT_NEAR(found.seconds, expected, 1e-9 * expected) << mesh.to_string();
        // Searched block by block, a strategy is never slower.
        auto apart = o;
        apart.share_repeated_blocks = false;
        const auto each = xshard::search_program(p, mesh, apart);
        EXPECT_TRUE(each.repeated.empty());
        EXPECT_LE(each.seconds, found.seconds * (1 + 1e-12));
        EXPECT_NE(found.explain().find("3 repeated blocks of 3 nodes from block0.matmul, searched "
                                       "once"),
                  std::string::npos);
        expect_compile_lays_out(p, found, mesh);
        if (world().rank() == 0)
            std::printf("repeated blocks on mesh(%s): %.4g s searched once, %.4g s block by "
                        "block\n",
                        mesh.to_string().c_str(), found.seconds, each.seconds);
    }
    // Laid out so on the run's mesh, it trains like one rank.
    const mesh_t one(xshard::communicator::self(), {1, 1});
    const auto reference = train(repeated_network(), one, true);
    const mesh_t mesh(world(), {1, world().size()});
    auto net = repeated_network();
    xshard::search_program(net, mesh.shape(), {.keep_annotations = false}).apply(net);
    const auto losses = train(net, mesh, true);
    for (std::size_t s = 0; s < losses.size(); ++s)
        EXPECT_NEAR(losses[s], reference[s], 1e-10) << "step " << s;
}

TEST(program_search,
     recursive_programming_on_a_residual_network_dry_run_then_trained_like_one_rank) {
    const int p = world().size();
    const mesh_t one(xshard::communicator::self(), {1, 1});
    const auto reference = train(residual_network(), one, true);
    for (int dp = 1; dp <= p; ++dp) {
        if (p % dp != 0)
            continue;
        const mesh_t mesh(world(), {dp, p / dp});
        const auto path = scratch("residual_dp" + std::to_string(dp) + ".json");
        // The dry run: one process searches for the mesh's shape and saves the strategy.
        if (world().rank() == 0) {
            const auto found = xshard::search_program(residual_network(), mesh.shape(),
                                                      {.keep_annotations = false});
            EXPECT_GT(found.seconds, 0.0);
            EXPECT_EQ(found.branched, 0u); // a residual join and a shared weight eliminate
            const auto again = xshard::search_program(residual_network(), mesh.shape(),
                                                      {.keep_annotations = false});
            EXPECT_EQ(found.diff(again), ""); // the search is deterministic
            xshard::save_program_strategy(path, found);
        }
        xshard::mpi::barrier(world());
        // The real run: every rank loads it for its mesh.
        auto net = residual_network();
        const auto loaded = xshard::load_program_strategy(path, mesh.shape());
        EXPECT_EQ(loaded.nodes.size(), net.nodes().size());
        loaded.apply(net);
        const auto losses = train(net, mesh, true);
        for (std::size_t s = 0; s < losses.size(); ++s)
            EXPECT_NEAR(losses[s], reference[s], 1e-10) << "step " << s << " on dp " << dp;
    }
}

TEST(program_strategy_file, a_partial_file_pins_its_nodes_and_propagation_fills_in_the_rest) {
    const auto mesh = shape_of({"dp", "tp"}, {2, 2});
    const auto full = xshard::search_program(residual_network(), mesh, {.keep_annotations = false});
    // Round trip: the same layouts, node by node.
    const auto read = xshard::parse_program_strategy(xshard::program_strategy_json(full), "", mesh);
    ASSERT_EQ(read.nodes.size(), full.nodes.size());
    for (std::size_t k = 0; k < full.nodes.size(); ++k) {
        EXPECT_EQ(read.nodes[k].node, full.nodes[k].node);
        EXPECT_EQ(read.nodes[k].layouts.operands, full.nodes[k].layouts.operands);
    }
    EXPECT_NEAR(read.seconds, full.seconds, 1e-12 + 1e-9 * full.seconds);
    // A file naming only the first matmul, column-parallel: kept, the rest searched around it.
    xshard::program_strategy partial;
    partial.mesh = mesh;
    xshard::node_strategy pinned;
    pinned.node = full.nodes[0].node;
    pinned.layouts.operands = {xshard::layout("[dp, -]"), xshard::layout("[-, tp]")};
    partial.nodes.push_back(pinned);
    auto net = residual_network();
    ASSERT_EQ(net.nodes()[0].op, "matmul");
    xshard::parse_program_strategy(xshard::program_strategy_json(partial), "", mesh).apply(net);
    const auto found = xshard::search_program(net, mesh);
    EXPECT_TRUE(found.nodes[0].annotated);
    EXPECT_EQ(found.nodes[0].layouts.operands, pinned.layouts.operands);
    for (std::size_t k = 1; k < found.nodes.size(); ++k)
        EXPECT_FALSE(found.nodes[k].annotated);
    EXPECT_GE(found.seconds, full.seconds - 1e-12); // pinning cannot beat the free search
    expect_compile_lays_out(net, found, mesh);
}

TEST(program_strategy_file, a_wrong_mesh_an_unknown_node_or_a_bad_layout_raises) {
    const auto mesh = shape_of({"dp", "tp"}, {2, 2});
    const auto text =
        xshard::program_strategy_json(xshard::search_program(residual_network(), mesh));
    EXPECT_THROW(
        (void)xshard::parse_program_strategy(text, "s.json", shape_of({"dp", "tp"}, {4, 1})),
        xshard::io_error);
    auto other = parallel_network(std::nullopt);
    EXPECT_THROW(xshard::parse_program_strategy(text, "s.json", mesh).apply(other), xshard::error);
    std::string bad = text;
    const auto at = bad.find("\"[");
    ASSERT_NE(at, std::string::npos);
    bad.replace(at, 2, "\"[nonsense ");
    try {
        (void)xshard::parse_program_strategy(bad, "s.json", mesh);
        FAIL() << "no error";
    } catch (const xshard::io_error& e) {
        EXPECT_NE(std::string(e.what()).find("s.json"), std::string::npos) << e.what();
    }
}

// --- program files -------------------------------------------------------------------------------

std::string listing(const xshard::program& p) {
    std::ostringstream s;
    s << p;
    return s.str();
}

/// residual_network with every kind of annotation: split counts, operand and result layouts.
xshard::program annotated_residual_network() {
    auto p = residual_network();
    p.shard("matmul", {{2, 1}, {1, 1}});
    auto& n = p.node("matmul_1");
    n.annotation.in_layouts = {"[dp, -]", "[-, tp]"};
    n.annotation.out_layouts = {"[dp, -]"};
    return p;
}

TEST(program_file, a_saved_program_loads_as_it_was_and_searches_and_trains_alike) {
    // The file holds the program (its listing, every weight's initializer, its annotations):
    // loaded in a process that has not traced it, it searches to the same strategy and trains
    // to the same losses on this run's ranks.
    for (const auto& p : {annotated_residual_network(), parallel_network(std::nullopt),
                          parallel_network(std::vector<xshard::strategy>{{1, 1}, {1, 2}})}) {
        const auto text = xshard::program_json(p);
        const auto loaded = xshard::parse_program(text, "p.json");
        EXPECT_EQ(listing(loaded), listing(p));
        EXPECT_EQ(xshard::program_json(loaded), text);
        ASSERT_EQ(loaded.weights().size(), p.weights().size());
        for (std::size_t i = 0; i < p.weights().size(); ++i) {
            const auto &a = p.value(p.weights()[i]).init,
                       &b = loaded.value(loaded.weights()[i]).init;
            EXPECT_TRUE(a.how == b.how && a.a == b.a && a.b == b.b) << listing(p);
        }
        const auto mesh = shape_of({"dp", "tp"}, {2, 4});
        const xshard::program_search_options o{.keep_annotations = false};
        EXPECT_EQ(xshard::program_strategy_json(xshard::search_program(loaded, mesh, o)),
                  xshard::program_strategy_json(xshard::search_program(p, mesh, o)));
    }
    // The file the tools tests search (tests/tools/) is this program as save_program writes it.
    EXPECT_EQ(xshard::detail::read_file(XSHARD_TOOLS_PROGRAM_FILE),
              xshard::program_json(residual_network()));
    const auto path = scratch("residual.program.json");
    if (world().rank() == 0)
        xshard::save_program(path, residual_network());
    xshard::mpi::barrier(world());
    const mesh_t mesh(world(), {world().size(), 1});
    const auto reference = train(residual_network(), mesh, true);
    const auto losses = train(xshard::load_program(path), mesh, true);
    ASSERT_EQ(losses.size(), reference.size());
    for (std::size_t s = 0; s < losses.size(); ++s)
        EXPECT_EQ(losses[s], reference[s]) << "step " << s;
}

TEST(program_file, what_does_not_describe_a_program_raises_naming_the_file_and_the_node) {
    const auto good = nlohmann::json::parse(xshard::program_json(residual_network()));
    const auto expect_raises = [&](const std::function<void(nlohmann::json&)>& damage,
                                   const std::string& says) {
        auto j = good;
        damage(j);
        try {
            (void)xshard::parse_program(j.dump(), "p.json");
            ADD_FAILURE() << "no error for " << says;
        } catch (const xshard::io_error& e) {
            const std::string what = e.what();
            EXPECT_NE(what.find("p.json"), std::string::npos) << what;
            EXPECT_NE(what.find(says), std::string::npos) << what;
        }
    };
    expect_raises([](auto& j) { j["format"] = "xshard-strategy"; }, "not an xshard program file");
    expect_raises([](auto& j) { j["nodes"][0]["op"] = "no_such_op"; }, "node matmul: no primitive");
    expect_raises([](auto& j) { j["nodes"][1]["operands"][0] = "later"; },
                  "node relu: operand 'later' is not a value defined before");
    expect_raises([](auto& j) { j["weights"][0]["shape"] = {3, 3}; }, "node matmul: ");
    expect_raises([](auto& j) { j["weights"][0]["init"]["kind"] = "zeros"; }, "'zeros'");
    expect_raises([](auto& j) { j["inputs"][0]["type"] = "f16"; }, "'f16'");
    expect_raises(
        [](auto& j) {
            j["nodes"][0]["in"] = {"[dp]", "[-, -]"};
        },
        "node matmul: the layout [dp]");
    expect_raises([](auto& j) { j["nodes"][0]["strategies"] = {{1, 1}}; }, "node matmul: ");
    expect_raises([](auto& j) { j["outputs"][0] = "nowhere"; }, "the output 'nowhere'");
    expect_raises([](auto& j) { j["inputs"][1]["name"] = "x"; }, "'x' appears twice");
    // A custom-VJP node is the program's own code: no file holds it.
    const mesh_t mesh(world(), {world().size(), 1});
    using tensor = xshard::dtensor<double, mesh_t, xshard::dynamic_layout(2)>;
    const auto custom = xshard::trace(
        [&](traced_tensor x) {
            return ops::sum_all(xshard::custom_vjp<double>(
                mesh, "twice", x, [](const tensor& t) { return tensor(t); },
                [](const tensor&, const tensor& dy) { return tensor(dy); }));
        },
        xshard::input<double>("x", {batch, features}));
    try {
        (void)xshard::program_json(custom);
        FAIL() << "no error";
    } catch (const xshard::error& e) {
        EXPECT_NE(std::string(e.what()).find("twice is a custom-VJP node"), std::string::npos)
            << e.what();
    }
}

} // namespace program_search_tests
