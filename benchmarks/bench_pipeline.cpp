// bench_pipeline: one training step (forward, backward, gradient synchronisation, optimizer)
// of bench_training's MLP made deeper (column_parallel_linear(1024 -> 4096), gelu,
// row_parallel_linear(4096 -> 1024), gelu, twice: four weights of 1024 x 4096) as a pipeline
// of 2 stages with 8 micro-batches, against the same step for the same global batch (1024
// rows, so that a micro-batch's 128 rows keep the matrix products efficient: with 64 rows
// reading the weights costs a fifth more) on one rank (rank 0 alone, over MPI_COMM_SELF).
// Cases, all against baseline "one_rank":
//   mlp_pp2_m8_1f1b          1F1B (target: 1.6x one rank, ratio <= 0.625; the bubble alone
//                            allows 2 x 8/9 = 1.78x)
//   mlp_pp2_m8_gpipe         GPipe
//   mlp_pp2_m8_interleaved   interleaved 1F1B, 2 virtual stages per rank
//   mlp_pp2_m8_zero_bubble   ZB-H1 (backward split into input and weight gradients)
// Each line has `bubble_measured` (the idle share of the step on the pipeline's ranks,
// measured: 1 - time computing / step time, mean over the ranks) next to `bubble_predicted`
// (the schedule table's, pipeline/analysis.hpp).
//   program_chain_pp2_m8_1f1b  the same MLP written as a traced function (no hand-written
//                            backward), an xshard::program_chain of the same seven modules,
//                            pipelined alike; against baseline "layers_pp2_m8_1f1b", the
//                            hand-written layers' pipelined step in the same run.

#include <xshard/comm/environment.hpp>
#include <xshard/graph.hpp>
#include <xshard/nn/activation.hpp>
#include <xshard/nn/embedding.hpp>
#include <xshard/nn/linear.hpp>
#include <xshard/optim/optimizers.hpp>
#include <xshard/pipeline/pipeline.hpp>
#include <xshard/train/gradients.hpp>

#include "harness.hpp"

#include <cstdio>
#include <optional>
#include <random>
#include <string>

namespace {

namespace bench = xshard::bench;
namespace nn = xshard::nn;
namespace pp = xshard::pipeline;
using stage_mesh_t = xshard::mesh<"dp", "tp">;
using full_mesh_t = xshard::mesh<"pp", "dp", "tp">;
using T = double;
using X = nn::tensor<T, stage_mesh_t>;

struct sizes {
    std::size_t features, hidden, batch;
};

auto make_model(const stage_mesh_t& m, const sizes& s) {
    return nn::sequential(nn::column_parallel_linear<T, stage_mesh_t>(m, s.features, s.hidden, 1),
                          nn::gelu_activation<T, stage_mesh_t>(m),
                          nn::row_parallel_linear<T, stage_mesh_t>(m, s.hidden, s.features, 2),
                          nn::gelu_activation<T, stage_mesh_t>(m),
                          nn::column_parallel_linear<T, stage_mesh_t>(m, s.features, s.hidden, 3),
                          nn::gelu_activation<T, stage_mesh_t>(m),
                          nn::row_parallel_linear<T, stage_mesh_t>(m, s.hidden, s.features, 4));
}
using model_t = decltype(make_model(std::declval<stage_mesh_t>(), sizes{}));

struct data {
    X x;
    nn::tensor<std::int64_t, stage_mesh_t, 1> labels;
    data(const stage_mesh_t& m, const sizes& s)
        : x(xshard::generate<xshard::dynamic_layout(2)>(
              m, std::array{s.batch, s.features}, std::mt19937(11),
              std::normal_distribution<T>(0, 1), nn::make_layout({"dp", ""})))
        , labels(xshard::generate<xshard::dynamic_layout(1)>(
              m, std::array{s.batch}, std::mt19937(12),
              std::uniform_int_distribution<std::int64_t>(0, std::int64_t(s.features) - 1),
              nn::make_layout({"dp"}))) {}
};

/// The one-rank step.
struct one_rank {
    stage_mesh_t mesh;
    model_t model;
    data batch;
    nn::parallel_cross_entropy<T, stage_mesh_t> loss;
    xshard::optim::momentum optimizer{{.lr = 1e-3, .momentum = 0.9}};
    explicit one_rank(const sizes& s)
        : mesh(xshard::communicator::self(), {1, 1})
        , model(make_model(mesh, s))
        , batch(mesh, s) {}
    void step() {
        loss.forward(model.forward(batch.x), batch.labels);
        model.backward(loss.backward());
        auto grads = xshard::gradients_of{model};
        xshard::synchronize_gradients(model, grads);
        optimizer.step(model);
        xshard::for_each_weight(model, [](const std::string&, auto& w) { w.zero_grad(); });
    }
};

/// The same MLP as a traced function: seven modules, named as the sequential's, with the
/// layers' biases and exact gelu.
auto traced_mlp(const sizes& s) {
    return [s](xshard::traced_tensor x) {
        namespace ops = xshard::ops;
        for (int i = 0; i < 7; ++i) {
            xshard::name_scope scope(std::to_string(i));
            if (i % 2) {
                x = ops::gelu(x);
                continue;
            }
            const std::size_t in = i % 4 ? s.hidden : s.features;
            const std::size_t out = i % 4 ? s.features : s.hidden;
            x = ops::matmul(x, xshard::param("weight", {in, out})) + xshard::param("bias", {out});
        }
        return x;
    };
}
using chain_t = xshard::program_chain<T, stage_mesh_t>;

/// The pipelined step of `Model` (the layers, or the program chain).
template <class Model>
struct pipelined {
    stage_mesh_t mesh;
    Model model;
    data batch;
    nn::parallel_cross_entropy<T, stage_mesh_t> loss;
    xshard::optim::momentum optimizer{{.lr = 1e-3, .momentum = 0.9}};
    pp::pipeline<Model, X> pipe;
    template <class Make>
    pipelined(const full_mesh_t& full, const sizes& s, pp::schedule_kind kind, int v, Make make)
        : mesh(pp::stage_mesh_of<stage_mesh_t>(full))
        , model(make(mesh))
        , batch(mesh, s)
        , pipe(full, "pp", mesh, model,
               {.micro_batches = 8, .scheduler = kind, .virtual_stages = v}) {}
    void step() {
        pipe.step(batch.x, batch.labels, loss);
        pipe.synchronize_gradients();
        optimizer.step(pipe.local_parameters());
        pipe.zero_grad();
    }
};

} // namespace

