// Optimizer sharding (hsdp): the options' checks, the sharded layouts, and training
// trajectories at levels 0, 1 and 2 against one rank; a checkpoint saved under sharding and
// loaded at another level or without sharding.

#include <xshard/io/checkpoint.hpp>
#include <xshard/nn/activation.hpp>
#include <xshard/nn/blocks.hpp>
#include <xshard/nn/embedding.hpp>
#include <xshard/nn/linear.hpp>
#include <xshard/nn/module.hpp>
#include <xshard/optim/optimizers.hpp>
#include <xshard/tensor/distribute.hpp>
#include <xshard/tensor/gather.hpp>
#include <xshard/train/hsdp.hpp>
#include <xshard/train/norms.hpp>

#include "expect_error.hpp"
#include "mpi_test.hpp"
#include "small_mlp.hpp"

#include <gtest/gtest.h>
#include <xtensor/xrandom.hpp>

#include <array>
#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace {

namespace nn = xshard::nn;
namespace optim = xshard::optim;
using xshard::layout;
using xshard::optimizer_level;
using xshard::testing::expect_error;
using xshard::testing::where;
using xshard::testing::world;
using mesh_t = xshard::testing::mlp_mesh;

// --- options and layouts --------------------------------------------------------------------

TEST(hsdp_options, mindspores_conditions) {
    using xshard::detail::hsdp_options_problem;
    EXPECT_FALSE(hsdp_options_problem({}));
    EXPECT_FALSE(hsdp_options_problem({.shard_size = 4, .threshold = 0}));
    EXPECT_NE(hsdp_options_problem({.shard_size = 0})->find("positive integer or -1"),
              std::string::npos);
    EXPECT_NE(hsdp_options_problem({.shard_size = -2})->find("positive integer or -1"),
              std::string::npos);
    EXPECT_NE(hsdp_options_problem({.threshold = -1})->find("threshold must be"),
              std::string::npos);
    EXPECT_NE(hsdp_options_problem({.optimizer_level = optimizer_level(4)})->find("level1, level2"),
              std::string::npos);
    EXPECT_FALSE(hsdp_options_problem({.optimizer_level = optimizer_level::level3}));
    EXPECT_EQ(xshard::parse_optimizer_level("level2"), optimizer_level::level2);
    expect_error([] { (void)xshard::parse_optimizer_level("level4"); }, "one of level1");
}

