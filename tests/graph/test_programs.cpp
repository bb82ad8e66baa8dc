// Programs no xshard class describes: a residual MLP with a skip connection, a shared weight
// used twice and a user's custom-VJP operation, written only as a traced function. Its
// gradients against central differences of the same network in xtensor, and its training on
// every dp x mp mesh of the world against the same program on one rank.

#include <xshard/graph.hpp>
#include <xshard/models/resnet.hpp>
#include <xshard/models/transformer.hpp>
#include <xshard/nn/blocks.hpp>
#include <xshard/nn/resnet.hpp>
#include <xshard/optim/optimizers.hpp>
#include <xshard/shard/shard.hpp>
#include <xshard/shard/vjp.hpp>
#include <xshard/tensor/distribute.hpp>
#include <xshard/tensor/gather.hpp>
#include <xshard/train/gradients.hpp>
#include <xshard/train/lay_out.hpp>

#include "expect_error.hpp"
#include "mpi_test.hpp"

#include <gtest/gtest.h>
#include <xtensor-blas/xlinalg.hpp>
#include <xtensor/xarray.hpp>
#include <xtensor/xmath.hpp>
#include <xtensor/xrandom.hpp>

#include <chrono>
#include <cmath>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <vector>

namespace {

using xshard::traced_tensor;
using xshard::testing::world;
namespace ops = xshard::ops;
using mesh_t = xshard::mesh<"dp", "mp">;
using array = xt::xarray<double>;
using tensor = xshard::dtensor<double, mesh_t, xshard::dynamic_layout(2)>;

constexpr std::size_t batch = 12, features = 6, classes = 3;

/// swish(x) = x sigmoid(x), with its hand-written derivative: the user's custom-VJP op.
tensor swish(const tensor& x) {
    tensor y = x;
    y.local() = x.local() / (1.0 + xt::exp(-x.local()));
    return y;
}
tensor swish_backward(const tensor& x, const tensor& dy) {
    tensor dx = dy;
    const auto s = 1.0 / (1.0 + xt::exp(-x.local()));
    dx.local() = dy.local() * (s + x.local() * s * (1.0 - s));
    return dx;
}

/// The network: h = relu(x W1) + x; h = swish(h); z = h W1 (W1 again); logits = z W2 + b;
/// the mean cross-entropy. On `mesh` for the custom op's kernels.
auto residual_mlp_fn(const mesh_t& mesh) {
    return [&mesh](traced_tensor x, traced_tensor y) {
            auto w1 = xshard::param("w1", {features, features}, xshard::initializer::normal(0, 0.4));
            auto h = ops::relu(ops::matmul(x, w1)) + x; // the skip connection
            h = xshard::custom_vjp<double>(mesh, "swish", h, swish, swish_backward);
            {
                xshard::name_scope s("again");
                h = ops::matmul(h, xshard::param("w1", {features, features})); // a new name
            }
            auto z = ops::matmul(h, w1); // the shared weight, used twice
            auto w2 = xshard::param("head.w2", {features, classes}, xshard::initializer::normal(0, 0.4));
            auto b = xshard::param("head.b", {classes}, xshard::initializer::uniform(-0.1, 0.1));
            return ops::mean<0>(ops::cross_entropy(ops::matmul(z, w2) + b, y));
    };
}
xshard::program residual_mlp(const mesh_t& mesh) {
    return xshard::trace(residual_mlp_fn(mesh), xshard::input<double>("x", {batch, features}),
                         xshard::input<std::int64_t>("y", {batch}));
}

/// The same network in xtensor.
double residual_mlp_loss(const std::map<std::string, array>& w, const array& x,
                         const xt::xarray<std::int64_t>& y) {
    array h = xt::maximum(xt::linalg::dot(x, w.at("w1")), 0.0) + x;
    h = h / (1.0 + xt::exp(-h));
    h = xt::linalg::dot(h, w.at("again.w1"));
    const array z = xt::linalg::dot(h, w.at("w1"));
    const array logits = xt::linalg::dot(z, w.at("head.w2")) + w.at("head.b");
    double loss = 0;
    const std::size_t rows = x.shape()[0];
    for (std::size_t i = 0; i < rows; ++i) {
        double m = -1e300, s = 0;
        for (std::size_t j = 0; j < classes; ++j)
            m = std::max(m, logits(i, j));
        for (std::size_t j = 0; j < classes; ++j)
            s += std::exp(logits(i, j) - m);
        loss += std::log(s) + m - logits(i, std::size_t(y(i)));
    }
    return loss / double(rows);
}

std::map<std::string, array> weights_of(xshard::compiled_program<double, mesh_t>& net,
                                        bool gradients) {
    std::map<std::string, array> out;
    xshard::for_each_weight(net, [&](const std::string& n, auto& w) {
        out[n] = gradients ? array(xshard::gather_all(w.grad)) : array(xshard::gather_all(w.value));
    });
    return out;
}

TEST(programs, residual_mlp_with_a_shared_weight_and_a_custom_vjp_against_central_differences) {
    std::mt19937 engine(3);
    const array x = xt::random::rand<double>({batch, features}, -1.0, 1.0, engine);
    const xt::xarray<std::int64_t> y = xt::random::randint<std::int64_t>({batch}, 0, classes, engine);
    const mesh_t mesh(world(), {1, world().size()});
    auto net = xshard::compile<double>(residual_mlp(mesh), mesh, {.seed = 4});
    const auto w = weights_of(net, false);
    ASSERT_EQ(w.size(), 4u);
    const double loss = net.train_step(xshard::distribute<xshard::dynamic_layout(2)>(mesh, xt::xtensor<double, 2>(x), "[-, -]"),
                                       xshard::distribute<xshard::dynamic_layout(1)>(mesh, xt::xtensor<std::int64_t, 1>(y), "[-]"));
    EXPECT_NEAR(loss, residual_mlp_loss(w, x, y), 1e-12);
    const auto g = weights_of(net, true);
    for (const auto& [name, value] : w) {
        for (std::size_t k = 0; k < value.size(); ++k) {
            auto up = w, down = w;
            up[name].flat(k) += 1e-6;
            down[name].flat(k) -= 1e-6;
            const double expected =
                (residual_mlp_loss(up, x, y) - residual_mlp_loss(down, x, y)) / 2e-6;
            EXPECT_NEAR(g.at(name).flat(k), expected, 1e-7) << name << "[" << k << "]";
        }
    }
}

/// Trains the residual MLP on `mesh` for a few steps; returns the losses.
std::vector<double> train(const mesh_t& mesh, xshard::compile_options options = {.seed = 4}) {
    auto net = xshard::compile<double>(residual_mlp(mesh), mesh, options);
    xshard::optim::adam optimizer({.lr = 0.05});
    std::mt19937 engine(8);
    std::vector<double> losses;
    for (int step = 0; step < 4; ++step) {
        const xt::xtensor<double, 2> x = xt::random::rand<double>({batch, features}, -1.0, 1.0, engine);
        const xt::xtensor<std::int64_t, 1> y =
            xt::random::randint<std::int64_t>({batch}, 0, classes, engine);
        // Inputs arrive split by rows over dp only: the program redistributes them.
        losses.push_back(net.train_step(xshard::distribute<xshard::dynamic_layout(2)>(mesh, x, "[dp, -]"),
                                        xshard::distribute<xshard::dynamic_layout(1)>(mesh, y, "[dp]")));
        auto grads = xshard::gradients_of(net);
        xshard::synchronize_gradients(net, grads);
        optimizer.step(net);
        xshard::for_each_weight(net, [](const std::string&, auto& w) { w.zero_grad(); });
    }
    return losses;
}

/// Calls f(mesh, dp) for every dp x mp mesh of the world.
template <class F>
void for_each_dp_mesh(F&& f) {
    const int p = world().size();
    for (int dp = 1; dp <= p; ++dp)
        if (p % dp == 0)
            f(mesh_t(world(), {dp, p / dp}), dp);
}

TEST(programs, residual_mlp_trains_on_every_mesh_like_one_rank) {
    const mesh_t one(xshard::communicator::self(), {1, 1});
    const auto reference = train(one);
    for_each_dp_mesh([&](const mesh_t& mesh, int dp) {
        const auto losses = train(mesh);
        for (std::size_t s = 0; s < losses.size(); ++s)
            EXPECT_NEAR(losses[s], reference[s], 1e-10) << "step " << s << " on dp " << dp;
    });
}

/// A program compiled from its function takes batches of any size: each new size is traced
/// and compiled once, the weights (the same objects) move to it, and every loss equals the
/// serial xtensor network's on the same weights; the gradients of the traced size equal the
/// program compiled for it alone. A function whose weights change with the shape raises.
TEST(programs, a_program_compiled_from_its_function_takes_batches_of_any_size) {
    for_each_dp_mesh([&](const mesh_t& mesh, int dp) {
        auto net = xshard::compile<double>(residual_mlp_fn(mesh), mesh, {.seed = 4},
                                           xshard::input<double>("x", {batch, features}),
                                           xshard::input<std::int64_t>("y", {batch}));
        auto plain = xshard::compile<double>(residual_mlp(mesh), mesh, {.seed = 4});
        std::vector<const void*> addresses;
        xshard::for_each_weight(net, [&](const std::string&, auto& w) { addresses.push_back(&w); });
        std::mt19937 engine(5);
        for (const std::size_t rows : {batch, std::size_t(5), batch, std::size_t(9), std::size_t(5)}) {
            const xt::xtensor<double, 2> x = xt::random::rand<double>({rows, features}, -1.0, 1.0, engine);
            const xt::xtensor<std::int64_t, 1> y =
                xt::random::randint<std::int64_t>({rows}, 0, classes, engine);
            const auto w = weights_of(net, false);
            const auto dx = xshard::distribute<xshard::dynamic_layout(2)>(mesh, x, "[dp, -]");
            const auto dy = xshard::distribute<xshard::dynamic_layout(1)>(mesh, y, "[dp]");
            EXPECT_NEAR(net.train_step(dx, dy), residual_mlp_loss(w, x, y), 1e-12)
                << rows << " rows on dp " << dp;
            EXPECT_EQ(net.input_shapes()[0], (xshard::value_shape{rows, features}));
            if (rows == batch) {
                plain.train_step(dx, dy);
                const auto expected = weights_of(plain, true);
                for (const auto& [name, g] : weights_of(net, true))
                    EXPECT_TRUE(xt::allclose(g, expected.at(name), 1e-13, 1e-13))
                        << name << " on dp " << dp;
                xshard::for_each_weight(plain, [](const std::string&, auto& v) { v.zero_grad(); });
            }
            xshard::for_each_weight(net, [](const std::string&, auto& v) { v.zero_grad(); });
        }
        EXPECT_EQ(net.other_shapes(), 2u);
        std::size_t i = 0;
        xshard::for_each_weight(net, [&](const std::string& name, auto& w) {
            EXPECT_EQ(addresses[i++], static_cast<const void*>(&w)) << name;
        });
    });
    const mesh_t mesh(world(), {world().size(), 1});
    auto grows = xshard::compile<double>(
        [](traced_tensor x) {
            return ops::mul(x, xshard::param("scale", {x.shape()[0], features}));
        },
        mesh, {}, xshard::input<double>("x", {4, features}));
    const xt::xtensor<double, 2> five = xt::ones<double>({std::size_t(5), features});
    xshard::testing::expect_error(
        [&] { grows.run(xshard::distribute<xshard::dynamic_layout(2)>(mesh, five, "[dp, -]")); },
        "the program traced for input shapes (5, 6) has other weights or weight layouts than "
        "the one for (4, 6)");
}

TEST(programs, a_profiled_step_times_every_node_and_changes_no_result) {
    std::mt19937 engine(3);
    const xt::xtensor<double, 2> x = xt::random::rand<double>({batch, features}, -1.0, 1.0, engine);
    const xt::xtensor<std::int64_t, 1> y =
        xt::random::randint<std::int64_t>({batch}, 0, classes, engine);
    for_each_dp_mesh([&](const mesh_t& mesh, int dp) {
        auto net = xshard::compile<double>(residual_mlp(mesh), mesh, {.seed = 4});
        auto plain = xshard::compile<double>(residual_mlp(mesh), mesh, {.seed = 4});
        const auto xs = xshard::distribute<xshard::dynamic_layout(2)>(mesh, x, "[dp, -]");
        const auto ys = xshard::distribute<xshard::dynamic_layout(1)>(mesh, y, "[dp]");
        EXPECT_TRUE(net.profile().nodes.empty());
        net.profile_steps();
        const auto t0 = std::chrono::steady_clock::now();
        double loss = 0, expected = 0;
        for (int s = 0; s < 3; ++s)
            loss = net.train_step(xs, ys);
        const double wall =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        for (int s = 0; s < 3; ++s)
            expected = plain.train_step(xs, ys);
        // The same loss and gradients as without profiling, and as xtensor's.
        EXPECT_EQ(loss, expected) << "dp " << dp;
        EXPECT_NEAR(loss,
                    residual_mlp_loss(weights_of(net, false), xt::xarray<double>(x),
                                      xt::xarray<std::int64_t>(y)),
                    1e-12);
        const auto g = weights_of(net, true), g_plain = weights_of(plain, true);
        for (const auto& [name, value] : g)
            EXPECT_EQ(value, g_plain.at(name)) << name << " on dp " << dp;
        // Every node timed in each pass, within the passes' wall time.
        const auto& prof = net.profile();
        EXPECT_EQ(prof.forward_passes, 3u);
        EXPECT_EQ(prof.backward_passes, 3u);
        ASSERT_EQ(prof.nodes.size(), net.source().nodes().size());
        double backward = 0;
        for (std::size_t k = 0; k < prof.nodes.size(); ++k) {
            EXPECT_EQ(prof.nodes[k].node, net.source().nodes()[k].name);
            EXPECT_EQ(prof.nodes[k].op, net.source().nodes()[k].op);
            EXPECT_GT(prof.nodes[k].forward, 0) << prof.nodes[k].node;
            backward += prof.nodes[k].backward;
        }
        EXPECT_GT(backward, 0);
        EXPECT_LE(prof.seconds(), wall);
        double by_op = 0;
        for (const auto& o : prof.by_op())
            by_op += o.seconds();
        EXPECT_NEAR(by_op, prof.seconds(), 1e-12);
        const auto text = prof.report(2);
        EXPECT_NE(text.find("summed per primitive"), std::string::npos) << text;
        EXPECT_NE(text.find("swish"), std::string::npos) << text;
        // Stopped, it counts nothing more; started again, it starts from zero.
        net.profile_steps(false);
        (void)net.train_step(xs, ys);
        EXPECT_EQ(net.profile().forward_passes, 3u);
        net.profile_steps();
        EXPECT_EQ(net.profile().forward_passes, 0u);
        EXPECT_EQ(net.profile().seconds(), 0.0);
    });
}

TEST(programs, weights_kept_sharded_train_on_every_mesh_like_one_rank) {
    const mesh_t one(xshard::communicator::self(), {1, 1});
    const auto reference = train(one);
    for_each_dp_mesh([&](const mesh_t& mesh, int dp) {
        xshard::compile_options sharded{.seed = 4, .layouts = {.weight_shard_axes = {"dp"}}};
        // Each weight keeps 1/dp of itself (the uneven ones at most a block more).
        auto net = xshard::compile<double>(residual_mlp(mesh), mesh, sharded);
        xshard::for_each_weight(net, [&](const std::string& name, auto& w) {
            EXPECT_EQ(w.value.layout().split_axes(mesh.shape()).contains(0), dp > 1)
                << name << " laid out " << w.value.layout().to_string() << " on dp " << dp;
        });
        if (dp > 1) {
            EXPECT_NE(net.describe().find("forward redistribution of w1"), std::string::npos);
        }
        for (const auto& recompute :
             {std::vector<std::string>{}, std::vector<std::string>{"again"}}) {
            sharded.recompute = recompute;
            const auto losses = train(mesh, sharded);
            for (std::size_t s = 0; s < losses.size(); ++s)
                EXPECT_NEAR(losses[s], reference[s], 1e-10)
                    << "step " << s << " on dp " << dp << (recompute.empty() ? "" : ", recomputed");
        }
    });
    xshard::testing::expect_error(
        [&] {
            xshard::compile<double>(residual_mlp(one), one,
                                    {.layouts = {.weight_shard_axes = {"fsdp"}}});
        },
        "weight_shard_axes names 'fsdp', which is not an axis of mesh");
}

TEST(programs, planned_weight_layouts_are_kept_and_train_on_every_mesh_like_one_rank) {
    // MindSpore's parameter_plan: each planned weight is kept in its layout and read so by the
    // nodes without an annotation (the shared w1 at both uses), their rules deriving the rest.
    const mesh_t one(xshard::communicator::self(), {1, 1});
    const auto reference = train(one);
    const std::map<std::string, xshard::layout> plan{{"w1", xshard::layout("[-, mp]")},
                                                     {"head.w2", xshard::layout("[mp, -]")},
                                                     {"head.b", xshard::layout("[mp]")}};
    const xshard::compile_options planned{
        .seed = 4, .layouts = {.dataset_axes = {"dp"}, .weight_layouts = plan}};
    for_each_dp_mesh([&](const mesh_t& mesh, int dp) {
        auto net = xshard::compile<double>(residual_mlp(mesh), mesh, planned);
        std::size_t seen = 0;
        xshard::for_each_weight(net, [&](const std::string& name, auto& w) {
            if (const auto it = plan.find(name); it != plan.end()) {
                EXPECT_EQ(w.value.layout(), it->second) << name << " on dp " << dp;
                ++seen;
            }
        });
        EXPECT_EQ(seen, plan.size());
        const auto losses = train(mesh, planned);
        for (std::size_t s = 0; s < losses.size(); ++s)
            EXPECT_NEAR(losses[s], reference[s], 1e-10) << "step " << s << " on dp " << dp;
    });
    // A name that is not a weight, a layout of another rank.
    struct misuse {
        const char *name, *layout, *message;
    };
    for (const misuse& m :
         {misuse{"w3", "[-, -]", "weight_layouts names 'w3', which is not a weight of the program"},
          misuse{"w1", "[-]", "xshard: compile: weight w1"}})
        xshard::testing::expect_error(
            [&] {
                xshard::compile<double>(
                    residual_mlp(one), one,
                    {.layouts = {.weight_layouts = {{m.name, xshard::layout(m.layout)}}}});
            },
            m.message);
}

TEST(programs, a_compiled_program_lays_its_weights_out_in_place_keeping_their_values) {
    // lay_out_parameters on a compiled program (a parameter plan of shard(), a strategy
    // file): compiled again with the planned layouts, each weight keeping its value; a step
    // then gives the loss and gradients of the program as it was.
    std::mt19937 engine(5);
    const xt::xtensor<double, 2> x = xt::random::rand<double>({batch, features}, -1.0, 1.0, engine);
    const xt::xtensor<std::int64_t, 1> y =
        xt::random::randint<std::int64_t>({batch}, 0, classes, engine);
    for_each_dp_mesh([&](const mesh_t& mesh, int dp) {
        const xshard::compile_options o{.seed = 4, .layouts = {.dataset_axes = {"dp"}}};
        auto net = xshard::compile<double>(residual_mlp(mesh), mesh, o);
        auto plain = xshard::compile<double>(residual_mlp(mesh), mesh, o);
        auto step = [&](auto& n) {
            return n.train_step(xshard::distribute<xshard::dynamic_layout(2)>(mesh, x, "[-, -]"),
                                xshard::distribute<xshard::dynamic_layout(1)>(mesh, y, "[-]"));
        };
        (void)step(net); // a step before: the arena and gradients in use
        xshard::for_each_weight(net, [](const std::string&, auto& w) { w.zero_grad(); });
        const auto before = weights_of(net, false);
        const std::map<std::string, xshard::layout> plan{{"w1", xshard::layout("[-, mp]")},
                                                         {"again.w1", xshard::layout("[mp, -]")}};
        xshard::lay_out_parameters(net, plan);
        xshard::for_each_weight(net, [&](const std::string& name, auto& w) {
            if (const auto it = plan.find(name); it != plan.end()) {
                EXPECT_EQ(w.value.layout(), it->second) << name << " on dp " << dp;
            }
        });
        EXPECT_EQ(weights_of(net, false), before) << "dp " << dp;
        EXPECT_NEAR(step(net), step(plain), 1e-12) << "dp " << dp;
        const auto g = weights_of(net, true), expected = weights_of(plain, true);
        for (const auto& [name, value] : expected)
            EXPECT_TRUE(xt::allclose(g.at(name), value, 1e-12, 1e-12)) << name << " on dp " << dp;
        xshard::testing::expect_error(
            [&] {
                xshard::lay_out_parameters(net, {{"w9", xshard::layout("[-, -]")}});
            },
            "weight_layouts names 'w9', which is not a weight of the program");
    });
}

// --- the transformer block, traced against nn::transformer_block --------------------------------

using tp_mesh = xshard::mesh<"dp", "tp">;

/// The weights of `c` by name, gathered.
template <class C>
std::map<std::string, array> gathered(C& c, bool gradients) {
    std::map<std::string, array> out;
    xshard::for_each_weight(c, [&](const std::string& n, auto& w) {
        out[n] = gradients ? array(xshard::gather_all(w.grad)) : array(xshard::gather_all(w.value));
    });
    return out;
}

/// Calls f(mesh, dp, tp) for every dp x tp mesh of the world on which `sequences` split over
/// dp and `heads` over tp; returns how many there were.
template <class F>
int for_each_block_mesh(std::size_t sequences, std::size_t heads, F&& f) {
    const int p = world().size();
    int meshes = 0;
    for (int dp = 1; dp <= p; ++dp) {
        const int tp = p / dp;
        if (p % dp != 0 || sequences % std::size_t(dp) != 0 || heads % std::size_t(tp) != 0)
            continue;
        ++meshes;
        f(tp_mesh(world(), {dp, tp}), dp, tp);
    }
    return meshes;
}

/// `blocks` transformer blocks on x [tokens, features] with Megatron's strategies over tp
/// (data parallel over dp), then the sum of their output times r [tokens, features]. One
/// block takes the layers' weight names; of several, each is the scope "block<b>".
xshard::program blocks_against_r(std::size_t blocks, std::size_t features, std::size_t heads,
                                 std::size_t sequence, std::size_t hidden, std::size_t tokens) {
    const xshard::models::transformer_options o{.features = features,
                                                .heads = heads,
                                                .sequence = sequence,
                                                .hidden = hidden,
                                                .tensor_axis = "tp",
                                                .data_axis = "dp"};
    return xshard::trace(
        [&](traced_tensor in, traced_tensor rr) {
            for (std::size_t b = 0; b < blocks; ++b) {
                std::optional<xshard::name_scope> scope;
                if (blocks > 1)
                    scope.emplace("block" + std::to_string(b));
                in = xshard::models::transformer_block(in, o);
            }
            return ops::sum_all(ops::mul(in, rr));
        },
        xshard::input<double>("x", {tokens, o.features}),
        xshard::input<double>("r", {tokens, o.features}));
}

TEST(programs, traced_transformer_block_equals_the_hand_written_layers_on_every_mesh) {
    constexpr std::size_t f = 8, heads = 2, sequence = 4, sequences = 4, hidden = 16;
    constexpr std::size_t tokens = sequence * sequences;
    std::mt19937 engine(12);
    const xt::xtensor<double, 2> x = xt::random::randn<double>({tokens, f}, 0.0, 1.0, engine);
    const xt::xtensor<double, 2> r = xt::random::randn<double>({tokens, f}, 0.0, 1.0, engine);
    const int meshes =
        for_each_block_mesh(sequences, heads, [&](const tp_mesh& mesh, int dp, int tp) {
            const auto layout_x = xshard::layout("[dp, -]");
            // The hand-written block.
            xshard::nn::transformer_block<double, tp_mesh> block(
                mesh, f, 21,
                {.axes = {.tensor = "tp"}, .heads = heads, .sequence = sequence, .hidden = hidden});
            const auto dx = xshard::distribute<xshard::dynamic_layout(2)>(mesh, x, layout_x);
            const auto y = block.forward(dx);
            const double expected_loss = double(xt::sum(xshard::gather_all(y) * r)());
            block.backward(xshard::nn::as_gradient(
                xshard::distribute<xshard::dynamic_layout(2)>(mesh, r, y.layout())));
            const auto expected_grads = gathered(block, true);

            // The traced block, Megatron's strategies, the weights copied by name.
            const auto prog = blocks_against_r(1, f, heads, sequence, hidden, tokens);
            auto net = xshard::compile<double>(prog, mesh, {.layouts = {.dataset_axes = {"dp"}}});
            const auto values = gathered(block, false);
            ASSERT_EQ(values.size(), gathered(net, false).size());
            xshard::for_each_weight(net, [&](const std::string& n, auto& w) {
                using D = std::remove_cvref_t<decltype(w.value)>;
                xt::xtensor<double, D::rank> g = values.at(n);
                w.value.local() =
                    xshard::distribute<xshard::dynamic_layout(D::rank)>(mesh, g, w.value.layout())
                        .local();
            });
            const double loss = net.train_step(
                dx, xshard::distribute<xshard::dynamic_layout(2)>(mesh, r, layout_x));
            EXPECT_NEAR(loss, expected_loss, 1e-10) << "mesh dp " << dp << " tp " << tp << "\n"
                                                    << net.describe();
            const auto grads = gathered(net, true);
            for (const auto& [name, g] : expected_grads) {
                EXPECT_LT(double(xt::amax(xt::abs(grads.at(name) - g))()), 1e-10)
                    << name << " on dp " << dp << " tp " << tp;
            }
            if (dp == 1 && tp == 2 && world().rank() == 0)
                std::printf("%s", net.report().c_str());
        });
    const int p = world().size();
    if (p == 1 || p == 2 || p == 4) {
        EXPECT_GT(meshes, 0);
    }
}

// --- recomputed scopes (activation checkpointing) ----------------------------------------------

TEST(programs, recomputed_scopes_give_the_same_gradients_in_a_smaller_arena) {
    constexpr std::size_t f = 8, heads = 2, sequence = 4, sequences = 4, hidden = 32, blocks = 3;
    constexpr std::size_t tokens = sequence * sequences;
    std::mt19937 engine(13);
    const xt::xtensor<double, 2> x = xt::random::randn<double>({tokens, f}, 0.0, 1.0, engine);
    const xt::xtensor<double, 2> r = xt::random::randn<double>({tokens, f}, 0.0, 1.0, engine);
    const auto prog = blocks_against_r(blocks, f, heads, sequence, hidden, tokens);
    const int meshes =
        for_each_block_mesh(sequences, heads, [&](const tp_mesh& mesh, int dp, int tp) {
            const auto dx = xshard::distribute<xshard::dynamic_layout(2)>(mesh, x, "[dp, -]");
            const auto dr = xshard::distribute<xshard::dynamic_layout(2)>(mesh, r, "[dp, -]");
            const xshard::layout_options lay{.dataset_axes = {"dp"}};
            auto plain = xshard::compile<double>(prog, mesh, {.seed = 2, .layouts = lay});
            auto again = xshard::compile<double>(
                prog, mesh,
                {.seed = 2, .layouts = lay, .recompute = {"block0", "block1", "block2"}});
            // The weights kept sharded over dp, gathered per use (and again for the VJPs).
            auto sharded_lay = lay;
            sharded_lay.weight_shard_axes = {"dp"};
            auto sharded = xshard::compile<double>(prog, mesh, {.seed = 2, .layouts = sharded_lay});
            // Two steps: the second runs over an arena the first left dirty.
            for (int step = 0; step < 2; ++step) {
                const double a = plain.train_step(dx, dr), b = again.train_step(dx, dr);
                EXPECT_EQ(a, b) << "step " << step << " on dp " << dp << " tp " << tp;
                EXPECT_NEAR(sharded.train_step(dx, dr), a, 1e-12 * std::abs(a));
            }
            const auto g = gathered(plain, true), h = gathered(again, true),
                       k = gathered(sharded, true);
            ASSERT_EQ(g.size(), h.size());
            for (const auto& [name, v] : g) {
                EXPECT_LT(double(xt::amax(xt::abs(h.at(name) - v))()), 1e-13)
                    << name << " on dp " << dp << " tp " << tp;
                EXPECT_LT(double(xt::amax(xt::abs(k.at(name) - v))()), 1e-12)
                    << name << " on dp " << dp << " tp " << tp << ", weights sharded";
            }
            EXPECT_LT(again.arena_bytes(), plain.arena_bytes()) << "dp " << dp << " tp " << tp;
            // A gathered weight lives around its uses: were the gathers kept from the forward
            // pass to the VJPs, every weight would be whole in the arena at the turn.
            std::size_t weights = 0;
            xshard::for_each_weight(plain, [&](const std::string&, auto& w) {
                weights += w.value.local().size() * sizeof(double);
            });
            if (dp > 1) {
                EXPECT_LT(sharded.arena_bytes(), plain.arena_bytes() + weights / 2)
                    << "dp " << dp << " tp " << tp;
            }
            EXPECT_NE(again.report().find("recomputed in the backward pass"), std::string::npos);
            EXPECT_EQ(plain.report().find("recomputed in the backward pass"), std::string::npos);
            if (dp == 1 && world().rank() == 0)
                std::printf("3 blocks on tp %d: arena %zu bytes, recomputed %zu\n", tp,
                            plain.arena_bytes(), again.arena_bytes());
        });
    const int p = world().size();
    if (p == 1 || p == 2 || p == 4) {
        EXPECT_GT(meshes, 0);
    }
}

TEST(programs, recomputed_custom_nodes_shared_weights_and_runs_give_the_same_gradients) {
    std::mt19937 engine(14);
    const xt::xtensor<double, 2> x = xt::random::rand<double>({batch, features}, -1.0, 1.0, engine);
    const xt::xtensor<std::int64_t, 1> y =
        xt::random::randint<std::int64_t>({batch}, 0, classes, engine);
    const int p = world().size();
    for (const int dp : {1, p}) {
        const mesh_t mesh(world(), {dp, p / dp});
        const auto dx = xshard::distribute<xshard::dynamic_layout(2)>(mesh, x, "[dp, -]");
        const auto dy = xshard::distribute<xshard::dynamic_layout(1)>(mesh, y, "[dp]");
        auto plain = xshard::compile<double>(residual_mlp(mesh), mesh, {.seed = 4});
        const double loss = plain.train_step(dx, dy);
        const auto g = weights_of(plain, true);
        // The custom node and the scope reading the shared weight; then one run from the relu
        // through the scope "again" (the skip's add, the custom node, again.matmul) and a run
        // of one node.
        for (const auto& recompute : std::vector<std::vector<std::string>>{
                 {"swish", "again"}, {"relu..again", "add_1..add_1"}}) {
            auto again = xshard::compile<double>(residual_mlp(mesh), mesh,
                                                 {.seed = 4, .recompute = recompute});
            EXPECT_NE(again.report().find("recomputed in the backward pass"), std::string::npos);
            EXPECT_EQ(loss, again.train_step(dx, dy));
            const auto h = weights_of(again, true);
            for (const auto& [name, v] : g)
                EXPECT_LT(double(xt::amax(xt::abs(h.at(name) - v))()), 1e-14)
                    << name << " on dp " << dp << ", recomputing " << recompute.front();
        }
    }
}

TEST(programs, a_recomputed_scope_that_names_no_node_raises) {
    const mesh_t mesh(world(), {world().size(), 1});
    for (const std::string scope : {"nowhere", "agai", "again.matmul.x"})
        xshard::testing::expect_error(
            [&] { xshard::compile<double>(residual_mlp(mesh), mesh, {.recompute = {scope}}); },
            "recompute names the scope '" + scope + "', which holds no node");
    const std::vector<std::pair<std::string, std::string>> runs = {
        {"nowhere..again", "'nowhere' holds no node"},
        {"relu..nowhere", "'nowhere' holds no node"},
        {"again..relu", "'relu' ends before 'again' begins"}};
    for (const auto& [run, why] : runs)
        xshard::testing::expect_error(
            [&] { xshard::compile<double>(residual_mlp(mesh), mesh, {.recompute = {run}}); },
            "recompute names the run '" + run + "', but " + why);
    xshard::testing::expect_error(
        [&] {
            xshard::compile<double>(residual_mlp(mesh), mesh, {.recompute = {"relu..again", "swish"}});
        },
        "recompute names the scope 'swish', whose nodes all lie in a run it also names");
}

// --- shard() with a backward pass -------------------------------------------------------------

TEST(programs, shard_vjp_gives_the_cotangents_of_the_inputs_on_every_mesh) {
    std::mt19937 engine(6);
    const xt::xtensor<double, 2> x = xt::random::randn<double>({8, 6}, 0.0, 1.0, engine);
    const xt::xtensor<double, 2> w = xt::random::randn<double>({6, 4}, 0.0, 1.0, engine);
    const xt::xtensor<double, 2> r = xt::random::randn<double>({8, 4}, 0.0, 1.0, engine);
    const xt::xtensor<double, 2> z = xt::linalg::dot(x, w);
    const xt::xtensor<double, 2> g = xt::where(z > 0.0, r, 0.0);
    const xt::xtensor<double, 2> y_expected = xt::maximum(z, 0.0);
    const xt::xtensor<double, 2> dx_expected = xt::linalg::dot(g, xt::transpose(w));
    const xt::xtensor<double, 2> dw_expected = xt::linalg::dot(xt::transpose(x), g);
    const int p = world().size();
    for (int dp = 1; dp <= p; ++dp) {
        if (p % dp != 0)
            continue;
        const mesh_t mesh(world(), {dp, p / dp});
        auto f = xshard::shard(
            mesh, [](const auto& a, const auto& b) { return ops::relu(ops::matmul(a, b)); },
            std::tuple(xshard::layout("[dp, mp]"), xshard::layout("[mp, -]")), xshard::layout("[dp, -]"));
        const auto dx = xshard::distribute<xshard::dynamic_layout(2)>(mesh, x, "[-, -]");
        const auto dw = xshard::distribute<xshard::dynamic_layout(2)>(mesh, w, "[-, -]");
        auto [y, pullback] = xshard::vjp(f, dx, dw);
        EXPECT_EQ(y.layout(), xshard::layout("[dp, -]"));
        EXPECT_LT(double(xt::amax(xt::abs(xshard::gather_all(y) - y_expected))()), 1e-12);
        const auto [gx, gw] = pullback(xshard::distribute<xshard::dynamic_layout(2)>(mesh, r, "[-, -]"));
        EXPECT_LT(double(xt::amax(xt::abs(xshard::gather_all(gx) - dx_expected))()), 1e-12)
            << "dp " << dp;
        EXPECT_LT(double(xt::amax(xt::abs(xshard::gather_all(gw) - dw_expected))()), 1e-12)
            << "dp " << dp;
    }
}

// --- ResNet-18, traced against nn::resnet18 -------------------------------------------------------

TEST(programs, traced_resnet18_equals_the_hand_written_layers_data_parallel) {
    constexpr std::size_t images = 4, side = 16, classes = 5;
    const int p = world().size();
    if (p > 4 || images % std::size_t(p) != 0)
        GTEST_SKIP() << "4 images split over " << p << " ranks";
    using dp_mesh = xshard::mesh<"dp", "mp">;
    const dp_mesh mesh(world(), {p, 1});
    std::mt19937 engine(4);
    const xt::xtensor<double, 4> x = xt::random::randn<double>({images, std::size_t(3), side, side}, 0.0, 1.0, engine);
    const xt::xtensor<double, 2> r = xt::random::randn<double>({images, classes}, 0.0, 1.0, engine);
    auto hand = xshard::nn::resnet18<double>(mesh, classes, {.blocks = {.sync_bn = true}});
    const auto dx = xshard::distribute<xshard::dynamic_layout(4)>(mesh, x, "[dp, -, -, -]");
    const auto logits = hand.forward(dx);
    const double expected_loss = double(xt::sum(xshard::gather_all(logits) * r)());
    hand.backward(xshard::nn::as_gradient(
        xshard::distribute<xshard::dynamic_layout(2)>(mesh, r, logits.layout())));
    const auto expected = gathered(hand, true);
    const auto values = gathered(hand, false);

    auto prog = xshard::trace(
        [&](traced_tensor in, traced_tensor rr) {
            return ops::sum_all(ops::mul(xshard::models::resnet(in, xshard::models::resnet18_depths, classes), rr));
        },
        xshard::input<double>("x", {images, 3, side, side}), xshard::input<double>("r", {images, classes}));
    auto net = xshard::compile<double>(prog, mesh);
    std::size_t copied = 0;
    xshard::for_each_weight(net, [&](const std::string& n, auto& w) {
        using D = std::remove_cvref_t<decltype(w.value)>;
        xt::xtensor<double, D::rank> g = values.at(n);
        w.value.local() = xshard::distribute<xshard::dynamic_layout(D::rank)>(mesh, g, w.value.layout()).local();
        ++copied;
    });
    EXPECT_EQ(copied, 62u); // 20 convolutions and their batch norms' gamma and beta, fc
    const double loss = net.train_step(dx, xshard::distribute<xshard::dynamic_layout(2)>(mesh, r, "[dp, -]"));
    EXPECT_NEAR(loss, expected_loss, 1e-9 * std::abs(expected_loss));
    const auto grads = gathered(net, true);
    for (const auto& [name, g] : grads) {
        const double scale = std::max(1.0, double(xt::amax(xt::abs(expected.at(name)))()));
        EXPECT_LT(double(xt::amax(xt::abs(g - expected.at(name)))()), 1e-9 * scale) << name;
    }
}

} // namespace
