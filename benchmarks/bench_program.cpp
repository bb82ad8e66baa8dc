// Programs (traced, differentiated, compiled) against the hand-written layers of xshard/nn/
// on the same mesh, and the costs of the program machinery itself.
//
//   source scripts/env.sh; mpirun -n 2 build/benchmarks/bench_program
//
// Cases:
//   transformer_block_tp<p>_<type>: one forward and backward pass of a pre-norm transformer
//       block (256 features, 8 heads, MLP 1024, 4 sequences of 64 tokens) with Megatron's
//       strategies over p ranks, traced (models/transformer.hpp) against
//       nn::transformer_block ("hand_written"). Extra fields: the program's arena bytes.
//   dispatch_per_node: a forward pass of a program of 256 scale nodes on one element, per
//       node, against the same 256 multiplications in a loop ("direct_loop"): the executor's
//       cost per step.
//   trace_compile_transformer4: tracing and compiling a program of four transformer blocks,
//       against one forward pass of it ("one_forward").

#include "harness.hpp"

#include <xshard/comm/environment.hpp>
#include <xshard/comm/report_errors.hpp>
#include <xshard/graph.hpp>
#include <xshard/models/transformer.hpp>
#include <xshard/nn/blocks.hpp>

#include <xtensor/xrandom.hpp>

#include <cstdio>
#include <string>

namespace {

using mesh_t = xshard::mesh<"dp", "tp">;
namespace ops = xshard::ops;

constexpr std::size_t features = 256, heads = 8, hidden = 1024, sequence = 64, sequences = 4;

xshard::models::transformer_options block_options() {
    return {.features = features, .heads = heads, .sequence = sequence, .hidden = hidden,
            .tensor_axis = "tp", .data_axis = "dp"};
}

template <class T>
void transformer_case(const mesh_t& mesh, const xshard::bench::options& o) {
    const std::string name = "transformer_block_tp" + std::to_string(mesh.size()) + "_" +
                             (sizeof(T) == 4 ? "f32" : "f64");
    if (!o.wants(name))
        return;
    const std::size_t tokens = (o.quick ? 1 : sequences) * sequence;
    std::mt19937 engine(1);
    const xt::xtensor<T, 2> x = xt::random::randn<T>({tokens, features}, T(0), T(1), engine);
    const auto dx = xshard::distribute<xshard::dynamic_layout(2)>(mesh, x, "[dp, -]");
    xshard::nn::transformer_block<T, mesh_t> block(
        mesh, features, 3, {.axes = {.tensor = "tp"}, .heads = heads, .sequence = sequence, .hidden = hidden});
    auto prog = xshard::trace(
        [&](xshard::traced_tensor in) { return xshard::models::transformer_block(in, block_options()); },
        xshard::input<T>("x", {tokens, features}));
    auto net = xshard::compile<T>(prog, mesh, {.layouts = {.dataset_axes = {"dp"}}});
    const auto y = block.forward(dx);
    const auto dy = xshard::nn::as_gradient(y);
    const auto t = xshard::bench::compare(
        mesh.comm(), o,
        [&] {
            net.forward(dx);
            net.backward(dy);
        },
        [&] {
            block.forward(dx);
            block.backward(dy);
        });
    xshard::bench::report(mesh.comm(), name, tokens * features * sizeof(T), "hand_written", t,
                          "\"arena_bytes\": " + std::to_string(net.arena_bytes()));
}

void dispatch_case(const mesh_t& mesh, const xshard::bench::options& o) {
    if (!o.wants("dispatch_per_node"))
        return;
    constexpr int nodes = 256;
    auto prog = xshard::trace(
        [&](xshard::traced_tensor in) {
            auto h = in;
            for (int i = 0; i < nodes; ++i)
                h = h * 1.0001;
            return h;
        },
        xshard::input<double>("x", {1}));
    auto net = xshard::compile<double>(prog, mesh, {.layouts = {.input_layouts = {{"x", "[-]"}}}});
    const auto x = xshard::ones<double, xshard::dynamic_layout(1)>(mesh, {1}, "[-]");
    volatile double sink = 0;
    double v = 1;
    auto t = xshard::bench::compare(
        mesh.comm(), o, [&] { net.run(x); },
        [&] {
            double h = v;
            for (int i = 0; i < nodes; ++i)
                h = h * 1.0001;
            sink = h;
        });
    t.seconds /= nodes;
    t.baseline_seconds /= nodes;
    xshard::bench::report(mesh.comm(), "dispatch_per_node", sizeof(double), "direct_loop", t);
}

void compile_case(const mesh_t& mesh, const xshard::bench::options& o) {
    if (!o.wants("trace_compile_transformer4"))
        return;
    const std::size_t tokens = (o.quick ? 1 : sequences) * sequence;
    auto build = [&] {
        auto prog = xshard::trace(
            [&](xshard::traced_tensor in) {
                auto h = in;
                for (int b = 0; b < 4; ++b) {
                    xshard::name_scope s("block" + std::to_string(b));
                    h = xshard::models::transformer_block(h, block_options());
                }
                return h;
            },
            xshard::input<double>("x", {tokens, features}));
        return xshard::compile<double>(prog, mesh, {.layouts = {.dataset_axes = {"dp"}}});
    };
    auto net = build();
    std::mt19937 engine(2);
    const xt::xtensor<double, 2> x = xt::random::randn<double>({tokens, features}, 0.0, 1.0, engine);
    const auto dx = xshard::distribute<xshard::dynamic_layout(2)>(mesh, x, "[dp, -]");
    const auto t = xshard::bench::compare(mesh.comm(), o, [&] { build(); }, [&] { net.forward(dx); });
    xshard::bench::report(mesh.comm(), "trace_compile_transformer4", 0, "one_forward", t);
}

} // namespace

int main(int argc, char** argv) {
    xshard::environment env(argc, argv);
    const auto o = xshard::bench::options::parse(argc, argv);
    return xshard::report_errors([&] {
        const int p = xshard::communicator::world().size();
        const mesh_t mesh(xshard::communicator::world(), {1, p});
        if (heads % std::size_t(p) == 0) {
            transformer_case<double>(mesh, o);
            transformer_case<float>(mesh, o);
            compile_case(mesh, o);
        }
        dispatch_case(mesh, o);
        return 0;
    });
}