TEST(hsdp_layouts, the_data_parallel_axes_join_a_dimension) {
    const xshard::mesh_shape m({"dp", "tp"}, {2, 2});
    auto both = xshard::axis_set{}.with(0);
    // The dp axis after tp; ties go to the lowest dimension.
    EXPECT_EQ(xshard::sharded_layout(layout("[-, tp]"), m, std::array<std::size_t, 2>{8, 6}, both),
              layout("[dp, tp]"));
    EXPECT_EQ(xshard::sharded_layout(layout("[tp, -]"), m, std::array<std::size_t, 2>{8, 6}, both),
              layout("[(tp, dp), -]"));
    // The dimension whose largest block is smallest: (3, 10) over 2 is split along 10.
    EXPECT_EQ(xshard::sharded_layout(layout("[-, -]"), m, std::array<std::size_t, 2>{3, 10}, both),
              layout("[-, dp]"));
    EXPECT_EQ(xshard::sharded_layout(layout("[-]"), m, std::array<std::size_t, 1>{5}, both.with(1)),
              layout("[(dp, tp)]"));
    EXPECT_EQ(xshard::sharded_layout(layout("[-]"), m, std::array<std::size_t, 1>{5}, {}),
              layout("[-]"));

    // shard_size: the whole group, a set of axes of that size (hybrid), or an error.
    using xshard::detail::hsdp_axes;
    const xshard::mesh_shape m3({"a", "b", "c"}, {2, 3, 2});
    const auto all = m3.all_axes();
    EXPECT_EQ(hsdp_axes(all, m3, -1, "w").axes.bits, all.bits);
    EXPECT_EQ(hsdp_axes(all, m3, 3, "w").axes.bits, xshard::axis_set{}.with(1).bits);
    EXPECT_EQ(hsdp_axes(all, m3, 2, "w").axes.bits, xshard::axis_set{}.with(2).bits); // minor
    EXPECT_EQ(hsdp_axes(all, m3, 6, "w").axes.bits, xshard::axis_set{}.with(1).with(2).bits);
    EXPECT_TRUE(hsdp_axes(all, m3, 6, "w").parts.empty());
    EXPECT_TRUE(hsdp_axes(all, m3, 1, "w").empty());
    expect_error([&] { (void)hsdp_axes(all, m3, 5, "w"); }, "does not divide");
    // Over part of an axis: copies of `inner` consecutive ranks of it.
    const xshard::mesh_shape m4({"dp"}, {4});
    const auto g4 = hsdp_axes(m4.all_axes(), m4, 2, "w");
    EXPECT_EQ(g4.axes.bits, m4.all_axes().bits);
    EXPECT_EQ(g4.parts, (std::vector<std::pair<int, int>>{{0, 2}}));
    // (6, 2) with shard_size 4: tp whole and 2 of dp's 6.
    const xshard::mesh_shape m62({"dp", "tp"}, {6, 2});
    const auto g62 = hsdp_axes(m62.all_axes(), m62, 4, "w");
    EXPECT_EQ(g62.axes.bits, m62.all_axes().bits);
    EXPECT_EQ(g62.parts, (std::vector<std::pair<int, int>>{{0, 2}}));
    // 6 = 2 x 3 of (4, 9) takes parts of both axes: 3 of b's 9, then 2 of a's 4; 4 of (6, 6)
    // 2 of each.
    const xshard::mesh_shape m49({"a", "b"}, {4, 9});
    const auto g49 = hsdp_axes(m49.all_axes(), m49, 6, "w");
    EXPECT_EQ(g49.axes.bits, m49.all_axes().bits);
    EXPECT_EQ(g49.parts, (std::vector<std::pair<int, int>>{{0, 2}, {1, 3}}));
    const xshard::mesh_shape m66({"a", "b"}, {6, 6});
    EXPECT_EQ(hsdp_axes(m66.all_axes(), m66, 4, "w").parts,
              (std::vector<std::pair<int, int>>{{0, 2}, {1, 2}}));
    EXPECT_EQ(hsdp_axes(m66.all_axes(), m66, 9, "w").parts,
              (std::vector<std::pair<int, int>>{{0, 3}, {1, 3}}));
    // Only the replicated axes count: b is not, so 4 does not divide a's 6.
    expect_error([&] { (void)hsdp_axes(xshard::axis_set{}.with(0), m66, 4, "w"); },
                 "does not divide");
    // The copies: every rank in exactly one, each copy the product of one block of every
    // part's axis (and the whole other axes), its ranks at distinct places of the copy mesh.
    for (const auto& [shape, parts] :
         std::vector<std::pair<xshard::mesh_shape, std::vector<std::pair<int, int>>>>{
             {m49, g49.parts},
             {m66, {{0, 2}, {1, 2}}},
             {xshard::mesh_shape({"a", "b", "c"}, {6, 2, 4}), {{0, 3}, {2, 2}}}}) {
        const int copies = shape.size() / [&] {
            int n = shape.size();
            for (const auto& [a, inner] : parts)
                n = n / shape.sizes[std::size_t(a)] * inner;
            return n;
        }();
        std::map<int, std::set<int>> places; // copy -> copy ranks
        for (int r = 0; r < shape.size(); ++r) {
            const auto coords = shape.coords(r);
            const auto c = xshard::detail::hsdp_copy_of(shape, coords, parts);
            ASSERT_GE(c.outer, 0);
            ASSERT_LT(c.outer, copies);
            EXPECT_TRUE(places[c.outer].insert(c.shape.rank_of(c.coords)).second) << r;
            for (std::size_t a = 0; a < shape.ndim(); ++a)
                EXPECT_LT(c.coords[a], c.shape.sizes[a]);
            // Ranks share a copy exactly when they lie in the same block of every part's axis.
            for (int q = 0; q < shape.size(); ++q) {
                const auto cq = xshard::detail::hsdp_copy_of(shape, shape.coords(q), parts);
                bool same_blocks = true;
                for (const auto& [a, inner] : parts)
                    same_blocks = same_blocks && coords[std::size_t(a)] / inner ==
                                                     shape.coords(q)[std::size_t(a)] / inner;
                EXPECT_EQ(cq.outer == c.outer, same_blocks) << r << " " << q;
            }
        }
        EXPECT_EQ(int(places.size()), copies);
        for (const auto& [o, ranks] : places)
            EXPECT_EQ(int(ranks.size()), shape.size() / copies) << o;
    }
}

// --- trajectories ---------------------------------------------------------------------------

using xshard::testing::mlp_features, xshard::testing::mlp_hidden, xshard::testing::mlp_rows;
constexpr std::size_t features = mlp_features, hidden = mlp_hidden, rows = mlp_rows;
using model_t = xshard::testing::small_mlp_type;

auto make_model(const mesh_t& m) {
    return xshard::testing::small_mlp(m);
}

/// A run's record: the losses and the final weights (gathered).
struct record {
    std::vector<double> losses, norms;
    std::vector<xt::xarray<double>> weights;
};

