// Pipelines of programs: a traced network cut into its modules (graph/split.hpp) and run as a
// chain of layers (graph/program_chain.hpp) through the pipeline runtime. For every mesh
// pp x dp x tp of the world (pp up to 4) and every schedule, one step's loss and every
// gradient, and the pipelined inference's output, equal the whole program's on one rank
// (1e-12), with residuals and the input crossing the cuts, and with custom-VJP nodes (a user's
// function, a layer of xshard::nn) in the modules. A compiled program's copies hold their own
// activations, and their own copies of the custom nodes' layers. Several tensors at a cut are
// packed into one. Cuts that do not fit raise one sentence naming what crosses them.

#include <xshard/graph.hpp>
#include <xshard/nn/embedding.hpp>
#include <xshard/nn/linear.hpp>
#include <xshard/pipeline/pipeline.hpp>
#include <xshard/tensor/distribute.hpp>
#include <xshard/tensor/gather.hpp>

#include "expect_error.hpp"
#include "labelled_batch.hpp"
#include "mpi_test.hpp"

#include <gtest/gtest.h>
#include <xtensor/xrandom.hpp>

#include <array>
#include <map>
#include <random>
#include <string>
#include <vector>

namespace {
namespace chain_case { // apart from the other files of this unity build

using xshard::traced_tensor;
using xshard::testing::expect_error;
using xshard::testing::world;
namespace ops = xshard::ops;
namespace pp = xshard::pipeline;
using stage_mesh_t = xshard::mesh<"dp", "tp">;
using full_mesh_t = xshard::mesh<"pp", "dp", "tp">;
using chain_t = xshard::program_chain<double, stage_mesh_t>;
using X = chain_t::tensor_type;
constexpr std::size_t features = 6, hidden = 8, classes = 5;

/// Five modules: fc0 (matmul, bias, relu), block1 (a skip connection inside its scope), fc2
/// (its matmul split over tp by its annotation when tp > 1), a gelu outside every scope, and
/// head. With `residual`, tensors cross cuts besides the one each module passes on: fc2 also
/// passes on its result as [rows, 2, hidden / 2], and head adds fc0's result and that, and
/// reads the program's input again, so fc0's result and the input cross every later cut.
auto network_fn(int tp, bool residual = false) {
    return [tp, residual](traced_tensor x) {
        const auto in = x;
        const std::size_t rows = x.shape()[0];
        traced_tensor a = x, folded = x;
        {
            xshard::name_scope s("fc0");
            auto w =
                xshard::param("weight", {features, hidden}, xshard::initializer::normal(0, 0.4));
            auto b = xshard::param("bias", {hidden}, xshard::initializer::uniform(-0.1, 0.1));
            x = a = ops::relu(ops::matmul(x, w) + b);
        }
        {
            xshard::name_scope s("block1");
            auto w = xshard::param("weight", {hidden, hidden}, xshard::initializer::normal(0, 0.4));
            x = x + ops::relu(ops::matmul(x, w));
        }
        {
            xshard::name_scope s("fc2");
            auto w = xshard::param("weight", {hidden, hidden}, xshard::initializer::normal(0, 0.4));
            x = tp > 1 ? ops::matmul.shard({{1, 1}, {1, tp}})(x, w) : ops::matmul(x, w);
            if (residual)
                folded = ops::reshape(x, std::array<std::size_t, 3>{rows, 2, hidden / 2});
        }
        x = ops::gelu(x);
        xshard::name_scope s("head");
        if (residual) {
            x = x + a + ops::reshape(folded, std::array<std::size_t, 2>{rows, hidden});
            x = x + ops::matmul(in, xshard::param("skip", {features, hidden},
                                                  xshard::initializer::normal(0, 0.4)));
        }
        return ops::matmul(
            x, xshard::param("weight", {hidden, classes}, xshard::initializer::normal(0, 0.4)));
    };
}
xshard::program network(std::size_t rows, int tp, bool residual = false) {
    return xshard::trace(network_fn(tp, residual), xshard::input<double>("x", {rows, features}));
}

using batch = xshard::testing::labelled_batch;

batch make_batch(std::size_t rows, unsigned seed) {
    return xshard::testing::random_labelled_batch(rows, features, classes, seed);
}

/// The whole program on one rank: the loss of the batch, every gradient by name and the
/// output.
struct reference {
    double loss;
    std::map<std::string, xt::xarray<double>> grads;
    xt::xarray<double> output;
};
reference one_rank(const batch& b, bool residual) {
    const stage_mesh_t one(xshard::communicator::self(), {1, 1});
    auto net = xshard::compile<double>(network(b.x.shape()[0], 1, residual), one, {.seed = 7});
    xshard::nn::parallel_cross_entropy<double, stage_mesh_t> loss;
    const auto out = net.forward(xshard::distribute<xshard::dynamic_layout(2)>(one, b.x, "[-, -]"));
    const double value =
        loss.forward(out, xshard::distribute<xshard::dynamic_layout(1)>(one, b.y, "[-]"));
    net.backward(loss.backward());
    std::map<std::string, xt::xarray<double>> grads;
    xshard::for_each_weight(net, [&](const std::string& name, auto& w) {
        grads[name] = xshard::gather_all(xshard::ops::resolve(w.grad));
    });
    return {value, grads, xshard::gather_all(out)};
}

/// Calls f(mesh, p, dp, tp) for every mesh pp x dp x tp of the world with pp from 1 to 4 and
/// tp 1 or 2.
template <class F>
void for_each_pipeline_mesh(F&& f) {
    const int n = world().size();
    for (int p = 1; p <= 4; ++p)
        for (int tp = 1; tp <= 2; ++tp)
            if (n % (p * tp) == 0)
                f(full_mesh_t({p, n / (p * tp), tp}), p, n / (p * tp), tp);
}

/// Every gradient of this stage's weights `params` equals `expected`'s of its name (1e-12),
/// and the stages together check every name of `expected`.
template <class Params>
void expect_stage_gradients(Params&& params,
                            const std::map<std::string, xt::xarray<double>>& expected,
                            const full_mesh_t& mesh, const std::string& where) {
    int checked = 0;
    xshard::for_each_weight(params, [&](const std::string& name, auto& w) {
        const xt::xarray<double> g = xshard::gather_all(xshard::ops::resolve(w.grad));
        ASSERT_TRUE(expected.count(name)) << name << ", " << where;
        EXPECT_TRUE(xt::allclose(g, expected.at(name), 1e-12, 1e-12)) << name << ", " << where;
        ++checked;
    });
    xshard::mpi::allreduce(mesh.sub<"pp">(), std::span(&checked, 1), xshard::reduction::sum);
    EXPECT_EQ(checked, int(expected.size())) << where;
}

TEST(program_chain, a_pipelined_program_equals_the_whole_program_on_one_rank) {
    for_each_pipeline_mesh(
        [](const full_mesh_t& mesh, int p, int dp, int tp) {
            const auto stage_mesh = pp::stage_mesh_of<stage_mesh_t>(mesh);
            const int m = 2 * p; // a multiple of p, for the interleaved schedule
            // Uneven blocks and micro-batches: the chain, made from the function, traces
            // each micro-batch's shape once.
            const std::size_t micro_rows = std::size_t(2 * dp * tp + 1);
            const auto b = make_batch(micro_rows * std::size_t(m), 11);
            // Tensors besides the one each module passes on cross the cuts.
            const auto [expected_loss, expected, expected_output] = one_rank(b, true);
            const auto x =
                xshard::distribute<xshard::dynamic_layout(2)>(stage_mesh, b.x, "[dp, -]");
            const auto y = xshard::distribute<xshard::dynamic_layout(1)>(stage_mesh, b.y, "[dp]");
            std::vector<std::pair<pp::schedule_kind, int>> runs{
                {pp::schedule_kind::gpipe, 1},
                {pp::schedule_kind::one_f_one_b, 1},
                {pp::schedule_kind::zero_bubble, 1}};
            if (2 * p <= 5)
                runs.emplace_back(pp::schedule_kind::interleaved, 2);
            for (const auto& [kind, v] : runs) {
                const std::string where = "mesh pp=" + std::to_string(p) +
                                          " dp=" + std::to_string(dp) +
                                          " tp=" + std::to_string(tp) + ", " +
                                          std::string(pp::name(kind)) + " v=" + std::to_string(v);
                chain_t chain(network_fn(tp, true), stage_mesh, {.seed = 7},
                              xshard::input<double>("x", {micro_rows, features}));
                ASSERT_EQ(chain.layers().size(), 5u);
                xshard::nn::parallel_cross_entropy<double, stage_mesh_t> loss;
                pp::pipeline<chain_t, X> pipe(mesh, "pp", stage_mesh, chain,
                                              {.micro_batches = m,
                                               .scheduler = kind,
                                               .virtual_stages = v,
                                               .output_broadcast = true});
                const double value = pipe.step(x, y, loss);
                pipe.synchronize_gradients();
                EXPECT_NEAR(value, expected_loss, 1e-12) << where;
                expect_stage_gradients(pipe.local_parameters(), expected, mesh, where);
                // Pipelined inference: the last stage's output, broadcast to every stage.
                const auto predicted = pipe.predict(x);
                ASSERT_TRUE(predicted.has_value()) << where;
                EXPECT_TRUE(
                    xt::allclose(xshard::gather_all(*predicted), expected_output, 1e-12, 1e-12))
                    << where;
            }
        });
}

/// Every weight's gradient, by name, whole.
template <class Model>
std::map<std::string, xt::xarray<double>> gradients_of(Model& model) {
    std::map<std::string, xt::xarray<double>> grads;
    xshard::for_each_weight(model, [&](const std::string& name, auto& w) {
        grads[name] = xshard::gather_all(xshard::ops::resolve(w.grad));
    });
    return grads;
}

/// A copy of `net` runs batch x2 between `net`'s forward and backward passes of x1 (each
/// seeded with its output): `net`'s input cotangent and gradients are still those of x1
/// alone, its activations (and its custom nodes' layers') its own. Returns the copy.
xshard::compiled_program<double, stage_mesh_t>
expect_a_copy_keeps_its_own_activations(xshard::compiled_program<double, stage_mesh_t>& net,
                                        const X& x1, const X& x2) {
    const auto zero = [](const std::string&, auto& w) {
        w.zero_grad();
    };
    xshard::for_each_weight(net, zero);
    const auto y1 = net.forward(x1);
    net.backward(y1); // dy = y: a cotangent that differs per batch
    const xt::xarray<double> dx1 = xshard::gather_all(net.input_gradient<2>(0));
    const auto g1 = gradients_of(net);
    xshard::for_each_weight(net, zero);
    net.forward(x1);
    auto copy = net;
    copy.backward(copy.forward(x2));
    net.backward(y1);
    EXPECT_TRUE(xt::allclose(xshard::gather_all(net.input_gradient<2>(0)), dx1, 1e-13, 1e-13));
    for (const auto& [name, grad] : gradients_of(net))
        EXPECT_TRUE(xt::allclose(grad, g1.at(name), 1e-13, 1e-13)) << name;
    return copy;
}

/// Two batches of 2n + 1 rows (blocks of uneven rows over n ranks) laid out [dp, -] on
/// `mesh` (n, 1): their rows and the two tensors.
std::tuple<std::size_t, X, X> two_batches(const stage_mesh_t& mesh) {
    const auto rows = std::size_t(2 * mesh.size() + 1);
    return {rows,
            xshard::distribute<xshard::dynamic_layout(2)>(mesh, make_batch(rows, 3).x, "[dp, -]"),
            xshard::distribute<xshard::dynamic_layout(2)>(mesh, make_batch(rows, 4).x, "[dp, -]")};
}

TEST(program_chain, a_chain_without_a_pipeline_and_a_copied_program_keep_their_own_activations) {
    const stage_mesh_t mesh({world().size(), 1});
    const auto [rows, x1, x2] = two_batches(mesh);
    // The chain: the same output, input cotangent and gradients; so too where tensors besides
    // the one each module passes on cross the cuts (the input's cotangent then also comes
    // through the cuts).
    for (const bool residual : {false, true}) {
        auto reference = xshard::compile<double>(network(rows, 1, residual), mesh,
                                                 {.seed = 7, .input_gradients = true});
        const auto ry = reference.forward(x1);
        reference.backward(ry);
        chain_t chain(network(rows, 1, residual), mesh, {.seed = 7, .input_gradients = true});
        const auto cy = chain.forward(x1);
        EXPECT_TRUE(xt::allclose(xshard::gather_all(cy), xshard::gather_all(ry), 1e-13, 1e-13))
            << residual;
        const auto cdx = chain.backward(cy);
        EXPECT_TRUE(xt::allclose(xshard::gather_all(cdx),
                                 xshard::gather_all(reference.input_gradient<2>(0)), 1e-12, 1e-12))
            << residual;
        std::map<std::string, xt::xarray<double>> rg;
        xshard::for_each_weight(reference, [&](const std::string& name, auto& w) {
            rg[name] = xshard::gather_all(xshard::ops::resolve(w.grad));
        });
        std::size_t seen = 0;
        xshard::for_each_weight(chain, [&](const std::string& name, auto& w) {
            ASSERT_TRUE(rg.count(name)) << name;
            EXPECT_TRUE(xt::allclose(xshard::gather_all(xshard::ops::resolve(w.grad)), rg.at(name),
                                     1e-12, 1e-12))
                << name << " " << residual;
            ++seen;
        });
        EXPECT_EQ(seen, rg.size());
    }
    // A copy runs another batch between the original's forward and backward passes.
    auto whole =
        xshard::compile<double>(network(rows, 1), mesh, {.seed = 7, .input_gradients = true});
    (void)expect_a_copy_keeps_its_own_activations(whole, x1, x2);
}

TEST(program_chain, cuts_that_do_not_fit_raise_naming_what_crosses_them) {
    const auto x = xshard::input<double>("x", {4, features});
    auto scoped = [](const char* name, traced_tensor h, const char* weight) {
        xshard::name_scope s(name);
        return ops::matmul(h, xshard::param(weight, {features, features}));
    };
    // A skip connection from fc0's output into fc2, over fc1: the cut into fc2 carries both,
    // packed side by side.
    const auto skip = xshard::trace(
        [&](traced_tensor h) {
            auto a = scoped("fc0", h, "w");
            auto c = scoped("fc1", a, "w");
            xshard::name_scope s("fc2");
            return c + a;
        },
        x);
    const auto modules = xshard::split_modules(skip);
    ASSERT_EQ(modules.size(), 3u);
    const auto& into_fc2 = modules[2].body;
    EXPECT_EQ(into_fc2.value(into_fc2.inputs()[0]).shape, (xshard::value_shape{4, 2 * features}));
    EXPECT_EQ(modules[1].body.value(modules[1].body.outputs()[0]).shape,
              (xshard::value_shape{4, 2 * features}));
    EXPECT_EQ(modules[1].body.nodes().back().name, "fc1.cut_out.concat");
    // Tensors of other rows at one cut.
    const auto turned = xshard::trace(
        [&](traced_tensor h) {
            traced_tensor a = h, t = h;
            {
                xshard::name_scope s("fc0");
                a = ops::matmul(h, xshard::param("w", {features, features}));
                t = ops::transpose<1, 0>(ops::matmul(h, xshard::param("v", {features, 3})));
            }
            xshard::name_scope s("fc1");
            return ops::matmul(t, a);
        },
        x);
    expect_error([&] { (void)xshard::split_modules(turned); },
                 "the cut between fc0 and fc1 carries fc0.matmul, fc0.transpose, packed into one "
                 "tensor only when they have the same rows");
    // A weight declared outside the module that uses it.
    const auto outside = xshard::trace(
        [&](traced_tensor h) {
            auto w = xshard::param("w", {features, features});
            xshard::name_scope s("fc0");
            return ops::matmul(h, w);
        },
        x);
    expect_error([&] { (void)xshard::split_modules(outside); },
                 "the weight w of fc0 is not named inside it");
    // A scope entered twice.
    const auto twice = xshard::trace(
        [&](traced_tensor h) {
            h = scoped("fc0", h, "w");
            h = scoped("fc1", h, "w");
            return scoped("fc0", h, "v");
        },
        x);
    expect_error([&] { (void)xshard::split_modules(twice); },
                 "the nodes of fc0 are not consecutive");
    // A tensor of another rank between modules.
    const stage_mesh_t mesh({world().size(), 1});
    const auto reduced = xshard::trace(
        [&](traced_tensor h) {
            h = scoped("fc0", h, "w");
            xshard::name_scope s("sum");
            return ops::sum<1>(h);
        },
        x);
    expect_error([&] { chain_t c(reduced, mesh); },
                 "the output of sum is f64(4,), but the chain's tensors are f64 of rank 2");
    expect_error([&] { chain_t c(network(4, 1), mesh, {.recompute = {"fc0..head"}}); },
                 "the recomputed run fc0..head spans the modules fc0 and head");
}

/// softsign(x) = x / (1 + |x|) and its derivative 1 / (1 + |x|)^2: a user's custom-VJP op.
X softsign(const X& x) {
    X y = x;
    y.local() = x.local() / (1.0 + xt::abs(x.local()));
    return y;
}
X softsign_backward(const X& x, const X& dy) {
    X dx = dy;
    dx.local() = dy.local() / xt::square(1.0 + xt::abs(x.local()));
    return dx;
}

using linear_t = xshard::nn::column_parallel_linear<double, stage_mesh_t>;

/// Four modules, two of them custom-VJP nodes: fc0 (matmul, bias, relu), act (softsign, the
/// user's function), up (a column-parallel linear layer of xshard::nn, its features split
/// over tp, then gelu) and head.
auto custom_network_fn(const stage_mesh_t& mesh, linear_t& up) {
    return [&mesh, &up](traced_tensor x) {
        {
            xshard::name_scope s("fc0");
            auto w =
                xshard::param("weight", {features, hidden}, xshard::initializer::normal(0, 0.4));
            auto b = xshard::param("bias", {hidden}, xshard::initializer::uniform(-0.1, 0.1));
            x = ops::relu(ops::matmul(x, w) + b);
        }
        {
            xshard::name_scope s("act");
            x = xshard::custom_vjp<double>(mesh, "softsign", x, softsign, softsign_backward);
        }
        {
            xshard::name_scope s("up");
            x = ops::gelu(
                xshard::apply_layer(up, mesh, "linear", x, hidden, xshard::features_split("tp")));
        }
        xshard::name_scope s("head");
        return ops::matmul(
            x, xshard::param("weight", {hidden, classes}, xshard::initializer::normal(0, 0.4)));
    };
}

TEST(program_chain, a_pipelined_chain_of_custom_vjp_nodes_equals_one_rank) {
    const int n = world().size();
    // 4 micro-batches of n rows: whole on every mesh pp x dp x tp of the world.
    const auto rows = std::size_t(4 * n);
    const auto b = make_batch(rows, 17);
    // One rank, the whole program.
    const stage_mesh_t one(xshard::communicator::self(), {1, 1});
    linear_t one_up(one, hidden, hidden, 5);
    auto whole = xshard::compile<double>(
        xshard::trace(custom_network_fn(one, one_up), xshard::input<double>("x", {rows, features})),
        one, {.seed = 7});
    xshard::nn::parallel_cross_entropy<double, stage_mesh_t> one_loss;
    const auto out =
        whole.forward(xshard::distribute<xshard::dynamic_layout(2)>(one, b.x, "[-, -]"));
    const double expected_loss =
        one_loss.forward(out, xshard::distribute<xshard::dynamic_layout(1)>(one, b.y, "[-]"));
    whole.backward(one_loss.backward());
    const auto expected = gradients_of(whole);
    ASSERT_TRUE(expected.count("up.linear.weight"));
    for_each_pipeline_mesh(
        [&](const full_mesh_t& mesh, int p, int dp, int tp) {
            const auto stage_mesh = pp::stage_mesh_of<stage_mesh_t>(mesh);
            const auto x =
                xshard::distribute<xshard::dynamic_layout(2)>(stage_mesh, b.x, "[dp, -]");
            const auto y = xshard::distribute<xshard::dynamic_layout(1)>(stage_mesh, b.y, "[dp]");
            // Several micro-batches in flight on a stage, each in a slot (a copy of its module
            // and of the module's layers). 1F1B and zero-bubble also run the backward passes
            // of slots out of order.
            for (const auto kind : {pp::schedule_kind::gpipe, pp::schedule_kind::one_f_one_b,
                                    pp::schedule_kind::zero_bubble}) {
                const std::string where =
                    "mesh pp=" + std::to_string(p) + " dp=" + std::to_string(dp) +
                    " tp=" + std::to_string(tp) + ", " + std::string(pp::name(kind));
                linear_t up(stage_mesh, hidden, hidden, 5);
                chain_t chain(custom_network_fn(stage_mesh, up), stage_mesh, {.seed = 7},
                              xshard::input<double>("x", {std::size_t(n), features}));
                ASSERT_EQ(chain.layers().size(), 4u);
                xshard::nn::parallel_cross_entropy<double, stage_mesh_t> loss;
                pp::pipeline<chain_t, X> pipe(
                    mesh, "pp", stage_mesh, chain,
                    {.micro_batches = 4, .scheduler = kind, .output_broadcast = true});
                EXPECT_NEAR(pipe.step(x, y, loss), expected_loss, 1e-12) << where;
                pipe.synchronize_gradients();
                expect_stage_gradients(pipe.local_parameters(), expected, mesh, where);
            }
        });
}

/// A layer that cannot be copied (the identity), for the copy's refusal.
template <class T, xshard::mesh_type Mesh>
struct pinned_layer {
    pinned_layer() = default;
    pinned_layer(const pinned_layer&) = delete;
    xshard::nn::tensor<T, Mesh> forward(const xshard::nn::tensor<T, Mesh>& x) { return x; }
    xshard::nn::tensor<T, Mesh> backward(const xshard::nn::tensor<T, Mesh>& dy) { return dy; }
    friend void visit_parameters(pinned_layer&, auto&&) {}
};

TEST(program_chain, a_copied_program_runs_copies_of_its_custom_nodes_layers) {
    const stage_mesh_t mesh({world().size(), 1});
    const auto [rows, x1, x2] = two_batches(mesh);
    linear_t up(mesh, hidden, hidden, 5);
    auto whole = xshard::compile<double>(
        xshard::trace(custom_network_fn(mesh, up), xshard::input<double>("x", {rows, features})),
        mesh, {.seed = 7, .input_gradients = true});
    const xt::xarray<double> out1 = xshard::gather_all(whole.forward(x1));
    // A copy runs another batch between the original's forward and backward passes: the
    // original's layers (softsign's kept input, the linear layer's) still hold its own batch.
    auto copy = expect_a_copy_keeps_its_own_activations(whole, x1, x2);
    // The copy's layer holds copies of the weights: zeroing them leaves the original as it was.
    int zeroed = 0;
    xshard::for_each_weight(copy, [&](const std::string& name, auto& w) {
        if (name.starts_with("up.linear.")) {
            w.value.local().fill(0.0);
            ++zeroed;
        }
    });
    EXPECT_EQ(zeroed, 2); // weight and bias
    EXPECT_TRUE(xt::allclose(xshard::gather_all(whole.forward(x1)), out1, 1e-13, 1e-13));
    EXPECT_FALSE(xt::allclose(xshard::gather_all(copy.forward(x1)), out1, 1e-6, 1e-6));
    // A layer that cannot be copied: the copy raises naming the node.
    pinned_layer<double, stage_mesh_t> pinned;
    auto fixed = xshard::compile<double>(
        xshard::trace(
            [&](traced_tensor h) {
                h = xshard::apply_layer(pinned, mesh, "pinned", h, features);
                return ops::matmul(h, xshard::param("w", {features, classes}));
            },
            xshard::input<double>("x", {rows, features})),
        mesh, {.seed = 7});
    expect_error([&] { auto c = fixed; },
                 "the custom node pinned runs a layer that cannot be copied");
}

} // namespace chain_case
} // namespace
