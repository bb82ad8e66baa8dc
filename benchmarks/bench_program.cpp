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
//   transformer4_recompute_tp<p>_f32: one forward and backward pass of four such blocks
//       with every block recomputed in the backward pass (compile_options::recompute)
//       against the same program keeping its activations ("keep"). Extra fields: both
//       arenas and their ratio (the target: <= 0.5 of the arena at <= 1.4 of the time).
//   transformer4_sharded_weights_dp<p>_f32: a training pass (forward, backward, gradients
//       synchronised) of the four blocks data parallel over p ranks with every weight kept
//       sharded over dp (layout_options::weight_shard_axes: gathered per use, gradients
//       reduce-scattered), against the same program with replicated weights and the
//       gradients all-reduced ("replicated"). Extra fields: the forward and backward
//       passes alone ("passes_"), both programs' weight bytes per rank and arenas.
//   resnet18_step_dp<p>_f32: one forward and backward pass of ResNet-18 (32 images of
//       32 x 32, 10 classes, batch norm over the whole batch) data parallel over p ranks,
//       traced (models/resnet.hpp) against nn::resnet18 with synchronised batch norm
//       ("hand_written"), first as a fresh process runs it. Extra fields: the peak memory
//       of each beyond its weights and gradients (peak resident set during two steps,
//       after malloc_trim) and their ratio (the target: <= 1.05); the step timed again
//       after that ("warm_heap_": the layers' allocations then reuse the heap); and with
//       the stem and every residual block recomputed, its step time against the plain
//       program's and its arena's ratio.
//   trace_compile_resnet50_<p>: tracing and compiling ResNet-50 (32 images of 224 x 224,
//       1000 classes, f32) data parallel over p ranks, against tracing alone ("trace").
//   dispatch_per_node: a forward pass of a program of 256 scale nodes on one element, per
//       node, against the same 256 multiplications in a loop ("direct_loop"): the executor's
//       cost per step.
//   trace_compile_transformer4: tracing and compiling a program of four transformer blocks,
//       against one forward pass of it ("one_forward").
//   search_resnet50_8, search_transformer24_16384: the strategy search on programs
//       (search/program_search.hpp, recursive programming), in one process: ResNet-50 on
//       32 images of 224 x 224 for a mesh of 4 x 2 ranks, and 24 transformer blocks (1024
//       features, 16 heads) for a virtual mesh of 128 x 128 ranks (a dry run), against
//       tracing the program ("trace"). Extra fields: nodes, the predicted step, branched,
//       the runs of repeated blocks searched once ("24x24": 24 blocks of 24 nodes), and the
//       same search block by block: its time and predicted step.
//   searched_{mlp,transformer,resnet18}_program_<p>: a training step (forward, backward,
//       gradient all-reduce, Momentum's update) of a loss program laid out by the search (every
//       node, on the machine measured by measure_machine, the better of mesh (p, 1) and (1, p))
//       against the best hand strategy measured: data parallel, or Megatron's annotations on mesh
//       (1, p) (the MLP 1024 -> 4096 -> 1024 of batch 64 and the transformer block above;
//       ResNet-18 on 32 images of 32 x 32 has data parallelism only). Extra fields: the
//       mesh searched, each hand strategy's seconds, predicted / measured steps and the
//       machine measured (GEMM peak, half dimension, memory bandwidth); then
//       the search again on the primitives' factors fitted on a profiled step of the first
//       strategy (calibrate_ops): its mesh, its step over the best hand strategy's, and its
//       predicted / measured step. With --profile, both strategies' steps per primitive,
//       measured against predicted, and the gradients' synchronisation and update as rank 0
//       timed them against their price (stderr).
//   searched_resnet18_one_image_<p>: the same training step of ResNet-18 on one image of
//       224 x 224, laid out by the search over p ranks (a batch of one splits nowhere: the
//       search splits the images' height and width into bands with halos, or their
//       channels), against the one-rank step of the same program ("one_rank", every rank
//       running it at once). Extra fields: the convolutions split by height or width,
//       predicted / measured and the machine; then, as above, the search again on the
//       primitives' factors fitted on a profiled step: its step over one rank's, and its
//       predicted / measured.

#include "harness.hpp"

#include <xshard/comm/environment.hpp>
#include <xshard/comm/report_errors.hpp>
#include <xshard/graph.hpp>
#include <xshard/models/resnet.hpp>
#include <xshard/models/transformer.hpp>
#include <xshard/nn/blocks.hpp>
#include <xshard/nn/resnet.hpp>
#include <xshard/optim/optimizers.hpp>
#include <xshard/search/calibrate.hpp>
#include <xshard/search/program_search.hpp>
#include <xshard/train/gradients.hpp>