/// How a run synchronises and steps: level 0 (no sharding) or an hsdp configuration.
struct config {
    int level = 0;
    xshard::hsdp_options hsdp{};
    bool mean = false;
    double clip = 0; ///< clip by global norm when > 0
    /// comm_fusion of the all-gathers and reduce-scatters (the default, 4 MiB, fuses all of
    /// the test's weights; size 0 gives each weight its own planned collective).
    xshard::comm_fusion fusion{};
    std::string name = {};
    /// Run the passes through hsdp::forward/backward (overlapped reductions; level3 always).
    bool driven = false;
};

/// Batch `step` (random, the same on every mesh), rows split over dp.
auto batch(const mesh_t& m, int step, std::size_t width) {
    std::mt19937 e(unsigned(100 + step));
    const xt::xtensor<double, 2> x = xt::random::randn<double>({rows, width}, 0.0, 1.0, e);
    const xt::xtensor<std::int64_t, 1> y =
        xt::random::randint<std::int64_t>({rows}, 0, std::int64_t(width), e);
    return std::pair(
        xshard::distribute<xshard::dynamic_layout(2)>(m, x, nn::make_layout({"dp", ""})),
        xshard::distribute<xshard::dynamic_layout(1)>(m, y, nn::make_layout({"dp"})));
}

/// `steps` training steps of `model` (of `width` features in and out) from step `first` on.
template <class Opt, class Model>
void train(Model& model, Opt& opt, const config& c, xshard::hsdp<Model>* sharding, int first,
           int steps, record& r, std::size_t width = features) {
    const auto m = [&] {
        std::optional<mesh_t> mesh;
        xshard::for_each_weight(model, [&](const std::string&, auto& w) {
            if (!mesh)
                mesh.emplace(w.value.mesh());
        });
        return *mesh;
    }();
    nn::parallel_cross_entropy<double, mesh_t> loss;
    for (int s = first; s < first + steps; ++s) {
        auto [x, y] = batch(m, s, width);
        if (sharding && (c.driven || c.level == 3)) {
            r.losses.push_back(loss.forward(sharding->forward(x), y));
            sharding->backward(loss.backward());
        } else {
            r.losses.push_back(loss.forward(model.forward(x), y));
            model.backward(loss.backward());
        }
        if (sharding) {
            sharding->synchronize_gradients();
            auto g = sharding->gradients();
            r.norms.push_back(c.clip > 0 ? xshard::clip_by_global_norm(g, c.clip)
                                         : xshard::global_norm(g));
            sharding->step(opt);
        } else {
            auto g = xshard::gradients_of{model};
            xshard::synchronize_gradients(model, g, {.mean = c.mean});
            r.norms.push_back(c.clip > 0 ? xshard::clip_by_global_norm(g, c.clip)
                                         : xshard::global_norm(g));
            opt.step(model);
        }
        xshard::for_each_weight(model, [](const std::string&, auto& w) { w.zero_grad(); });
    }
}

template <class Model>
record weights_of(Model& model, record r) {
    xshard::for_each_weight(model, [&](const std::string&, auto& w) {
        r.weights.push_back(xshard::gather_all(w.value));
    });
    return r;
}

/// A run of `steps` steps of the model `make(m)` makes (of `width` features).
template <class Opt, class Make = decltype(&make_model)>
record run(const mesh_t& m, const typename Opt::options_type& o, const config& c, int steps,
           Make make = &make_model, std::size_t width = features) {
    auto model = make(m);
    using Model = decltype(model);
    Opt opt(o);
    record r;
    if (c.level == 0) {
        train(model, opt, c, static_cast<xshard::hsdp<Model>*>(nullptr), 0, steps, r, width);
    } else {
        xshard::hsdp<Model> sharding(model, c.hsdp, {.mean = c.mean, .fusion = c.fusion});
        if (m.shape().axis_size("dp") > 1 && c.hsdp.threshold == 0) {
            // Every weight is sharded.
            std::size_t weights = 0;
            xshard::for_each_weight(model, [&](const std::string&, auto&) { ++weights; });
            EXPECT_EQ(sharding.sharded_layouts().size(), weights) << where(m);
        }
        train(model, opt, c, &sharding, 0, steps, r, width);
        // The state's layouts are the sharded ones.
        const auto layouts = xshard::layouts_of(opt.state_of(model));
        for (const auto& [name, l] : sharding.sharded_layouts())
            for (const auto slot : Opt::slots)
                EXPECT_EQ(layouts.at(std::string(slot) + "." + name), l) << where(m) << name;
    }
    return weights_of(model, std::move(r));
}

