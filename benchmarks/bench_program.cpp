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
//   search_resnet50_8, search_transformer24_16384: the strategy search on programs
//       (search/program_search.hpp, recursive programming), in one process: ResNet-50 on
//       32 images of 224 x 224 for a mesh of 4 x 2 ranks, and 24 transformer blocks (1024
//       features, 16 heads) for a virtual mesh of 128 x 128 ranks (a dry run), against
//       tracing the program ("trace"). Extra fields: nodes, the predicted step, branched.

#include "harness.hpp"

#include <xshard/comm/environment.hpp>
#include <xshard/comm/report_errors.hpp>
#include <xshard/graph.hpp>
#include <xshard/models/resnet.hpp>
#include <xshard/models/transformer.hpp>
#include <xshard/search/program_search.hpp>
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

/// Times the search on the program `trace()` makes, for a mesh of `shape`.
template <class Trace>
void search_case(const xshard::communicator& c, const xshard::bench::options& o, const std::string& name,
                 const xshard::mesh_shape& shape, Trace&& trace) {
    if (!o.wants(name))
        return;
    const auto p = trace();
    const xshard::program_search_options options{.keep_annotations = false};
    xshard::program_strategy found;
    const auto t = xshard::bench::compare(
        c, o, [&] { found = xshard::search_program(p, shape, options); }, [&] { (void)trace(); });
    const std::string extra = "\"nodes\": " + std::to_string(p.nodes().size()) +
                              ", \"predicted_step_seconds\": " + std::to_string(found.seconds) +
                              ", \"branched\": " + std::to_string(found.branched);
    xshard::bench::report(c, name, 0, "trace", t, extra);
}

void search_cases(const xshard::bench::options& o) {
    const auto& self = xshard::communicator::self();
    auto shape = [](int a, int b) {
        return xshard::mesh_shape({xshard::axis_name("dp"), xshard::axis_name("tp")}, {a, b});
    };
    const std::size_t images = o.quick ? 8 : 32, side = o.quick ? 32 : 224;
    search_case(self, o, "search_resnet50_8", shape(4, 2), [&] {
        return xshard::trace(
            [&](xshard::traced_tensor x) {
                return xshard::models::resnet(x, xshard::models::resnet50_depths, 1000, true);
            },
            xshard::input<float>("x", {images, 3, side, side}));
    });
    const std::size_t blocks = o.quick ? 2 : 24, width = 1024;
    search_case(self, o, "search_transformer24_16384", shape(128, 128), [&] {
        return xshard::trace(
            [&](xshard::traced_tensor in) {
                auto h = in;
                for (std::size_t b = 0; b < blocks; ++b) {
                    xshard::name_scope s("block" + std::to_string(b));
                    h = xshard::models::transformer_block(
                        h, {.features = width, .heads = 16, .sequence = 128, .hidden = 4 * width,
                            .tensor_axis = "tp", .data_axis = "dp"});
                }
                return h;
            },
            xshard::input<float>("x", {128 * 128, width}));
    });
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
        if (xshard::communicator::world().rank() == 0)
            search_cases(o);
        return 0;
    });
}