#include <xtensor/xrandom.hpp>

#include <malloc.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <optional>
#include <string>
#include <vector>

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

/// Four transformer blocks of element type T, each in a scope of its own ("block0" ...).
template <class T>
xshard::program transformer4(std::size_t tokens) {
    return xshard::trace(
        [&](xshard::traced_tensor in) {
            auto h = in;
            for (int b = 0; b < 4; ++b) {
                xshard::name_scope s("block" + std::to_string(b));
                h = xshard::models::transformer_block(h, block_options());
            }
            return h;
        },
        xshard::input<T>("x", {tokens, features}));
}

/// ResNet-50 (1000 classes, f32) traced on `images` images of side x side.
xshard::program resnet50(std::size_t images, std::size_t side) {
    return xshard::trace(
        [](xshard::traced_tensor x) {
            return xshard::models::resnet(x, xshard::models::resnet50_depths, 1000, true);
        },
        xshard::input<float>("x", {images, 3, side, side}));
}

/// `"name": bytes` fields: the arenas and the ratio of a recomputed program to a plain one.
std::string arena_fields(std::size_t again, std::size_t keep) {
    return "\"arena_bytes\": " + std::to_string(again) +
           ", \"baseline_arena_bytes\": " + std::to_string(keep) +
           ", \"arena_ratio\": " + std::to_string(double(again) / double(keep));
}

void recompute_case(const mesh_t& mesh, const xshard::bench::options& o) {
    const std::string name = "transformer4_recompute_tp" + std::to_string(mesh.size()) + "_f32";
    if (!o.wants(name))
        return;
    const std::size_t tokens = (o.quick ? 1 : sequences) * sequence;
    const auto prog = transformer4<float>(tokens);
    const xshard::layout_options lay{.dataset_axes = {"dp"}};
    auto again = xshard::compile<float>(
        prog, mesh, {.layouts = lay, .recompute = {"block0", "block1", "block2", "block3"}});
    auto keep = xshard::compile<float>(prog, mesh, {.layouts = lay});
    std::mt19937 engine(3);
    const xt::xtensor<float, 2> x = xt::random::randn<float>({tokens, features}, 0.f, 1.f, engine);
    const auto dx = xshard::distribute<xshard::dynamic_layout(2)>(mesh, x, "[dp, -]");
    const auto dy = keep.forward(dx);
    const auto t = xshard::bench::compare(
        mesh.comm(), o,
        [&] {
            again.forward(dx);
            again.backward(dy);
        },
        [&] {
            keep.forward(dx);
            keep.backward(dy);
        });
    xshard::bench::report(mesh.comm(), name, tokens * features * sizeof(float), "keep", t,
                          arena_fields(again.arena_bytes(), keep.arena_bytes()));
}

/// The resident set's growth while `run` runs (its peak, against before it), after the
/// allocator returned what it holds free: the memory `run` needed at its peak.
template <class Run>
std::size_t peak_growth(const xshard::communicator& c, Run&& run) {
    malloc_trim(0);
    xshard::mpi::barrier(c);
    xshard::bench::reset_peak();
    const std::size_t before = xshard::bench::resident_bytes().first;
    run();
    const std::size_t peak = xshard::bench::resident_bytes().second;
    malloc_trim(0);
    return peak > before ? peak - before : 0;
}

/// Bytes of this rank's shares of the weights of `m` (their values).
template <class M>
std::size_t weight_bytes(M& m) {
    std::size_t n = 0;
    xshard::for_each_weight(m, [&](const std::string&, auto& w) {
        n += w.value.local().size() *
             sizeof(typename std::remove_cvref_t<decltype(w.value)>::value_type);
    });
    return n;
}