void expect_same(const record& a, const record& b, const std::string& context) {
    ASSERT_EQ(a.losses.size(), b.losses.size()) << context;
    for (std::size_t i = 0; i < a.losses.size(); ++i) {
        EXPECT_NEAR(a.losses[i], b.losses[i], 1e-12) << context << " loss " << i;
        EXPECT_NEAR(a.norms[i], b.norms[i], 1e-12) << context << " norm " << i;
    }
    ASSERT_EQ(a.weights.size(), b.weights.size()) << context;
    for (std::size_t i = 0; i < a.weights.size(); ++i)
        EXPECT_TRUE(xt::allclose(a.weights[i], b.weights[i], 1e-12, 1e-12))
            << context << " weight " << i;
}

/// The meshes of the world: (W, 1), (1, W) and (2, W/2) for even W > 2.
template <class F>
void for_each_dp_tp(F&& f) {
    const auto w = world();
    std::vector<std::array<int, 2>> shapes{{w.size(), 1}};
    if (w.size() > 1)
        shapes.push_back({1, w.size()});
    if (w.size() > 2 && w.size() % 2 == 0)
        shapes.push_back({2, w.size() / 2});
    for (const auto& s : shapes)
        f(mesh_t(w, s));
}

template <class Opt>
void check_trajectories(const typename Opt::options_type& o) {
    constexpr int steps = 20;
    const mesh_t one(xshard::communicator::self(), {1, 1});
    const auto level1 = optimizer_level::level1, level2 = optimizer_level::level2,
               level3 = optimizer_level::level3;
    const xshard::fusion_threshold unfused{xshard::fusion_threshold::mode::size, 0};
    const std::vector<config> configs{
        {.level = 1, .hsdp = {.threshold = 0, .optimizer_level = level1}, .name = "level1"},
        {.level = 2, .hsdp = {.threshold = 0, .optimizer_level = level2}, .name = "level2"},
        // 1 KB: the matrices (1.5 KB) are sharded, the biases (96 and 128 bytes) are not.
        {.level = 2, .hsdp = {.threshold = 1, .optimizer_level = level2}, .name = "level2 1KB"},
        {.level = 1, .hsdp = {.threshold = 64, .optimizer_level = level1}, .name = "level1 64KB"},
        {.level = 2,
         .hsdp = {.threshold = 0, .optimizer_level = level2},
         .clip = 0.5,
         .name = "level2 clipped"},
        {.level = 2,
         .hsdp = {.threshold = 0, .optimizer_level = level2},
         .fusion = {.allgather = unfused, .reducescatter = unfused},
         .name = "level2 unfused"},
        {.level = 1,
         .hsdp = {.threshold = 0, .optimizer_level = level1},
         .fusion = {.allgather = unfused},
         .name = "level1 unfused"},
        // Overlap: the reductions started by hsdp::backward as each layer finishes.
        {.level = 1,
         .hsdp = {.threshold = 0, .optimizer_level = level1, .overlap_allreduce = true},
         .name = "level1 overlapped",
         .driven = true},
        {.level = 1,
         .hsdp = {.threshold = 0, .optimizer_level = level1},
         .name = "level1 driven",
         .driven = true},
        {.level = 2,
         .hsdp = {.threshold = 1, .optimizer_level = level2},
         .name = "level2 1KB overlapped",
         .driven = true},
        {.level = 3,
         .hsdp = {.threshold = 1, .optimizer_level = level3, .overlap_allreduce = true},
         .name = "level3 1KB overlapped all-reduce",
         .driven = true},
        // Level3: weights gathered per layer (prefetched), freed, gathered again for backward.
        {.level = 3, .hsdp = {.threshold = 0, .optimizer_level = level3}, .name = "level3"},
        {.level = 3, .hsdp = {.threshold = 1, .optimizer_level = level3}, .name = "level3 1KB"},
        {.level = 3,
         .hsdp = {.threshold = 0, .optimizer_level = level3},
         .clip = 0.5,
         .name = "level3 clipped"},
    };
    const auto serial = run<Opt>(one, o, {}, steps);
    const auto serial_clipped = run<Opt>(one, o, {.clip = 0.5}, steps);
    // Hybrid sharding over part of dp (copies of shard_size consecutive dp ranks, the state
    // on each copy's mesh): dp = 4 with 2; 6 with 2 and 3; 8 with 2 and 4; (4, 2) with 2
    // (tp whole for the bias replicated over both axes).
    {
        const auto w = world();
        std::vector<std::array<int, 2>> shapes{{w.size(), 1}};
        if (w.size() >= 8 && w.size() % 2 == 0)
            shapes.push_back({w.size() / 2, 2});
        for (const auto& shape : shapes) {
            const mesh_t m(w, shape);
            const int dp = shape[0];
            for (int k = 2; k < dp; ++k) {
                if (dp % k)
                    continue;
                for (const auto level : {level1, level2, level3})
                    for (const bool driven : {false, true}) {
                        if (driven && level == level1)
                            continue;
                        const config c{
                            .level = int(level),
                            .hsdp = {.shard_size = k, .threshold = 0, .optimizer_level = level},
                            .driven = driven};
                        expect_same(run<Opt>(m, o, c, steps), serial,
                                    std::string(Opt::name) + " " + where(m) + " shard_size " +
                                        std::to_string(k) + " " + std::string(to_string(level)) +
                                        (driven ? " driven" : ""));
                    }
            }
        }
    }
    for_each_dp_tp([&](const mesh_t& m) {
        const std::string context = std::string(Opt::name) + " " + where(m);
        expect_same(run<Opt>(m, o, {}, steps), serial, context + " level0");
        for (const auto& c : configs)
            expect_same(run<Opt>(m, o, c, steps), c.clip > 0 ? serial_clipped : serial,
                        context + " " + c.name);
        // Hybrid sharding: shard_size 2 splits each weight over a set of its replicated axes
        // of 2 ranks (dp, or tp for the row-parallel bias replicated over both on a (2, 2)
        // mesh) and keeps copies over the rest.
        if (m.shape().axis_size("dp") == 2)
            for (const auto level : {level1, level2, level3})
                expect_same(
                    run<Opt>(m, o,
                             {.level = int(level),
                              .hsdp = {.shard_size = 2, .threshold = 0, .optimizer_level = level}},
                             steps),
                    serial, context + " shard_size 2 " + std::string(to_string(level)));
        // gradients_mean: against level 0 with the mean on the same mesh.
        const auto mean0 = run<Opt>(m, o, {.mean = true}, steps);
        expect_same(
            run<Opt>(
                m, o,
                {.level = 2, .hsdp = {.threshold = 0, .optimizer_level = level2}, .mean = true},
                steps),
            mean0, context + " level2 mean");
        expect_same(run<Opt>(m, o, {.level = 1, .hsdp = {.threshold = 0}, .mean = true}, steps),
                    mean0, context + " level1 mean");
        expect_same(
            run<Opt>(
                m, o,
                {.level = 3, .hsdp = {.threshold = 0, .optimizer_level = level3}, .mean = true},
                steps),
            mean0, context + " level3 mean");
    });
}