int main(int argc, char** argv) {
    xshard::environment env(argc, argv);
    const auto o = bench::options::parse(argc, argv);
    const auto world = xshard::communicator::world();
    if (world.size() % 2 != 0) {
        if (world.rank() == 0)
            std::fprintf(stderr, "bench_pipeline: run on an even number of ranks (pp = 2)\n");
        return 2;
    }
    const full_mesh_t full({2, xshard::auto_size, 1});
    const auto& c = full.comm();
    const sizes s = o.quick ? sizes{32, 64, 64} : sizes{1024, 4096, 1024};
    std::optional<one_rank> baseline;
    if (c.rank() == 0)
        baseline.emplace(s);
    if (c.rank() == 0)
        std::fprintf(stderr, "bench_pipeline: %d ranks, batch %zu, features %zu, hidden %zu\n",
                     c.size(), s.batch, s.features, s.hidden);
    const struct {
        const char* name;
        pp::schedule_kind kind;
        int v;
    } cases[] = {{"mlp_pp2_m8_1f1b", pp::schedule_kind::one_f_one_b, 1},
                 {"mlp_pp2_m8_gpipe", pp::schedule_kind::gpipe, 1},
                 {"mlp_pp2_m8_interleaved", pp::schedule_kind::interleaved, 2},
                 {"mlp_pp2_m8_zero_bubble", pp::schedule_kind::zero_bubble, 1}};
    for (const auto& k : cases) {
        if (!o.wants(k.name))
            continue;
        pipelined<model_t> ours(full, s, k.kind, k.v,
                                [&](const stage_mesh_t& m) { return make_model(m, s); });
        const auto t = bench::compare(
            c, o, [&] { ours.step(); },
            [&] {
                if (baseline)
                    baseline->step();
            });
        // The idle share of the last step, mean over the pipeline's ranks.
        double measured = ours.pipe.last_step().bubble();
        xshard::mpi::allreduce(c, std::span(&measured, 1), xshard::reduction::sum);
        measured /= c.size();
        std::size_t bytes = 0;
        xshard::for_each_weight(
            ours.model, [&](const std::string&, auto& w) { bytes += w.value.size() * sizeof(T); });
        if (c.rank() == 0) {
            std::printf("{\"name\": \"%s\", \"ranks\": %d, \"bytes\": %zu, \"seconds\": %.6g, "
                        "\"baseline\": \"one_rank\", \"baseline_seconds\": %.6g, "
                        "\"ratio\": %.4f, \"bubble_measured\": %.4f, \"bubble_predicted\": %.4f}\n",
                        k.name, c.size(), bytes, t.seconds, t.baseline_seconds,
                        t.seconds / t.baseline_seconds, measured, ours.pipe.predicted().bubble());
            std::fflush(stdout);
        }
    }
    if (o.wants("program_chain_pp2_m8_1f1b")) {
        const auto kind = pp::schedule_kind::one_f_one_b;
        pipelined<model_t> layers(full, s, kind, 1,
                                  [&](const stage_mesh_t& m) { return make_model(m, s); });
        pipelined<chain_t> chain(full, s, kind, 1, [&](const stage_mesh_t& m) {
            return chain_t(traced_mlp(s), m, {.seed = 1},
                           xshard::input<T>("x", {s.batch / 8, s.features}));
        });
        const auto t = bench::compare(c, o, [&] { chain.step(); }, [&] { layers.step(); });
        if (c.rank() == 0) {
            std::printf("{\"name\": \"program_chain_pp2_m8_1f1b\", \"ranks\": %d, \"seconds\": "
                        "%.6g, \"baseline\": \"layers_pp2_m8_1f1b\", \"baseline_seconds\": %.6g, "
                        "\"ratio\": %.4f}\n",
                        c.size(), t.seconds, t.baseline_seconds, t.seconds / t.baseline_seconds);
            std::fflush(stdout);
        }
    }
    return 0;
}