void sharded_weights_case(const xshard::bench::options& o) {
    const auto& world = xshard::communicator::world();
    const int p = world.size();
    const std::string name = "transformer4_sharded_weights_dp" + std::to_string(p) + "_f32";
    const std::size_t count = o.quick ? std::size_t(p) : sequences;
    if (!o.wants(name) || count % std::size_t(p) != 0)
        return;
    const mesh_t mesh(world, {p, 1});
    const std::size_t tokens = count * sequence;
    const auto prog = transformer4<float>(tokens);
    auto sharded = xshard::compile<float>(
        prog, mesh, {.layouts = {.dataset_axes = {"dp"}, .weight_shard_axes = {"dp"}}});
    auto replicated = xshard::compile<float>(prog, mesh, {.layouts = {.dataset_axes = {"dp"}}});
    std::mt19937 engine(5);
    const xt::xtensor<float, 2> x = xt::random::randn<float>({tokens, features}, 0.f, 1.f, engine);
    const auto dx = xshard::distribute<xshard::dynamic_layout(2)>(mesh, x, "[dp, -]");
    const auto dy = replicated.forward(dx);
    xshard::gradients_of sharded_grads(sharded), replicated_grads(replicated);
    auto pass = [&](auto& net, auto& grads, bool synchronise) {
        net.forward(dx);
        net.backward(dy);
        if (synchronise)
            xshard::synchronize_gradients(net, grads);
        xshard::for_each_weight(net, [](const std::string&, auto& w) { w.zero_grad(); });
    };
    const auto t = xshard::bench::compare(
        mesh.comm(), o, [&] { pass(sharded, sharded_grads, true); },
        [&] { pass(replicated, replicated_grads, true); });
    const auto passes = xshard::bench::compare(
        mesh.comm(), o, [&] { pass(sharded, sharded_grads, false); },
        [&] { pass(replicated, replicated_grads, false); });
    xshard::bench::report(
        mesh.comm(), name, tokens * features * sizeof(float), "replicated", t,
        "\"passes_seconds\": " + std::to_string(passes.seconds) +
            ", \"passes_baseline_seconds\": " + std::to_string(passes.baseline_seconds) +
            ", \"passes_ratio\": " + std::to_string(passes.seconds / passes.baseline_seconds) +
            ", \"weight_bytes\": " + std::to_string(weight_bytes(sharded)) +
            ", \"baseline_weight_bytes\": " + std::to_string(weight_bytes(replicated)) + ", " +
            arena_fields(sharded.arena_bytes(), replicated.arena_bytes()));
}

void resnet_case(const mesh_t& mesh, const xshard::bench::options& o) {
    const int p = mesh.size();
    const std::string name = "resnet18_step_dp" + std::to_string(p) + "_f32";
    const std::size_t images = o.quick ? 8 : 32, side = o.quick ? 16 : 32, classes = 10;
    if (!o.wants(name) || images % std::size_t(p) != 0)
        return;
    std::mt19937 engine(4);
    const xt::xtensor<float, 4> x = xt::random::rand<float>(
        std::array<std::size_t, 4>{images, 3, side, side}, -1.f, 1.f, engine);
    const auto dx = xshard::distribute<xshard::dynamic_layout(4)>(mesh, x, "[dp, -, -, -]");
    const auto prog = xshard::trace(
        [&](xshard::traced_tensor in) {
            return xshard::models::resnet(in, xshard::models::resnet18_depths, classes);
        },
        xshard::input<float>("x", {images, 3, side, side}));
    // The stem (a run of nodes: conv1, bn1, the relu, the pooling) and each residual block.
    std::vector<std::string> blocks = {"conv1..max_pool2d"};
    for (int l = 1; l <= 4; ++l)
        for (int b = 0; b < 2; ++b)
            blocks.push_back("layer" + std::to_string(l) + "." + std::to_string(b));
    auto run = [&](auto& net, const auto& dy) {
        net.forward(dx);
        net.backward(dy);
    };
    // The step as a fresh training process sees it.
    auto hand = xshard::nn::resnet18<float>(mesh, classes, {.blocks = {.sync_bn = true}});
    auto net = xshard::compile<float>(prog, mesh);
    const auto dy = net.forward(dx);
    const auto hand_dy = xshard::nn::as_gradient(hand.forward(dx));
    const auto t = xshard::bench::compare(
        mesh.comm(), o, [&] { run(net, dy); }, [&] { run(hand, hand_dy); });
    // Memory, each model alone: the peak beyond its weights and gradients.
    std::size_t hand_weights = 0, program_weights = 0;
    const std::size_t hand_peak = peak_growth(mesh.comm(), [&] {
        auto h = xshard::nn::resnet18<float>(mesh, classes, {.blocks = {.sync_bn = true}});
        const auto hdy = xshard::nn::as_gradient(h.forward(dx));
        run(h, hdy);
        run(h, hdy);
        hand_weights = 2 * weight_bytes(h); // values and gradients
    });
    const std::size_t program_peak = peak_growth(mesh.comm(), [&] {
        auto n = xshard::compile<float>(prog, mesh);
        const auto ndy = n.forward(dx);
        run(n, ndy);
        run(n, ndy);
        program_weights = 2 * weight_bytes(n);
    });
    const double hand_bytes = double(hand_peak) - double(hand_weights);
    const double program_bytes = double(program_peak) - double(program_weights);
    // The step again, now that the allocator has served and freed larger blocks (glibc raises
    // its mmap threshold when it frees a mapped block, so the layers' per-step allocations
    // then come from its heap without page faults).
    const auto w = xshard::bench::compare(
        mesh.comm(), o, [&] { run(net, dy); }, [&] { run(hand, hand_dy); });
    auto again = xshard::compile<float>(prog, mesh, {.recompute = blocks});
    const auto r = xshard::bench::compare(
        mesh.comm(), o, [&] { run(again, dy); }, [&] { run(net, dy); });
    const auto peak = [&](double v) {
        return std::to_string(std::size_t(v));
    };
    xshard::bench::report(
        mesh.comm(), name, x.size() * sizeof(float), "hand_written", t,
        "\"peak_bytes\": " + peak(program_bytes) + ", \"baseline_peak_bytes\": " +
            peak(hand_bytes) + ", \"peak_ratio\": " + std::to_string(program_bytes / hand_bytes) +
            ", \"warm_heap_seconds\": " + std::to_string(w.seconds) +
            ", \"warm_heap_baseline_seconds\": " + std::to_string(w.baseline_seconds) +
            ", \"warm_heap_ratio\": " + std::to_string(w.seconds / w.baseline_seconds) +
            ", \"recompute_seconds\": " + std::to_string(r.seconds) +
            ", \"recompute_time_ratio\": " + std::to_string(r.seconds / r.baseline_seconds) + ", " +
            arena_fields(again.arena_bytes(), net.arena_bytes()));
}