TEST(hsdp_trajectories, sgd) {
    check_trajectories<optim::sgd>({.lr = 0.1, .weight_decay = 0.01});
}
TEST(hsdp_trajectories, momentum) {
    check_trajectories<optim::momentum>({.lr = 0.05, .nesterov = true, .weight_decay = 0.01});
}
TEST(hsdp_trajectories, adam) {
    check_trajectories<optim::adam>({.lr = 0.01, .weight_decay = 0.1});
}
TEST(hsdp_trajectories, adamw) {
    check_trajectories<optim::adamw>({.lr = 0.01});
}

TEST(hsdp_trajectories, transformer_block) {
    // 8 sequences of 3 tokens, 8 features in 4 heads: meshes whose dp divides the sequences
    // and whose tp divides the heads ((W, 1) and (2, W/2) for W = 2, 4, 8; (1, W) for W = 2, 4).
    constexpr std::size_t width = 8;
    auto make = [](const mesh_t& m) {
        return nn::transformer_block<double, mesh_t>(m, width, 5,
                                                     {.heads = 4, .sequence = 3, .hidden = 12});
    };
    const mesh_t one(xshard::communicator::self(), {1, 1});
    // Momentum: Adam would turn the rounding noise of the attention key bias's gradient
    // (zero in exact arithmetic: softmax ignores it) into steps of size lr.
    const optim::momentum_options o{.lr = 0.05};
    const auto serial = run<optim::momentum>(one, o, {}, 20, make, width);
    for_each_dp_tp([&](const mesh_t& m) {
        if (8 % m.shape().axis_size("dp") || 4 % m.shape().axis_size("tp"))
            return;
        expect_same(run<optim::momentum>(m, o, {}, 20, make, width), serial,
                    "transformer_block " + where(m) + " level0");
        for (const auto level :
             {optimizer_level::level1, optimizer_level::level2, optimizer_level::level3})
            expect_same(
                run<optim::momentum>(
                    m, o, {.level = int(level), .hsdp = {.threshold = 0, .optimizer_level = level}},
                    20, make, width),
                serial,
                "transformer_block " + where(m) + " " + std::string(xshard::to_string(level)));
        // shard_size over part of dp (dp 4: copies of 2; dp 8: of 2 and of 4) and a threshold
        // that keeps the small weights (biases, norms: under 1 KB) unsharded.
        const int dp = m.shape().axis_size("dp");
        for (int k = 2; k < dp; k *= 2)
            for (const auto level :
                 {optimizer_level::level1, optimizer_level::level2, optimizer_level::level3})
                expect_same(
                    run<optim::momentum>(
                        m, o,
                        {.level = int(level),
                         .hsdp = {.shard_size = k, .threshold = 0, .optimizer_level = level}},
                        20, make, width),
                    serial,
                    "transformer_block " + where(m) + " shard_size " + std::to_string(k) + " " +
                        std::string(xshard::to_string(level)));
        expect_same(
            run<optim::momentum>(
                m, o,
                {.level = 2, .hsdp = {.threshold = 1, .optimizer_level = optimizer_level::level2}},
                20, make, width),
            serial, "transformer_block " + where(m) + " level2 threshold 1 KB");
    });
}

TEST(hsdp_state, sharded_state_takes_a_share_of_the_bytes) {
    const auto w = world();
    const mesh_t m(w, {w.size(), 1});
    auto plain = make_model(m), sharded = make_model(m);
    optim::adam a, b;
    (void)a.state_of(plain);
    const std::size_t full = xshard::optimizer_state_bytes(plain);
    xshard::hsdp<model_t> sharding(sharded, {.threshold = 0});
    (void)b.state_of(sharded);
    const std::size_t mine = xshard::optimizer_state_bytes(sharded);
    // Summed over the ranks, the sharded bytes are the unsharded bytes of one rank.
    std::uint64_t total = mine;
    xshard::mpi::allreduce(w, std::span(&total, 1), xshard::reduction::sum);
    EXPECT_EQ(total, std::uint64_t(full)) << where(m);
    if (w.size() > 1) {
        EXPECT_LT(mine, full) << where(m);
    }
}

// --- checkpoints across levels --------------------------------------------------------------

/// Loads the checkpoint at `path` (saved after `step` steps of a run whose losses are `ra`)
/// into a model on `mm` at configuration `c`, trains it 3 steps more, and expects the losses
/// of the saving run's next 3 steps and its final weights (`reference`).
void resume_and_compare(const std::string& path, const mesh_t& mm, const config& c,
                        const optim::adam_options& o, int step, const record& reference,
                        const record& ra, const std::string& context) {
    auto b = make_model(mm);
    optim::adam opt_b(o);
    std::optional<xshard::hsdp<model_t>> sharding;
    if (c.level) {
        sharding.emplace(b, c.hsdp);
        sharding->gather_weights(); // level3: storage for the loaded values
    }
    const auto info = xshard::load_checkpoint(path, b, opt_b.state_of(b));
    EXPECT_EQ(info.step, step) << context;
    opt_b.set_steps(info.step);
    record rb;
    train(b, opt_b, c, sharding ? &*sharding : static_cast<xshard::hsdp<model_t>*>(nullptr), step,
          3, rb);
    if (sharding)
        sharding->gather_weights();
    const auto got = weights_of(b, {});
    for (std::size_t i = 0; i < got.weights.size(); ++i)
        EXPECT_TRUE(xt::allclose(got.weights[i], reference.weights[i], 1e-12, 1e-12))
            << context << " weight " << i;
    for (std::size_t i = 0; i < 3; ++i)
        EXPECT_NEAR(rb.losses[i], ra.losses[std::size_t(step) + i], 1e-12)
            << context << " loss " << i;
}

TEST(hsdp_checkpoint, saved_sharded_loads_at_any_level) {
    const auto w = world();
    const std::string dir = xshard::testing::shared_directory(w, XSHARD_TRAIN_SCRATCH);
    const std::string path = dir + "/hsdp.safetensors";
    const optim::adam_options o{.lr = 0.01};
    for (const auto saved : {optimizer_level::level1, optimizer_level::level3}) {
        const config src{.level = int(saved), .hsdp = {.threshold = 0, .optimizer_level = saved}};
        // 3 steps at the saved level on (W, 1), saved, 3 more: the reference.
        const mesh_t m(w, {w.size(), 1});
        auto a = make_model(m);
        optim::adam opt_a(o);
        record ra;
        {
            xshard::hsdp<model_t> sharding(a, src.hsdp);
            train(a, opt_a, src, &sharding, 0, 3, ra);
            sharding.gather_weights(); // level3: the values materialised to be saved
            xshard::save_checkpoint(path, a, {.step = opt_a.steps()}, opt_a.state_of(a));
            train(a, opt_a, src, &sharding, 3, 3, ra);
        }
        const auto reference = weights_of(a, {});
        for_each_dp_tp([&](const mesh_t& mm) {
            for (int level : {0, 2, 3}) {
                const std::string context = "saved at " + std::string(to_string(saved)) +
                                            ", loaded at level " + std::to_string(level) + " " +
                                            where(mm);
                const config c{.level = level,
                               .hsdp = {.threshold = 0,
                                        .optimizer_level = level == 3 ? optimizer_level::level3
                                                                      : optimizer_level::level2}};
                resume_and_compare(path, mm, c, o, 3, reference, ra, context);
            }
        });
    }
    xshard::mpi::barrier(w);
    if (w.rank() == 0)
        std::filesystem::remove_all(dir);
}