void resnet50_compile_case(const mesh_t& mesh, const xshard::bench::options& o) {
    const int p = mesh.size();
    const std::string name = "trace_compile_resnet50_" + std::to_string(p);
    const std::size_t images = o.quick ? 8 : 32, side = o.quick ? 32 : 224;
    if (!o.wants(name) || images % std::size_t(p) != 0)
        return;
    const auto t = xshard::bench::compare(
        mesh.comm(), o, [&] { (void)xshard::compile<float>(resnet50(images, side), mesh); },
        [&] { (void)resnet50(images, side); });
    xshard::bench::report(mesh.comm(), name, 0, "trace", t);
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
        return xshard::compile<double>(transformer4<double>(tokens), mesh,
                                       {.layouts = {.dataset_axes = {"dp"}}});
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
    // The same search block by block (repeated blocks not shared), timed once.
    auto apart = options;
    apart.share_repeated_blocks = false;
    const auto start = std::chrono::steady_clock::now();
    const auto each = xshard::search_program(p, shape, apart);
    const double each_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::string runs;
    for (const auto& r : found.repeated)
        runs += (runs.empty() ? "" : " ") + std::to_string(r.count) + "x" + std::to_string(r.nodes);
    const std::string extra =
        "\"nodes\": " + std::to_string(p.nodes().size()) +
        ", \"predicted_step_seconds\": " + std::to_string(found.seconds) +
        ", \"branched\": " + std::to_string(found.branched) + ", \"repeated_blocks\": \"" + runs +
        "\", \"block_by_block_search_seconds\": " + std::to_string(each_seconds) +
        ", \"block_by_block_predicted_step_seconds\": " + std::to_string(each.seconds);
    xshard::bench::report(c, name, 0, "trace", t, extra);
}