/// A state sharded over part of dp (shard_size 2 of W, each copy's state on its own mesh)
/// saves into an integrated checkpoint that loads unsharded, into another partial sharding,
/// and at level3 on half the ranks, and into a per-rank one that loads unsharded; each run
/// then continues as the one that saved.
TEST(hsdp_checkpoint, partial_axis_state_loads_anywhere) {
    const auto w = world();
    if (w.size() < 4 || w.size() % 2)
        return;
    const std::string dir = xshard::testing::shared_directory(w, XSHARD_TRAIN_SCRATCH);
    const std::string path = dir + "/hsdp_part.safetensors";
    const optim::adam_options o{.lr = 0.01};
    const mesh_t m(w, {w.size(), 1});
    const config src{.level = 1, .hsdp = {.shard_size = 2, .threshold = 0}};
    auto a = make_model(m);
    optim::adam opt_a(o);
    record ra;
    {
        xshard::hsdp<model_t> sharding(a, src.hsdp);
        // Each weight's state on the mesh of its group of 2 consecutive ranks, half its size.
        xshard::for_each_weight(a, [&](const std::string& name, auto& wt) {
            ASSERT_TRUE(wt.shard) << name;
            EXPECT_EQ(wt.shard->value.mesh().size(), 2) << name;
            EXPECT_EQ(wt.shard->value.mesh().rank(), w.rank() % 2) << name;
            std::uint64_t held = wt.shard->value.local().size();
            xshard::mpi::allreduce(wt.shard->value.mesh().comm(), std::span(&held, 1),
                                   xshard::reduction::sum);
            EXPECT_EQ(held, std::uint64_t(wt.value.size())) << name; // split over the 2
            EXPECT_LT(std::size_t(wt.shard->value.local().size()), wt.value.size()) << name;
        });
        train(a, opt_a, src, &sharding, 0, 3, ra);
        xshard::save_checkpoint(path, a, {.step = opt_a.steps()}, opt_a.state_of(a));
        xshard::save_checkpoint(
            dir + "/hsdp_part_per_rank", a,
            {.format = xshard::checkpoint_format::per_rank, .step = opt_a.steps()},
            opt_a.state_of(a));
        train(a, opt_a, src, &sharding, 3, 3, ra);
    }
    const auto reference = weights_of(a, {});
    const auto check = [&](const mesh_t& mm, const config& c, const std::string& context) {
        resume_and_compare(path, mm, c, o, 3, reference, ra, context);
    };
    check(m, {}, "unsharded " + where(m));
    resume_and_compare(dir + "/hsdp_part_per_rank", m, {}, o, 3, reference, ra,
                       "per-rank, unsharded " + where(m));
    check(m,
          {.level = 2,
           .hsdp = {.shard_size = w.size() / 2 > 2 ? w.size() / 2 : 2,
                    .threshold = 0,
                    .optimizer_level = optimizer_level::level2}},
          "partial level2 " + where(m));
    {
        const auto half = w.split(w.rank() < w.size() / 2 ? 0 : 1, w.rank());
        const mesh_t hm(half, {half.size(), 1});
        check(hm,
              {.level = 3, .hsdp = {.threshold = 0, .optimizer_level = optimizer_level::level3}},
              "level3 on half the ranks " + where(hm));
    }
    xshard::mpi::barrier(w);
    if (w.rank() == 0)
        std::filesystem::remove_all(dir);
}

TEST(hsdp_level3, weights_hold_storage_only_in_use) {
    const auto w = world();
    const mesh_t m(w, {w.size(), 1});
    auto model = make_model(m), plain = make_model(m);
    xshard::hsdp<model_t> sharding(model,
                                   {.threshold = 0, .optimizer_level = optimizer_level::level3});
    // Between uses a sharded weight's value and gradient hold nothing; its shard 1/W.
    auto sizes = [&] {
        std::vector<std::size_t> n;
        xshard::for_each_weight(model, [&](const std::string&, auto& wt) {
            n.push_back(wt.value.local().size() + wt.grad.local().size());
        });
        return n;
    };
    std::size_t shard_total = 0, full = 0;
    xshard::for_each_weight(model, [&](const std::string&, auto& wt) {
        if (w.size() > 1) {
            EXPECT_TRUE(wt.shard) << where(m);
        }
        if (wt.shard)
            shard_total += wt.shard->value.local().size();
        full += wt.value.size();
    });
    std::uint64_t total = shard_total;
    xshard::mpi::allreduce(w, std::span(&total, 1), xshard::reduction::sum);
    if (w.size() > 1) {
        EXPECT_EQ(total, std::uint64_t(full)) << where(m);
        for (auto n : sizes())
            EXPECT_EQ(n, 0U) << where(m);
    }
    nn::parallel_cross_entropy<double, mesh_t> loss;
    auto [x, y] = batch(m, 0, features);
    // The same loss as the unsharded model's: the forward pass gathered every layer.
    const double got = loss.forward(sharding.forward(x), y);
    nn::parallel_cross_entropy<double, mesh_t> loss0;
    EXPECT_NEAR(got, loss0.forward(plain.forward(x), y), 1e-12) << where(m);
    if (w.size() > 1) {
        // The first layer's weights are freed; the last layer's stay for the backward pass.
        std::vector<std::string> names;
        xshard::for_each_weight(model,
                                [&](const std::string& name, auto&) { names.push_back(name); });
        const auto n = sizes();
        for (std::size_t i = 0; i < n.size(); ++i) {
            if (names[i].starts_with("0."))
                EXPECT_EQ(n[i], 0U) << "after forward " << names[i] << " " << where(m);
            else
                EXPECT_GT(n[i], 0U) << "after forward " << names[i] << " " << where(m);
        }
    }
    sharding.backward(loss.backward());
    if (w.size() > 1) {
        for (auto n : sizes())
            EXPECT_EQ(n, 0U) << "after backward " << where(m);
    }
    sharding.synchronize_gradients();
    EXPECT_GT(sharding.timings().compute, 0.0);
    // gather_weights materialises the values: the unsharded model's.
    sharding.gather_weights();
    std::vector<xt::xarray<double>> a, b;
    xshard::for_each_weight(
        model, [&](const std::string&, auto& wt) { a.push_back(xshard::gather_all(wt.value)); });
    xshard::for_each_weight(
        plain, [&](const std::string&, auto& wt) { b.push_back(xshard::gather_all(wt.value)); });
    for (std::size_t i = 0; i < a.size(); ++i)
        EXPECT_TRUE(xt::allclose(a[i], b[i], 0, 0)) << where(m) << " weight " << i;
    // time_communication runs one step's collectives alone.
    EXPECT_GE(sharding.time_communication(), 0.0);
}

// --- misuse raises on every rank ------------------------------------------------------------

TEST(hsdp_errors, misuse_raises_on_every_rank) {
    const auto w = world();
    const mesh_t m(w, {w.size(), 1});
    auto model = make_model(m);
    expect_error([&] { xshard::hsdp<model_t> s(model, {.shard_size = 0}); },
                 "shard_size must be a positive integer or -1");
    expect_error([&] { xshard::hsdp<model_t> s(model, {.threshold = -3}); },
                 "threshold must be an integer >= 0");
    expect_error([&] { xshard::hsdp<model_t> s(model, {.optimizer_level = optimizer_level(0)}); },
                 "level1, level2, level3");
    if (w.size() > 1) {
        expect_error(
            [&] { xshard::hsdp<model_t> s(model, {.shard_size = w.size() + 1, .threshold = 0}); },
            "does not divide");
        // At level2 the gradient must be the terms or the sum: a gradient set to another
        // layout is refused on every rank.
        xshard::hsdp<model_t> s(model,
                                {.threshold = 0, .optimizer_level = optimizer_level::level2});
        xshard::for_each_weight(model, [&](const std::string&, auto& wt) {
            using D = typename std::remove_cvref_t<decltype(wt)>::tensor_type;
            if constexpr (D::rank == 2)
                wt.set_gradient(xshard::distribute<xshard::dynamic_layout(2)>(
                    m, xt::xtensor<double, 2>(xt::zeros<double>(wt.value.shape())),
                    nn::make_layout({"dp", ""})));
        });
        expect_error([&] { s.synchronize_gradients(); }, "expected its terms");
    }
    if (w.size() > 1) {
        // Level3 needs the backward pass through hsdp::backward (the full gradients are freed).
        xshard::hsdp<model_t> s(model,
                                {.threshold = 0, .optimizer_level = optimizer_level::level3});
        expect_error([&] { s.synchronize_gradients(); }, "through hsdp::backward");
    }
    // Nothing is left sharded when a construction fails.
    xshard::for_each_weight(model, [&](const std::string&, auto& wt) { EXPECT_FALSE(wt.shard); });
}

} // namespace