void search_cases(const xshard::bench::options& o) {
    const auto& self = xshard::communicator::self();
    auto shape = [](int a, int b) {
        return xshard::mesh_shape({xshard::axis_name("dp"), xshard::axis_name("tp")}, {a, b});
    };
    const std::size_t images = o.quick ? 8 : 32, side = o.quick ? 32 : 224;
    search_case(self, o, "search_resnet50_8", shape(4, 2), [&] { return resnet50(images, side); });
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

/// This rank's seconds in train_step after the passes, summed over `steps` steps: the
/// gradients' synchronisation, and the update with the gradients' zeroing.
struct {
    double sync = 0, update = 0;
    int steps = 0;
} after_passes;

/// One training step of a loss program: forward, backward, the gradients' all-reduce,
/// Momentum's update (one optimizer state: `search_machine`) and the gradients' zeroing. The
/// optimizer keeps its state in the weights, so one serves every program of a type.
template <class Net, class X, class Y>
void train_step(Net& net, const X& x, const Y& y) {
    static xshard::optim::momentum optimizer{{.lr = 1e-4, .momentum = 0.9}};
    using clock = std::chrono::steady_clock;
    net.train_step(x, y);
    const auto passes = clock::now();
    auto grads = xshard::gradients_of(net);
    xshard::synchronize_gradients(net, grads);
    const auto synchronized = clock::now();
    optimizer.step(net);
    xshard::for_each_weight(net, [](const std::string&, auto& w) { w.zero_grad(); });
    const auto updated = clock::now();
    after_passes.sync += std::chrono::duration<double>(synchronized - passes).count();
    after_passes.update += std::chrono::duration<double>(updated - synchronized).count();
    ++after_passes.steps;
}

/// The machine's figures as JSON fields: the GEMM's peak, its half dimension and the memory
/// bandwidth, per rank.
std::string machine_fields(const xshard::machine_model& m) {
    return "\"gemm_flops\": " + std::to_string(m.gemm_flops) +
           ", \"gemm_half_dimension\": " + std::to_string(m.gemm_half_dimension) +
           ", \"memory_bandwidth\": " + std::to_string(m.memory_bandwidth);
}

/// The machine the searched cases price with: measured, with train_step's one optimizer
/// state per weight.
template <class T>
xshard::machine_model search_machine(const xshard::communicator& world) {
    auto machine = xshard::measure_machine<T>(world);
    machine.optimizer_states = 1;
    return machine;
}

/// With --profile: per primitive, this rank's measured milliseconds per step (`measured`, a
/// program's profile, graph/profile.hpp) against the search's prices in `predicted`, and the
/// steps' synchronisation and update since `after_passes` was last cleared against their
/// price, on stderr (rank 0): where the cost model errs.
void print_profile(const xshard::bench::options& o, const std::string& name,
                   const xshard::program_profile& measured,
                   const xshard::program_strategy& predicted) {
    if (!o.profile || xshard::communicator::world().rank() != 0)
        return;
    // Per primitive: measured compute, predicted compute, measured and predicted
    // redistributions, milliseconds per step.
    std::map<std::string, std::array<double, 4>> ops;
    const double steps = double(std::max<std::size_t>(measured.forward_passes, 1));
    for (const auto& n : measured.nodes) {
        ops[n.op][0] += 1e3 * (n.forward + n.backward) / steps;
        ops[n.op][2] += 1e3 * n.redistribution / steps;
    }
    double sync = 0;
    for (const auto& n : predicted.nodes) {
        ops[n.op][1] += 1e3 * n.compute;
        ops[n.op][3] += 1e3 * n.communication;
        sync += 1e3 * n.gradient_sync;
    }
    std::fprintf(stderr,
                 "%s on mesh(%s), ms per step: compute measured / predicted, "
                 "redistribution measured / predicted\n",
                 name.c_str(), predicted.mesh.to_string().c_str());
    std::array<double, 4> total{};
    for (const auto& [op, t] : ops) {
        std::fprintf(stderr, "  %-22s %8.3f / %8.3f  %8.3f / %8.3f\n", op.c_str(), t[0], t[1], t[2],
                     t[3]);
        for (int k = 0; k < 4; ++k)
            total[k] += t[k];
    }
    std::fprintf(stderr, "  %-22s %8.3f / %8.3f  %8.3f / %8.3f\n", "all", total[0], total[1],
                 total[2], total[3]);
    const double timed = std::max(after_passes.steps, 1);
    std::fprintf(stderr,
                 "  gradient sync and update: measured %.3f + %.3f (rank 0, mean of %d steps) / "
                 "predicted %.3f\n",
                 1e3 * after_passes.sync / timed, 1e3 * after_passes.update / timed,
                 after_passes.steps, sync);
}

/// `machine` with its primitives' factors fitted (calibrate_ops) on the quietest of `o.reps`
/// steps of `net`, laid out by `found`, each profiled alone (printed with --profile): a step
/// slowed by other work on the machine would raise every factor.
template <class Net, class Step>
xshard::machine_model fitted_on(const xshard::bench::options& o, const std::string& name,
                                Net& net, const xshard::program_strategy& found,
                                const xshard::machine_model& machine, Step&& step) {
    std::optional<xshard::program_profile> quietest;
    after_passes = {};
    for (int r = 0; r < o.reps; ++r) {
        net.profile_steps();
        step();
        if (!quietest || net.profile().seconds() < quietest->seconds())
            quietest = net.profile();
    }
    net.profile_steps(false);
    print_profile(o, name, *quietest, found);
    return xshard::calibrate_ops(xshard::communicator::world(), machine, *quietest, found);
}

/// The predicted step of `p` laid out as compile lays it out on `shape` (every node pinned).
double predicted_step(xshard::program p, const xshard::mesh_shape& shape,
                      const xshard::machine_model& machine) {
    const auto laid = xshard::assign_layouts(p, shape);
    for (std::size_t k = 0; k < laid.nodes.size(); ++k) {
        auto& a = p.node(p.nodes()[k].name).annotation;
        a.in_strategies.clear();
        a.in_layouts = laid.nodes[k].operands;
    }
    return xshard::search_program(p, shape, {.machine = machine}).seconds;
}

/// The search's strategy against the best hand strategy, both measured: data parallel (`p`
/// on mesh (p, 1)) and, with `megatron`, `p`'s tensor-parallel annotations on mesh (1, p). The
/// search (every node, on the machine measured) runs for both mesh shapes and the lower
/// prediction is compiled. x's rows and y split over dp.
template <class T, std::size_t N>
void searched_case(const xshard::bench::options& o, const std::string& name,
                   const xshard::program& p, bool megatron, const xt::xtensor<T, N>& x,
                   const xt::xtensor<std::int64_t, 1>& y) {
    const auto& world = xshard::communicator::world();
    const int ranks = world.size();
    if (!o.wants(name))
        return;
    megatron = megatron && ranks > 1;
    const auto machine = search_machine<T>(world);
    const mesh_t dp(world, {ranks, 1}), tp(world, {1, ranks});
    // The search on both mesh shapes: the strategy of the lower prediction, and its mesh.
    auto search = [&](const xshard::machine_model& m) {
        std::optional<xshard::program_strategy> found;
        const mesh_t* chosen = &dp;
        for (const mesh_t* mesh : {&dp, &tp}) {
            auto f =
                xshard::search_program(p, mesh->shape(), {.machine = m, .keep_annotations = false});
            if (!found || f.seconds < found->seconds) {
                found = std::move(f);
                chosen = mesh;
            }
        }
        return std::pair{std::move(*found), chosen};
    };
    auto [found, chosen] = search(machine);
    auto searched_program = p;
    found.apply(searched_program);
    const std::string rows = N == 2 ? "[dp, -]" : "[dp, -, -, -]";
    auto inputs = [&](const mesh_t& m) {
        return std::pair{
            xshard::distribute<xshard::dynamic_layout(N)>(m, x, xshard::layout::parse(rows)),
            xshard::distribute<xshard::dynamic_layout(1)>(m, y, "[dp]")};
    };
    auto by_dp = xshard::compile<T>(p, dp, {.seed = 1});
    auto searched = xshard::compile<T>(searched_program, *chosen, {.seed = 1});
    const auto dp_in = inputs(dp), searched_in = inputs(*chosen), tp_in = inputs(tp);
    double dp_seconds = 0, megatron_seconds = INFINITY;
    std::optional<xshard::compiled_program<T, mesh_t>> by_tp;
    if (megatron) {
        by_tp.emplace(p, tp, xshard::compile_options{.seed = 1});
        const auto hand = xshard::bench::compare(
            world, o, [&] { train_step(by_dp, dp_in.first, dp_in.second); },
            [&] { train_step(*by_tp, tp_in.first, tp_in.second); });
        dp_seconds = hand.seconds;
        megatron_seconds = hand.baseline_seconds;
    }
    const bool dp_best = dp_seconds <= megatron_seconds;
    const auto best_hand = [&] {
        if (dp_best)
            train_step(by_dp, dp_in.first, dp_in.second);
        else
            train_step(*by_tp, tp_in.first, tp_in.second);
    };
    const auto t = xshard::bench::compare(
        world, o, [&] { train_step(searched, searched_in.first, searched_in.second); }, best_hand);
    if (!megatron)
        dp_seconds = t.baseline_seconds;
    // The search again, on the primitives' factors fitted on a profiled step of the first
    // strategy (calibrate_ops), its strategy measured against the same best hand strategy.
    auto [second, refit_mesh] = search(fitted_on(o, name, searched, found, machine, [&] {
        train_step(searched, searched_in.first, searched_in.second);
    }));
    auto refit_program = p;
    second.apply(refit_program);
    auto refit = xshard::compile<T>(refit_program, *refit_mesh, {.seed = 1});
    const auto refit_in = inputs(*refit_mesh);
    const auto c = xshard::bench::compare(
        world, o, [&] { train_step(refit, refit_in.first, refit_in.second); }, best_hand);
    if (o.profile) {
        refit.profile_steps();
        after_passes = {};
        for (int r = 0; r < o.reps; ++r)
            train_step(refit, refit_in.first, refit_in.second);
        print_profile(o, name + " (calibrated)", refit.profile(), second);
    }
    const double dp_predicted = predicted_step(p, dp.shape(), machine);
    std::string extra =
        "\"searched_mesh\": \"" + chosen->shape().to_string() +
        "\", \"dp_seconds\": " + std::to_string(dp_seconds) +
        ", \"predicted_over_measured\": " + std::to_string(found.seconds / t.seconds) +
        ", \"dp_predicted_over_measured\": " + std::to_string(dp_predicted / dp_seconds) +
        ", " + machine_fields(machine);
    extra +=
        ", \"calibrated_mesh\": \"" + refit_mesh->shape().to_string() +
        "\", \"calibrated_over_best_hand\": " + std::to_string(c.seconds / c.baseline_seconds) +
        ", \"calibrated_predicted_over_measured\": " + std::to_string(second.seconds / c.seconds);
    if (megatron)
        extra += ", \"megatron_seconds\": " + std::to_string(megatron_seconds) +
                 ", \"megatron_predicted_over_measured\": " +
                 std::to_string(predicted_step(p, tp.shape(), machine) / megatron_seconds);
    xshard::bench::report(world, name, x.size() * sizeof(T),
                          dp_best ? "best_hand_dp" : "best_hand_megatron", t, extra);
}

void searched_cases(const xshard::bench::options& o) {
    const std::size_t ranks = std::size_t(xshard::communicator::world().size());
    std::mt19937 engine(5);
    // The MLP of bench_training (1024 -> 4096 -> 1024, relu, batch 64) with a loss over its
    // 1024 outputs; Megatron's split (w1 by columns, w2 by rows) annotated over tp.
    {
        const std::size_t batch = 64, width = 1024, wide = 4096;
        auto p = xshard::trace(
            [&](xshard::traced_tensor in, xshard::traced_tensor labels) {
                auto h = ops::relu(ops::matmul(in, xshard::param("w1", {width, wide})));
                h = ops::matmul(h, xshard::param("w2", {wide, width}));
                return ops::mean<0>(ops::cross_entropy(h, labels));
            },
            xshard::input<float>("x", {batch, width}), xshard::input<std::int64_t>("y", {batch}));
        p.node("matmul").annotation.in_layouts = {xshard::layout::parse("[dp, -]"),
                                                  xshard::layout::parse("[-, tp]")};
        p.node("matmul_1").annotation.in_layouts = {xshard::layout::parse("[dp, tp]"),
                                                    xshard::layout::parse("[tp, -]")};
        const xt::xtensor<float, 2> x = xt::random::randn<float>({batch, width}, 0.f, 1.f, engine);
        const xt::xtensor<std::int64_t, 1> y =
            xt::random::randint<std::int64_t>({batch}, 0, std::int64_t(width), engine);
        searched_case(o, "searched_mlp_program_" + std::to_string(ranks), p, true, x, y);
    }
    // The transformer block of transformer_case (Megatron's annotations over tp) with a loss
    // over its features.
    if (heads % ranks == 0) {
        const std::size_t tokens = (o.quick ? 1 : sequences) * sequence;
        auto p = xshard::trace(
            [&](xshard::traced_tensor in, xshard::traced_tensor labels) {
                return ops::mean<0>(ops::cross_entropy(
                    xshard::models::transformer_block(in, block_options()), labels));
            },
            xshard::input<float>("x", {tokens, features}),
            xshard::input<std::int64_t>("y", {tokens}));
        const xt::xtensor<float, 2> x =
            xt::random::randn<float>({tokens, features}, 0.f, 1.f, engine);
        const xt::xtensor<std::int64_t, 1> y =
            xt::random::randint<std::int64_t>({tokens}, 0, std::int64_t(features), engine);
        searched_case(o, "searched_transformer_program_" + std::to_string(ranks), p, true, x, y);
    }
    // ResNet-18 on 32 images of 32 x 32 (10 classes): data parallel is the hand strategy.
    {
        const std::size_t images = o.quick ? 8 : 32, side = o.quick ? 16 : 32;
        auto p = xshard::trace(
            [&](xshard::traced_tensor in, xshard::traced_tensor labels) {
                return ops::mean<0>(ops::cross_entropy(
                    xshard::models::resnet(in, xshard::models::resnet18_depths, 10), labels));
            },
            xshard::input<float>("x", {images, 3, side, side}),
            xshard::input<std::int64_t>("y", {images}));
        const xt::xtensor<float, 4> x = xt::random::rand<float>(
            std::array<std::size_t, 4>{images, 3, side, side}, -1.f, 1.f, engine);
        const xt::xtensor<std::int64_t, 1> y =
            xt::random::randint<std::int64_t>({images}, 0, 10, engine);
        searched_case(o, "searched_resnet18_program_" + std::to_string(ranks), p, false, x, y);
    }
}

void one_image_case(const xshard::bench::options& o) {
    const auto& world = xshard::communicator::world();
    const int ranks = world.size();
    const std::string name = "searched_resnet18_one_image_" + std::to_string(ranks);
    if (!o.wants(name))
        return;
    const std::size_t side = o.quick ? 64 : 224;
    const auto p = xshard::trace(
        [&](xshard::traced_tensor in, xshard::traced_tensor labels) {
            return ops::mean<0>(ops::cross_entropy(
                xshard::models::resnet(in, xshard::models::resnet18_depths, 10), labels));
        },
        xshard::input<float>("x", {1, 3, side, side}), xshard::input<std::int64_t>("y", {1}));
    const auto machine = search_machine<float>(world);
    const mesh_t mesh(world, {1, ranks}), one(xshard::communicator::self(), {1, 1});
    const auto found =
        xshard::search_program(p, mesh.shape(), {.machine = machine, .keep_annotations = false});
    std::size_t spatial = 0;
    for (const auto& n : found.nodes)
        if (n.op == "conv2d" &&
            (n.layouts.operands[0].is_split(2) || n.layouts.operands[0].is_split(3)))
            ++spatial;
    auto searched_program = p;
    found.apply(searched_program);
    auto searched = xshard::compile<float>(searched_program, mesh, {.seed = 1});
    auto alone = xshard::compile<float>(p, one, {.seed = 1});
    std::mt19937 engine(9);
    const xt::xtensor<float, 4> x =
        xt::random::rand<float>(std::array<std::size_t, 4>{1, 3, side, side}, -1.f, 1.f, engine);
    const xt::xtensor<std::int64_t, 1> y = {3};
    auto inputs = [&](const mesh_t& m) {
        return std::pair{xshard::distribute<xshard::dynamic_layout(4)>(m, x, "[-, -, -, -]"),
                         xshard::distribute<xshard::dynamic_layout(1)>(m, y, "[-]")};
    };
    const auto in = inputs(mesh), in_one = inputs(one);
    const auto t = xshard::bench::compare(
        world, o, [&] { train_step(searched, in.first, in.second); },
        [&] { train_step(alone, in_one.first, in_one.second); });
    // The search again on the primitives' factors fitted on a profiled step.
    const auto fitted = fitted_on(o, name, searched, found, machine,
                                  [&] { train_step(searched, in.first, in.second); });
    const auto second =
        xshard::search_program(p, mesh.shape(), {.machine = fitted, .keep_annotations = false});
    auto refit_program = p;
    second.apply(refit_program);
    auto refit = xshard::compile<float>(refit_program, mesh, {.seed = 1});
    const auto c = xshard::bench::compare(
        world, o, [&] { train_step(refit, in.first, in.second); },
        [&] { train_step(alone, in_one.first, in_one.second); });
    xshard::bench::report(
        world, name, x.size() * sizeof(float), "one_rank", t,
        "\"spatial_convs\": " + std::to_string(spatial) + ", \"predicted_over_measured\": " +
            std::to_string(found.seconds / t.seconds) + ", " + machine_fields(machine) +
            ", \"calibrated_over_one_rank\": " + std::to_string(c.seconds / c.baseline_seconds) +
            ", \"calibrated_predicted_over_measured\": " +
            std::to_string(second.seconds / c.seconds));
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
            recompute_case(mesh, o);
        }
        const mesh_t data(xshard::communicator::world(), {p, 1});
        resnet_case(data, o);
        sharded_weights_case(o);
        resnet50_compile_case(data, o);
        dispatch_case(mesh, o);
        searched_cases(o);
        one_image_case(o);
        if (xshard::communicator::world().rank() == 0)
            search_cases(o);
        return 0;
    });
}
